//! `--out/manifest.json`: what `privmix train` made and from what. It is the
//! record `serve` and the ledger read to know the members: each member's
//! folder and weight identity (the `sha256:` the ledger's protected set holds),
//! the partition (user → member, with the seed and the hash rule that
//! reproduce it), every member's data hash, the base model's and tokenizer's
//! identity and the training configuration.
//!
//! The same identities make a run resumable safely: `checkpoints/run.json`
//! holds the [`fingerprint`] of the run in progress, and a rerun whose
//! fingerprint differs (other flags, data, base model or tokenizer) is refused
//! rather than mixing two runs in one set of members.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::error::TrainCmdError;
use crate::error::CliError;

/// File name of the manifest in `--out`.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Format tag of the manifest written here.
pub const MANIFEST_FORMAT: &str = "privmix-train/1";

/// The manifest of a finished `privmix train` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainManifest {
    /// [`MANIFEST_FORMAT`].
    pub format: String,
    /// The privmix version that trained the members.
    pub privmix_version: String,
    /// `members` (one LoRA per shard of users) or `dp_sgd` (one adapter on all the data).
    pub kind: RunKind,
    /// The base model the adapters are for.
    pub base_model: BaseModel,
    /// The tokenizer the data was cut into blocks with.
    pub tokenizer: Identity,
    /// The data as a whole.
    pub data: DataSummary,
    /// The user-level partition (`members` runs).
    pub partition: Option<PartitionRecord>,
    /// The training configuration (the flags, resolved).
    pub config: RunConfig,
    /// The members, in order (`members` runs; empty for `dp_sgd`).
    pub members: Vec<MemberRecord>,
    /// The DP-SGD adapter (`dp_sgd` runs).
    pub dp_sgd: Option<DpSgdRecord>,
}

/// What a run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// N members, one per shard of users, to be served through a private mechanism.
    Members,
    /// One DP-SGD adapter on all the data.
    DpSgd,
}

/// The base model: where it was, the name written into each adapter's
/// `base_model_name_or_path`, and its content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseModel {
    /// The `--model` path as given.
    pub path: String,
    /// `base_model_name_or_path` of the adapters.
    pub name: String,
    /// See [`model_identity`].
    pub sha256: String,
}

/// A file's path (when it has one of its own) and content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// The file, or `None` when it is part of the model (a GGUF's vocabulary).
    pub path: Option<String>,
    /// `sha256:<hex>`.
    pub sha256: String,
}

/// The data as a whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSummary {
    /// Number of users.
    pub users: usize,
    /// [`data_hash`] of all users.
    pub sha256: String,
}

/// The partition: every user's member and how to recompute it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// `--seed`.
    pub seed: u64,
    /// `--members`.
    pub members: usize,
    /// The rule (`privmix_ensemble::data::HASH_PARTITION_RULE`).
    pub hash: String,
    /// User id → member index.
    pub users: BTreeMap<String, usize>,
}

/// One trained member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Its index.
    pub index: usize,
    /// Its PEFT folder, relative to `--out`.
    pub path: String,
    /// `sha256:<hex>` of its `adapter_model.safetensors` (the ledger's identity of it).
    pub adapter_sha256: String,
    /// Users it saw.
    pub users: usize,
    /// Tokens of those users' text.
    pub tokens: u64,
    /// Blocks it trained on.
    pub train_blocks: usize,
    /// Blocks of its users held out for its held-out loss.
    pub held_out_blocks: usize,
    /// [`data_hash`] of its users.
    pub data_sha256: String,
    /// Its training seed (derived from `--seed`).
    pub train_seed: u64,
    /// Optimizer steps planned.
    pub total_steps: usize,
    /// Optimizer steps taken (fewer when early stopping ended the run).
    pub steps: usize,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
    /// The step whose adapter was written (the best held-out one after early
    /// stopping, else the last).
    pub adapter_step: usize,
    /// Mean training loss of the last step (nats per token).
    pub train_loss: Option<f64>,
    /// Held-out loss of the written adapter (nats per token).
    pub held_out_loss: Option<f64>,
}

