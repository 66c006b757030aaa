//! Resuming the ICL experiment: each seed's results and the membership-inference
//! attack's are written to the cache folder when they are done, with the seconds
//! they took, and read back by a later run of the same configuration — so that a
//! run stopped part-way (the default run takes hours) resumes at the first seed
//! not done, and reports the compute it reused.
//!
//! The key ([`crate::cache_key`]) is the declared results version and the ICL
//! parts' own [`ICL_VERSION`], the whole
//! configuration as canonical JSON (the cache folder and the files' paths aside),
//! the part's name, and the SHA-256 of the model files (the language model, its
//! tokenizer and the sentence encoder when given) and of WordNet's file. No source
//! hash, commit or path enters it, so editing a comment, refactoring or moving the
//! models and data keeps the cache; the commit that made each entry is kept inside
//! it as provenance.

use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::common::IclConfig;
use crate::cache_key::{CacheKey, path_sha256};
use crate::error::BenchError;

/// The version of the results the ICL parts hold, beside
/// [`crate::cache_key::RESULTS_VERSION`] (which every cache's key holds): bump it
/// in a commit that changes what an ICL part would be if recomputed while the
/// perplexity experiment's parts stay as they are.
///
/// - 1: the parts before this version existed.
/// - 2: every part recomputed, each entry naming the commit its binary was
///   built from (`bench/build.rs`) and its machine. The version-1 entries named
///   the tree's commit when written (seed 0's `6bb9980…-dirty`), and another
///   kind of CPU recomputed their embedding baseline differently (every private
///   and zero-shot answer the same).
pub const ICL_VERSION: u32 = 2;

/// One part's cached result, the seconds it took when it was made, and (as
/// provenance, outside the key) the commit that made it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry<T> {
    seconds: f64,
    #[serde(default)]
    commit: Option<String>,
    /// The kind of machine that computed it ([`crate::run_info::machine`]).
    #[serde(default)]
    machine: Option<String>,
    value: T,
}

/// The cache of one run's parts (inactive without a folder).
pub(crate) struct PartCache {
    dir: Option<PathBuf>,
    key: CacheKey,
}

impl PartCache {
    /// The cache for `config`: its key hashes the model files and WordNet's file.
    ///
    /// Errors: a model or data file that cannot be read.
    pub fn new(config: &IclConfig) -> Result<Self, BenchError> {
        let mut models = vec![path_sha256(&config.model)?];
        if let Some(t) = &config.tokenizer {
            models.push(path_sha256(t)?);
        }
        if let Some(e) = config.embedding_model.as_ref().filter(|e| e.exists()) {
            models.push(path_sha256(e)?);
        }
        // The files enter the key by their contents (hashed above), never by where
        // they lie: the configuration's paths are blanked, an optional one keeping only
        // whether it was given.
        let keyed = IclConfig {
            model: PathBuf::new(),
            tokenizer: config.tokenizer.as_ref().map(|_| PathBuf::new()),
            wordnet: PathBuf::new(),
            embedding_model: config.embedding_model.as_ref().map(|_| PathBuf::new()),
            cache_dir: None,
            ..config.clone()
        };
        let versioned = serde_json::json!({ "icl_version": ICL_VERSION, "config": keyed });
        let key = CacheKey::new("icl", &versioned, models, path_sha256(&config.wordnet)?)?;
        Ok(Self {
            dir: config.cache_dir.clone(),
            key,
        })
    }

