//! The keys of the experiments' caches (fine-tuned adapters, ICL parts).
//!
//! A cached result is reused only under the key of what decides it:
//! - [`RESULTS_VERSION`], a number declared here and bumped by the commit that
//!   changes what any cached part would hold (a new sampler, a fixed bug in a
//!   mechanism, another training schedule);
//! - the part's configuration, as serde serialises it (canonical JSON: object
//!   keys sorted, `serde_json` without `preserve_order`), never `Debug` text;
//! - the SHA-256 of the model files and of the data it reads.
//!
//! No source hash and no commit enters the key, so a refactoring or a comment
//! in any crate keeps every cache; the commit that made an entry is kept inside
//! it as provenance only, and `privacy-utility --verify-cache` recomputes one
//! seeded part and compares it with its entry.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::BenchError;

/// The version of the results the cached parts hold. Bump it in a commit that
/// changes what a cached adapter or ICL part would be if recomputed. (A change
/// to the perplexity experiment's scoring alone bumps `SCORED_VERSION` in
/// `bench/src/experiment/scored_cache.rs`, which keeps the trained adapters.)
///
/// - 1: the keys of before (source hashes, `Debug` text, file sizes).
/// - 2: keys of version, canonical configuration and content hashes; the ICL
///   parts hold the sharpened zero-shot control; whole-sentence canaries.
/// - 3: adapters trained by the chunked host step (row chunks, logits a slice
///   at a time, members together), whose sums can differ from the unchunked
///   step's in the last bits; the sharpened control normalised by DPS-MOZO's
///   own product step.
pub const RESULTS_VERSION: u32 = 3;

/// The key of one cached part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheKey {
    /// [`RESULTS_VERSION`] when the key was made.
    pub results_version: u32,
    /// What kind of part (`member`, `dp-sgd`, `icl`, …).
    pub kind: String,
    /// The part's canonical configuration.
    pub config: serde_json::Value,
    /// SHA-256 of each model file the part reads, in order.
    pub model_sha256: Vec<String>,
    /// SHA-256 of the data the part reads.
    pub data_sha256: String,
}

impl CacheKey {
    /// The key of a part of `kind` with `config`, reading the models whose
    /// hashes are `model_sha256` and the data whose hash is `data_sha256`, at
    /// this build's [`RESULTS_VERSION`] (and backend, when not the CPU's: CUDA
    /// runs other arithmetic).
    pub fn new(
        kind: &str,
        config: &impl Serialize,
        model_sha256: Vec<String>,
        data_sha256: String,
    ) -> Result<Self, BenchError> {
        let mut config = serde_json::to_value(config)
            .map_err(|e| BenchError::Config(format!("cannot serialise a cache key: {e}")))?;
        if cfg!(feature = "cuda") {
            config = json!({ "backend": crate::BACKEND_NAME, "config": config });
        }
        Ok(Self {
            results_version: RESULTS_VERSION,
            kind: kind.into(),
            config,
            model_sha256,
            data_sha256,
        })
    }

    /// The key with `part` added to its configuration (one entry of a run).
    pub fn with_part(&self, part: &str) -> Self {
        let mut key = self.clone();
        key.config = json!({ "part": part, "of": key.config });
        key
    }