/// The DP-SGD adapter and its guarantee.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DpSgdRecord {
    /// Its PEFT folder, relative to `--out`.
    pub path: String,
    /// `sha256:<hex>` of its weights.
    pub adapter_sha256: String,
    /// ε asked for (`--epsilon`).
    pub target_epsilon: f64,
    /// ε the accountant gives for the steps taken, at `delta` (≤ `target_epsilon`).
    pub epsilon: f64,
    /// δ.
    pub delta: f64,
    /// What ε protects.
    pub unit: String,
    /// Noise multiplier σ (noise std σ·C on the clipped sum).
    pub noise_multiplier: f64,
    /// Poisson sampling rate q.
    pub sampling_rate: f64,
    /// Per-example clip norm C.
    pub clip_norm: f64,
    /// Steps taken.
    pub steps: usize,
    /// Tokens of all users' text.
    pub tokens: u64,
    /// Blocks it trained on.
    pub train_blocks: usize,
    /// Blocks held out (never trained on).
    pub held_out_blocks: usize,
    /// Held-out loss of the adapter (not covered by ε: for the provider only).
    pub held_out_loss: Option<f64>,
}

/// The training configuration: every flag that decides the adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Members (1 for DP-SGD).
    pub members: usize,
    /// `--seed`: the partition, held-out split, initialisation and batches.
    pub seed: u64,
    /// Fraction of each member's blocks held out.
    pub holdout: f64,
    /// Tokens per block.
    pub block_size: usize,
    /// The id every block starts with (the tokenizer's BOS, when it adds one).
    pub bos: Option<u32>,
    /// LoRA rank.
    pub rank: usize,
    /// LoRA alpha.
    pub alpha: f64,
    /// LoRA dropout.
    pub dropout: f64,
    /// Adapted projections.
    pub target_modules: Vec<String>,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Steps per member (`None`: from `epochs`).
    pub steps: Option<usize>,
    /// Passes over each member's training blocks (when `steps` is `None`).
    pub epochs: f64,
    /// Blocks per micro-batch (DP-SGD: the expected Poisson batch).
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Held-out evaluation every this many steps (`None`: a tenth of the run).
    pub eval_every: Option<usize>,
    /// At most this many held-out blocks per evaluation.
    pub eval_blocks: usize,
    /// Early stopping after this many evaluations without a better held-out loss.
    pub patience: Option<usize>,
    /// DP-SGD's parameters (`None` for members).
    pub dp_sgd: Option<DpSgdParams>,
}

/// DP-SGD's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DpSgdParams {
    /// Target ε.
    pub epsilon: f64,
    /// δ.
    pub delta: f64,
    /// Per-example clip norm.
    pub clip_norm: f64,
}

/// The identity of a run: what must be equal for a rerun to continue it.
/// The paths are left out (the same model elsewhere is the same model).
pub fn fingerprint(
    model_sha256: &str,
    tokenizer_sha256: &str,
    data_sha256: &str,
    base_model_name: &str,
    config: &RunConfig,
) -> Value {
    json!({
        "base_model": { "sha256": model_sha256, "name": base_model_name },
        "tokenizer": { "sha256": tokenizer_sha256 },
        "data": { "sha256": data_sha256 },
        "config": config,
    })
}

impl TrainManifest {
    /// This manifest's [`fingerprint`].
    pub fn fingerprint(&self) -> Value {
        fingerprint(
            &self.base_model.sha256,
            &self.tokenizer.sha256,
            &self.data.sha256,
            &self.base_model.name,
            &self.config,
        )
    }
}

/// Reads `--out/manifest.json` of a finished run (for `serve` and checks).
pub fn read_manifest(out: &Path) -> Result<TrainManifest, TrainCmdError> {
    let path = out.join(MANIFEST_FILE);
    let manifest: TrainManifest = read_json(&path)?;
    if manifest.format != MANIFEST_FORMAT {
        return Err(TrainCmdError::State {
            path,
            reason: format!(
                "format {:?}, this privmix reads {MANIFEST_FORMAT:?}",
                manifest.format
            ),
        });
    }
    Ok(manifest)
}