    fn path(&self, part: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| {
            d.join(format!(
                "icl-{part}-{}.json",
                self.key.with_part(part).digest()
            ))
        })
    }

    /// The cached value of `part` with its seconds, if a run made it.
    pub fn get<T: DeserializeOwned>(&self, part: &str) -> Result<Option<(T, f64)>, BenchError> {
        Ok(self.get_with_machine(part)?.map(|(v, s, _)| (v, s)))
    }

    /// [`PartCache::get`] with the kind of machine that made the entry, where
    /// it was recorded.
    pub fn get_with_machine<T: DeserializeOwned>(
        &self,
        part: &str,
    ) -> Result<Option<(T, f64, Option<String>)>, BenchError> {
        let Some(path) = self.path(part) else {
            return Ok(None);
        };
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::io(&path, e))?;
        let entry: Entry<T> = serde_json::from_str(&text)
            .map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))?;
        Ok(Some((entry.value, entry.seconds, entry.machine)))
    }

    /// Keeps `value` of `part`, made in `seconds` (written whole, then renamed
    /// into place, so a stopped write leaves no entry).
    pub fn put<T: Serialize>(&self, part: &str, value: &T, seconds: f64) -> Result<(), BenchError> {
        let Some(path) = self.path(part) else {
            return Ok(());
        };
        let entry = Entry {
            seconds,
            commit: Some(crate::run_info::commit()),
            machine: Some(crate::run_info::machine()),
            value,
        };
        let text = serde_json::to_string(&entry)
            .map_err(|e| BenchError::Config(format!("cannot serialise an ICL result: {e}")))?;
        crate::cache_key::write_entry(&path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(dir: &Path, model: &Path, wordnet: &Path) -> IclConfig {
        serde_json::from_value(serde_json::json!({
            "model": model, "tokenizer": null, "wordnet": wordnet, "private_demos": 8,
            "test_queries": 1, "public_inputs": 0, "n_shots": 2, "top_k": 5,
            "max_tokens": 3, "epsilons": [1.0], "delta": 1e-5, "seed": 0,
            "mia_examples": 3, "cache_dir": dir,
        }))
        .unwrap()
    }

    /// A fresh folder `name-<pid>` under the temporary directory with a model
    /// file and a WordNet file: (the folder, its cache folder, the model, WordNet).
    fn files(name: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
        let root = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let (dir, model, wordnet) = (root.join("cache"), root.join("m.gguf"), root.join("noun"));
        std::fs::write(&model, "weights").unwrap();
        std::fs::write(&wordnet, "nouns").unwrap();
        (root, dir, model, wordnet)
    }

    /// The key holds the ICL parts' own version beside the shared one, and the
    /// entry names the commit the binary was built from.
    #[test]
    fn the_key_holds_the_icl_version_and_the_entry_its_build() {
        let (root, dir, model, wordnet) = files("privmix-icl-version");
        let cache = PartCache::new(&config(&dir, &model, &wordnet)).unwrap();
        // (A CUDA build wraps the configuration with its backend.)
        let config = cache.key.config.to_string();
        assert!(
            config.contains(&format!("\"icl_version\":{ICL_VERSION}")),
            "{config}"
        );
        assert_eq!(cache.key.results_version, crate::cache_key::RESULTS_VERSION);
        cache.put("seed-0", &1u32, 1.0).unwrap();
        let path = cache.path("seed-0").unwrap();
        let entry: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(entry["commit"], env!("PRIVMIX_BENCH_COMMIT"));
        assert_eq!(entry["machine"], crate::run_info::machine());
        assert_eq!(
            cache.get_with_machine::<u32>("seed-0").unwrap(),
            Some((1, 1.0, Some(crate::run_info::machine())))
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn parts_come_back_for_the_same_configuration_model_and_data_only() {
        let (root, dir, model, wordnet) = files("privmix-icl-cache");
        let cache = PartCache::new(&config(&dir, &model, &wordnet)).unwrap();
        assert!(cache.get::<Vec<u32>>("seed-0").unwrap().is_none());
        cache.put("seed-0", &vec![1u32, 2], 12.5).unwrap();
        assert_eq!(
            cache.get::<Vec<u32>>("seed-0").unwrap(),
            Some((vec![1, 2], 12.5))
        );
        // The same inputs in a later process (any commit, any source edit): found.
        assert_eq!(
            PartCache::new(&config(&dir, &model, &wordnet))
                .unwrap()
                .get::<Vec<u32>>("seed-0")
                .unwrap(),
            Some((vec![1, 2], 12.5))
        );
        // Another part, another configuration: nothing.
        assert!(cache.get::<Vec<u32>>("seed-1").unwrap().is_none());
        let mut other = config(&dir, &model, &wordnet);
        other.top_k = 6;
        assert!(
            PartCache::new(&other)
                .unwrap()
                .get::<Vec<u32>>("seed-0")
                .unwrap()
                .is_none()
        );
        // Other model weights or other data under the same names: nothing.
        std::fs::write(&model, "weights, retrained").unwrap();
        assert!(
            PartCache::new(&config(&dir, &model, &wordnet))
                .unwrap()
                .get::<Vec<u32>>("seed-0")
                .unwrap()
                .is_none()
        );
        std::fs::write(&model, "weights").unwrap();
        std::fs::write(&wordnet, "other nouns").unwrap();
        assert!(
            PartCache::new(&config(&dir, &model, &wordnet))
                .unwrap()
                .get::<Vec<u32>>("seed-0")
                .unwrap()
                .is_none()
        );
        std::fs::write(&wordnet, "nouns").unwrap();
        // The same files moved to another folder (and the cache with them): found.
        let moved = root.join("moved");
        std::fs::create_dir_all(&moved).unwrap();
        let (moved_model, moved_wordnet) = (moved.join("model.gguf"), moved.join("data.noun"));
        std::fs::rename(&model, &moved_model).unwrap();
        std::fs::rename(&wordnet, &moved_wordnet).unwrap();
        let moved_dir = moved.join("cache");
        std::fs::rename(&dir, &moved_dir).unwrap();
        assert_eq!(
            PartCache::new(&config(&moved_dir, &moved_model, &moved_wordnet))
                .unwrap()
                .get::<Vec<u32>>("seed-0")
                .unwrap(),
            Some((vec![1, 2], 12.5))
        );
        std::fs::rename(&moved_model, &model).unwrap();
        std::fs::rename(&moved_wordnet, &wordnet).unwrap();
        std::fs::rename(&moved_dir, &dir).unwrap();
        // The entry records its commit, as provenance.
        let path = cache.path("seed-0").unwrap();
        let entry: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(entry["commit"].is_string());
        // A missing model is an error naming it, not a silent miss.
        assert!(PartCache::new(&config(&dir, &root.join("none"), &wordnet)).is_err());
        // A corrupt entry is an error, not a silent miss.
        std::fs::write(&path, "{").unwrap();
        assert!(cache.get::<Vec<u32>>("seed-0").is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
