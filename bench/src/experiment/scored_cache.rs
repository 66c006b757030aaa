//! Resuming the perplexity experiment: each scored part (a seed row's
//! mechanisms with its study rows, the long deployment, the canary audit) is
//! written to the results cache (`--results-cache`, committed) when it is
//! done, with the seconds it took, and read back by a later run of the same
//! configuration, on this machine or a fresh one. A run stopped part-way (the default
//! report takes longer than any session) resumes at the first part not done,
//! and its Run section says which parts it read and what they cost when made.
//!
//! The key ([`crate::cache_key`]) is the declared results version and
//! [`SCORED_VERSION`]; the
//! configuration as canonical JSON with what does not decide a part left out
//! (the files' paths, which enter by their contents; the number of seeds and
//! the long deployment's queries, which its blocks and its part say; the
//! canary audit's plan, which only its own part's key holds; the ensemble sizes of the ablation's other runs, which are
//! runs of their own); the part's name and seed; the queries the studies are
//! sized to; the cache keys of the adapters it reads; the SHA-256 of the base
//! model and of the blocks it scores. Scoring is deterministic given these
//! (seeded randomness, the same forwards), so an entry equals recomputing its
//! part — `privacy-utility --verify-cache` recomputes one and compares, bit
//! for bit.
//!
//! Entries are CBOR, which keeps every `f64` exactly (an infinite perplexity
//! included), written whole under another name and then renamed into place:
//! a stopped run leaves no entry a later run would trust.

use std::io::BufReader;
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::config::ExperimentConfig;
use crate::cache_key::{CacheKey, data_sha256, path_sha256, write_entry};
use crate::error::BenchError;

/// The version of the scoring the cached parts hold. Bump it in a commit that
/// changes what a scored part would be if recomputed while the trained parts
/// stay as they are (a mechanism's arithmetic, its accounting or calibration,
/// a contender, a study, how perplexity is read): only the scored parts are
/// then recomputed. A change to what training makes bumps
/// [`crate::cache_key::RESULTS_VERSION`] instead, which every key holds.
///
/// - 1: the first scored parts.
/// - 2: a seed row's queries curve also reads the DP-SGD models on the same
///   first queries.
/// - 3: the mechanisms exponentiate log-probability rows by their own
///   vectorised `exp` (within 2 ulp of libm's), which can move a seeded draw
///   and changes the perplexities' last bits.
/// - 4: the symmetric mixture divergence answers λ = 1 from its ratio pass
///   whatever the ratios' range (scaled sums), where a second pass answered
///   it before: equal to ~1e-14 relative, but a λ search that goes on past
///   λ = 1 may end on a λ whose last bits differ, and so a seeded draw.
pub const SCORED_VERSION: u32 = 4;

/// One part's result, the seconds it took when it was computed, and (as
/// provenance, outside the key) the commit that computed it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry<T> {
    seconds: f64,
    commit: Option<String>,
    /// The kind of machine that computed it ([`crate::run_info::machine`]).
    #[serde(default)]
    machine: Option<String>,
    value: T,
}

/// A part found in the cache: its value, the seconds it took when computed
/// and the commit that computed it.
pub(crate) struct Cached<T> {
    pub value: T,
    pub seconds: f64,
    pub commit: Option<String>,
    /// The kind of machine that computed it, where recorded.
    pub machine: Option<String>,
}

/// The scored parts of one run of the experiment (one configuration).
pub(crate) struct ScoredCache {
    dir: PathBuf,
    config: serde_json::Value,
    model_sha256: Vec<String>,
}

impl ScoredCache {
    /// The cache of `config`'s run, in its results cache folder.
    ///
    /// Errors: the base model cannot be read.
    pub fn new(config: &ExperimentConfig) -> Result<Self, BenchError> {
        Ok(Self {
            dir: config.results_dir.clone(),
            config: keyed_config(config)?,
            model_sha256: vec![path_sha256(&config.model)?],
        })
    }

    /// The key of `part` scored on `blocks` with randomness from `seed`,
    /// reading the adapters whose keys are `adapters`; `extra` holds what else
    /// decides it (the queries its studies are sized to).
    pub fn key(
        &self,
        part: &str,
        seed: u64,
        adapters: &[String],
        extra: serde_json::Value,
        blocks: &[Vec<u32>],
    ) -> Result<CacheKey, BenchError> {
        CacheKey::new(
            "scored",
            &json!({
                "scored_version": SCORED_VERSION,
                "config": self.config,
                "part": part,
                "seed": seed,
                "adapters": adapters,
                "extra": extra,
            }),
            self.model_sha256.clone(),
            data_sha256(&blocks)?,
        )
    }

    fn path(&self, part: &str, key: &CacheKey) -> PathBuf {
        self.dir
            .join(format!("scored-{part}-{}.cbor", key.digest()))
    }