/// Reads JSON of type `T` from `path`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainCmdError> {
    let bad = |reason: String| TrainCmdError::State {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not the expected JSON: {e}")))
}

/// Writes `value` as pretty JSON to `path` through a temporary file and a
/// rename, so that `path` is either absent, the old file or the whole new one.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), CliError> {
    let io = |source| CliError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| io(std::io::Error::other(e)))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text + "\n").map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The differences between two fingerprints, as `key: recorded → now` over
/// their leaves (dotted keys), in key order.
pub fn differences(recorded: &Value, now: &Value) -> Vec<String> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten("", recorded, &mut a);
    flatten("", now, &mut b);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let absent = "(absent)".to_string();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            format!(
                "{k}: {} → {}",
                a.get(k).unwrap_or(&absent),
                b.get(k).unwrap_or(&absent)
            )
        })
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// `sha256:<hex>` of a digest.
fn tagged(digest: impl AsRef<[u8]>) -> String {
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `sha256:<hex>` of a file's bytes.
pub fn file_sha256(path: &Path) -> Result<String, CliError> {
    let io = |source| CliError::Io {
        what: format!("hashing {}", path.display()),
        source,
    };
    let mut input = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(tagged(hasher.finalize()))
}

/// The base model's identity: for a file (GGUF), the sha256 of its bytes; for
/// a folder, the sha256 of the lines `<name> <sha256 of the file>` of its
/// regular files (names not starting with `.`), sorted by name.
pub fn model_identity(model: &Path) -> Result<String, CliError> {
    if !model.is_dir() {
        return file_sha256(model);
    }
    let io = |source| CliError::Io {
        what: format!("listing the model folder {}", model.display()),
        source,
    };
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(model).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.path().is_file() {
            names.push((name, entry.path()));
        }
    }
    names.sort();
    let mut hasher = Sha256::new();
    for (name, path) in names {
        hasher.update(format!("{name} {}\n", file_sha256(&path)?).as_bytes());
    }
    Ok(tagged(hasher.finalize()))
}

/// `sha256:<hex>` of users' data: for each user, sorted by id, the id's and the
/// text's lengths (8 bytes little-endian) each followed by its UTF-8 bytes.
pub fn data_hash<'a>(users: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut sorted: Vec<(&str, &str)> = users.into_iter().collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    for (id, text) in sorted {
        for part in [id, text] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
    }
    tagged(hasher.finalize())
}

/// A seed for `purpose` (`train`, `holdout`) of member `index`, derived from
/// `--seed`: the first 8 bytes (big-endian) of sha256(le64(seed) ‖ purpose ‖ le64(index)).
pub fn derive_seed(seed: u64, purpose: &str, index: usize) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(seed.to_le_bytes());
    hasher.update(purpose.as_bytes());
    hasher.update((index as u64).to_le_bytes());
    let d = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_changed_leaves() {
        let a = json!({"config": {"rank": 8, "targets": ["q_proj"]}, "data": {"sha256": "x"}});
        let b = json!({"config": {"rank": 4, "targets": ["q_proj"]}, "data": {"sha256": "x"}});
        assert_eq!(differences(&a, &b), vec!["config.rank: 8 → 4".to_string()]);
        assert!(differences(&a, &a).is_empty());
    }

    #[test]
    fn data_hash_ignores_order_and_separates_fields() {
        let h = data_hash([("a", "xy"), ("b", "z")]);
        assert_eq!(h, data_hash([("b", "z"), ("a", "xy")]));
        assert_ne!(h, data_hash([("a", "x"), ("b", "yz")]));
        assert_ne!(h, data_hash([("a", "xy")]));
        assert!(h.starts_with("sha256:") && h.len() == 7 + 64);
    }

    #[test]
    fn derived_seeds_differ_by_purpose_and_index() {
        let s = derive_seed(1, "train", 0);
        assert_eq!(s, derive_seed(1, "train", 0));
        assert_ne!(s, derive_seed(1, "train", 1));
        assert_ne!(s, derive_seed(1, "holdout", 0));
        assert_ne!(s, derive_seed(2, "train", 0));
    }
}