    /// A short hex name for the key: the first 16 bytes of the SHA-256 of its
    /// canonical JSON.
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        hex(&Sha256::digest(text.as_bytes())[..16])
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of serialisable `data` (its canonical JSON).
pub fn data_sha256(data: &impl Serialize) -> Result<String, BenchError> {
    let text = serde_json::to_string(data)
        .map_err(|e| BenchError::Config(format!("cannot serialise data to hash: {e}")))?;
    Ok(hex(&Sha256::digest(text.as_bytes())))
}

/// A file as the hash memo knows it: path, size and modification time.
type FileIdentity = (PathBuf, u64, Option<std::time::SystemTime>);

/// SHA-256 of the file at `path`; for a folder (an HF model), of the list of
/// its files' names with each file's SHA-256. Hashes are remembered per path,
/// size and modification time for the process, so a run hashes a model once.
pub fn path_sha256(path: &Path) -> Result<String, BenchError> {
    let meta = std::fs::metadata(path).map_err(|e| BenchError::io(path, e))?;
    if meta.is_dir() {
        let mut entries: Vec<(String, String)> = Vec::new();
        let read = std::fs::read_dir(path).map_err(|e| BenchError::io(path, e))?;
        for entry in read {
            let entry = entry.map_err(|e| BenchError::io(path, e))?;
            let p = entry.path();
            if p.is_file() {
                entries.push((
                    entry.file_name().to_string_lossy().into_owned(),
                    path_sha256(&p)?,
                ));
            }
        }
        entries.sort();
        return data_sha256(&entries);
    }
    static SEEN: OnceLock<Mutex<HashMap<FileIdentity, String>>> = OnceLock::new();
    let id = (path.to_path_buf(), meta.len(), meta.modified().ok());
    let seen = SEEN.get_or_init(Default::default);
    if let Some(h) = seen.lock().ok().and_then(|m| m.get(&id).cloned()) {
        return Ok(h);
    }
    let mut file = std::fs::File::open(path).map_err(|e| BenchError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| BenchError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let h = hex(&hasher.finalize());
    if let Ok(mut m) = seen.lock() {
        m.insert(id, h.clone());
    }
    Ok(h)
}

/// Writes a cache entry's `bytes` at `path` so that a run stopped at any
/// point leaves either no entry or a whole one: its folder made, the bytes
/// written whole under the same name with the extension `partial` (which no
/// cache reads), then renamed into place. Every cache of the experiments
/// writes its entries through it (the scored parts, the ICL parts, the
/// adapters' metadata that marks a complete adapter).
pub(crate) fn write_entry(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).map_err(|e| BenchError::io(&partial, e))?;
    std::fs::rename(&partial, path).map_err(|e| BenchError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key holds the results version, the configuration and the content
    /// hashes, and nothing else: no source hash, no commit, no path. So an edit
    /// to a comment in `models` (or any crate), which changes none of them,
    /// keeps every cached part; a bumped version or another configuration,
    /// model or data does not.
    #[test]
    fn the_key_is_a_pure_function_of_version_configuration_and_hashes() {
        let config = json!({ "lr": 0.001, "rank": 8, "targets": ["q_proj", "v_proj"] });
        let key = CacheKey::new("member", &config, vec!["aa".into()], "bb".into()).unwrap();
        let value = serde_json::to_value(&key).unwrap();
        let mut fields: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "config",
                "data_sha256",
                "kind",
                "model_sha256",
                "results_version"
            ]
        );
        // The same inputs, made again (a later build, a later commit): the same key.
        let again = CacheKey::new("member", &config, vec!["aa".into()], "bb".into()).unwrap();
        assert_eq!(key.digest(), again.digest());
        // Key order in the configuration does not matter (canonical JSON).
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"targets":["q_proj","v_proj"],"rank":8,"lr":0.001}"#).unwrap();
        let same = CacheKey::new("member", &reordered, vec!["aa".into()], "bb".into()).unwrap();
        assert_eq!(key.digest(), same.digest());
        // Each input counts.
        let mut bumped = key.clone();
        bumped.results_version += 1;
        for other in [
            bumped,
            CacheKey::new("dp-sgd", &config, vec!["aa".into()], "bb".into()).unwrap(),
            CacheKey::new(
                "member",
                &json!({ "lr": 0.002 }),
                vec!["aa".into()],
                "bb".into(),
            )
            .unwrap(),
            CacheKey::new("member", &config, vec!["ab".into()], "bb".into()).unwrap(),
            CacheKey::new("member", &config, vec!["aa".into()], "bc".into()).unwrap(),
            key.with_part("seed-0"),
        ] {
            assert_ne!(key.digest(), other.digest(), "{other:?}");
        }
        assert_eq!(key.digest().len(), 32);
    }

    /// Golden values from `sha256sum` (coreutils) of the same bytes.
    #[test]
    fn file_hashes_are_sha256_of_the_contents() {
        let dir = std::env::temp_dir().join(format!("privmix-cache-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a");
        std::fs::write(&file, "abc").unwrap();
        // printf abc | sha256sum
        assert_eq!(
            path_sha256(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // A folder: its files' names and hashes.
        let folder = path_sha256(&dir).unwrap();
        std::fs::write(dir.join("b"), "").unwrap();
        assert_ne!(path_sha256(&dir).unwrap(), folder);
        assert!(path_sha256(&dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