    /// The cached value of `part` under `key`, if a run computed it.
    ///
    /// Errors: an entry that cannot be read or decoded (never a silent miss).
    pub fn get<T: DeserializeOwned>(
        &self,
        part: &str,
        key: &CacheKey,
    ) -> Result<Option<Cached<T>>, BenchError> {
        let path = self.path(part, key);
        if !path.is_file() {
            return Ok(None);
        }
        let file = std::fs::File::open(&path).map_err(|e| BenchError::io(&path, e))?;
        let entry: Entry<T> = ciborium::from_reader(BufReader::new(file))
            .map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))?;
        Ok(Some(Cached {
            value: entry.value,
            seconds: entry.seconds,
            commit: entry.commit,
            machine: entry.machine,
        }))
    }

    /// Keeps `value` of `part` under `key`, computed in `seconds`.
    pub fn put<T: Serialize>(
        &self,
        part: &str,
        key: &CacheKey,
        value: &T,
        seconds: f64,
    ) -> Result<(), BenchError> {
        let entry = Entry {
            seconds,
            commit: Some(crate::run_info::commit()),
            machine: Some(crate::run_info::machine()),
            value,
        };
        write_entry(&self.path(part, key), &encode(&entry)?)
    }
}

/// The CBOR bytes of `value`: equal bytes are equal values, bit for bit.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, BenchError> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes)
        .map_err(|e| BenchError::Config(format!("cannot encode a scored part: {e}")))?;
    Ok(bytes)
}

/// The configuration as a scored part's key holds it: the files' paths blanked
/// (they enter by their contents), an optional one keeping only whether it was
/// given, and what decides no part left out (see the module's documentation).
fn keyed_config(config: &ExperimentConfig) -> Result<serde_json::Value, BenchError> {
    let keyed = ExperimentConfig {
        model: PathBuf::new(),
        tokenizer: config.tokenizer.as_ref().map(|_| PathBuf::new()),
        corpus_dir: PathBuf::new(),
        cache_dir: PathBuf::new(),
        results_dir: PathBuf::new(),
        seeds: 0,
        long_queries: 0,
        canary: None,
        studies: config.studies.clone().map(|plan| super::config::StudyPlan {
            members: Vec::new(),
            members_seeds: 0,
            ..plan
        }),
        ..config.clone()
    };
    serde_json::to_value(&keyed)
        .map_err(|e| BenchError::Config(format!("cannot serialise a cache key: {e}")))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn cache(dir: &Path, config: serde_json::Value) -> ScoredCache {
        ScoredCache {
            dir: dir.to_path_buf(),
            config,
            model_sha256: vec!["aa".into()],
        }
    }

    /// An entry comes back bit for bit (∞, NaN and the last bits of a float
    /// included) under its own key only; a corrupt entry is an error; a write
    /// stopped before its rename leaves nothing a run would read.
    #[test]
    fn entries_come_back_bit_for_bit_under_their_own_key_only() {
        let dir = std::env::temp_dir().join(format!("privmix-scored-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let blocks = vec![vec![1u32, 2, 3], vec![4, 5]];
        let c = cache(&dir, json!({ "epsilons": [1.0, 8.0] }));
        let adapters = vec!["k0".to_string(), "k1".to_string()];
        let key = c
            .key(
                "seed-0",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            )
            .unwrap();
        assert!(c.get::<Vec<f64>>("seed-0", &key).unwrap().is_none());
        let value = vec![
            0.1 + 0.2,
            f64::INFINITY,
            1e-300,
            f64::from_bits(0x3ff0_0000_0000_0001),
        ];
        c.put("seed-0", &key, &value, 42.5).unwrap();
        let hit = c.get::<Vec<f64>>("seed-0", &key).unwrap().unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&hit.value), bits(&value));
        assert_eq!(hit.seconds, 42.5);
        assert!(hit.commit.is_some(), "the commit is kept as provenance");
        let nan = vec![f64::NAN];
        c.put("seed-0", &key, &nan, 1.0).unwrap();
        assert!(c.get::<Vec<f64>>("seed-0", &key).unwrap().unwrap().value[0].is_nan());
        c.put("seed-0", &key, &value, 42.5).unwrap();
        // Each input of the key counts.
        let others = [
            c.key(
                "seed-1",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            ),
            c.key(
                "seed-0",
                8,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            ),
            c.key(
                "seed-0",
                7,
                &adapters[..1],
                json!({ "seed_queries": 3 }),
                &blocks,
            ),
            c.key(
                "seed-0",
                7,
                &adapters,
                json!({ "seed_queries": 2 }),
                &blocks,
            ),
            c.key(
                "seed-0",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks[..1],
            ),
            cache(&dir, json!({ "epsilons": [1.0, 4.0] })).key(
                "seed-0",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            ),
        ];
        for other in others {
            let other = other.unwrap();
            assert_ne!(other.digest(), key.digest());
            assert!(c.get::<Vec<f64>>("seed-0", &other).unwrap().is_none());
        }
        // The same inputs in a later process: the same entry.
        let again = cache(&dir, json!({ "epsilons": [1.0, 8.0] }))
            .key(
                "seed-0",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            )
            .unwrap();
        assert!(c.get::<Vec<f64>>("seed-0", &again).unwrap().is_some());
        // A stopped write: only the partial file, never read.
        let stopped = c
            .key(
                "seed-1",
                7,
                &adapters,
                json!({ "seed_queries": 3 }),
                &blocks,
            )
            .unwrap();
        std::fs::write(
            c.path("seed-1", &stopped).with_extension("partial"),
            b"\xa3",
        )
        .unwrap();
        assert!(c.get::<Vec<f64>>("seed-1", &stopped).unwrap().is_none());
        // A corrupt entry is an error naming it, not a silent miss.
        let path = c.path("seed-0", &key);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let err = c.get::<Vec<f64>>("seed-0", &key).err().unwrap();
        assert!(err.to_string().contains("scored-seed-0-"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
