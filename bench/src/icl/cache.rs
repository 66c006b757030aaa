//! Resuming the ICL experiment: each seed's results and the membership-inference
//! attack's are written to the cache folder when they are done, with the seconds
//! they took, and read back by a later run of the same configuration on the same
//! commit — so that a run stopped part-way (the default run takes hours) resumes at
//! the first seed not done, and reports the compute it reused.
//!
//! The key is a hash of the whole configuration (the cache folder aside), the
//! part's name, the model file's identity, the compiler, and the committed
//! version of the code that decides the results ([`ICL_SOURCES`]: the crates the
//! experiment runs through, the bench modules it uses, the manifests and the
//! lockfile) — so a commit that touches only the report, the docs or other tools
//! keeps the cache. Results made while any of those sources has uncommitted
//! changes, or outside a git checkout, are neither written nor read: nothing
//! vouches for the code that made them.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::common::IclConfig;
use crate::error::BenchError;
use crate::experiment::members::{backend_key, digest, model_identity};

/// One part's cached result and the seconds it took when it was made.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry<T> {
    seconds: f64,
    value: T,
}

/// The sources, relative to the repository's root, whose committed version keys
/// the cache: everything the ICL experiment's results are computed by.
pub const ICL_SOURCES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    ".cargo",
    "renyi",
    "accountant",
    "mixing",
    "mechanisms",
    "models",
    "ensemble",
    "bench/Cargo.toml",
    "bench/build.rs",
    "bench/src/lib.rs",
    "bench/src/error.rs",
    "bench/src/rouge.rs",
    "bench/src/stats.rs",
    "bench/src/experiment",
    "bench/src/icl",
];

/// The cache of one run's parts (inactive without a folder or a clean commit).
pub(crate) struct PartCache {
    dir: Option<PathBuf>,
    key: serde_json::Value,
}

impl PartCache {
    /// The cache for `config` made by the code at `version`
    /// ([`crate::run_info::source_version`] of [`ICL_SOURCES`]; None: inactive).
    pub fn new(config: &IclConfig, version: Option<&str>) -> Self {
        let key = backend_key(serde_json::json!({
            "config": IclConfig { cache_dir: None, ..config.clone() },
            "model": model_identity(&config.model),
            "code": version,
        }));
        Self {
            dir: config.cache_dir.clone().filter(|_| version.is_some()),
            key,
        }
    }

    fn path(&self, part: &str) -> Option<PathBuf> {
        let mut key = self.key.clone();
        key["part"] = serde_json::Value::from(part);
        self.dir
            .as_ref()
            .map(|d| d.join(format!("icl-{part}-{}.json", digest(&key))))
    }

    /// The cached value of `part` with its seconds, if a run made it.
    pub fn get<T: DeserializeOwned>(&self, part: &str) -> Result<Option<(T, f64)>, BenchError> {
        let Some(path) = self.path(part) else {
            return Ok(None);
        };
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::io(&path, e))?;
        let entry: Entry<T> = serde_json::from_str(&text)
            .map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))?;
        Ok(Some((entry.value, entry.seconds)))
    }

    /// Keeps `value` of `part`, made in `seconds` (written whole, then renamed
    /// into place, so a stopped write leaves no entry).
    pub fn put<T: Serialize>(&self, part: &str, value: &T, seconds: f64) -> Result<(), BenchError> {
        let Some(path) = self.path(part) else {
            return Ok(());
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        let text = serde_json::to_string(&Entry { seconds, value })
            .map_err(|e| BenchError::Config(format!("cannot serialise an ICL result: {e}")))?;
        let partial = path.with_extension("partial");
        std::fs::write(&partial, text).map_err(|e| BenchError::io(&partial, e))?;
        std::fs::rename(&partial, &path).map_err(|e| BenchError::io(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> IclConfig {
        serde_json::from_value(serde_json::json!({
            "model": "no-such-model", "tokenizer": null, "wordnet": "w", "private_demos": 8,
            "test_queries": 1, "public_inputs": 0, "n_shots": 2, "top_k": 5,
            "max_tokens": 3, "epsilons": [1.0], "delta": 1e-5, "seed": 0,
            "mia_examples": 3, "cache_dir": dir,
        }))
        .unwrap()
    }

    #[test]
    fn parts_come_back_for_the_same_configuration_and_code_only() {
        let dir = std::env::temp_dir().join(format!("privmix-icl-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let code = Some("models=0123456789abcdef0123456789abcdef01234567");
        let cache = PartCache::new(&config(&dir), code);
        assert!(cache.get::<Vec<u32>>("seed-0").unwrap().is_none());
        cache.put("seed-0", &vec![1u32, 2], 12.5).unwrap();
        assert_eq!(
            cache.get::<Vec<u32>>("seed-0").unwrap(),
            Some((vec![1, 2], 12.5))
        );
        // Another part, another configuration, other code: nothing.
        assert!(cache.get::<Vec<u32>>("seed-1").unwrap().is_none());
        let mut other = config(&dir);
        other.top_k = 6;
        assert!(
            PartCache::new(&other, code)
                .get::<Vec<u32>>("seed-0")
                .unwrap()
                .is_none()
        );
        let later = Some("models=1123456789abcdef0123456789abcdef01234567");
        assert!(
            PartCache::new(&config(&dir), later)
                .get::<Vec<u32>>("seed-0")
                .unwrap()
                .is_none()
        );
        // Uncommitted sources neither read nor write.
        let dirty = PartCache::new(&config(&dir), None);
        assert!(dirty.get::<Vec<u32>>("seed-0").unwrap().is_none());
        dirty.put("seed-5", &vec![3u32], 1.0).unwrap();
        assert!(cache.get::<Vec<u32>>("seed-5").unwrap().is_none());
        // A corrupt entry is an error, not a silent miss.
        let path = cache.path("seed-0").unwrap();
        std::fs::write(&path, "{").unwrap();
        assert!(cache.get::<Vec<u32>>("seed-0").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
