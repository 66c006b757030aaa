//! What can go wrong in `privmix train`, each variant naming what to fix.

use std::path::PathBuf;

use privmix_ensemble::data::DataError;
use privmix_ensemble::lora::LoraError;
use privmix_ensemble::train::TrainError;
use thiserror::Error;

/// Errors of `privmix train` (wrapped by [`crate::error::CliError::Train`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrainCmdError {
    /// A line of the JSON-lines data is not a record `{"user": …, "text": …}`.
    #[error("{source_name} line {line}: {}{reason}", field.map(|f| format!("field {f:?}: ")).unwrap_or_default())]
    BadLine {
        /// The file (or `stdin`).
        source_name: String,
        /// The line number, from 1.
        line: usize,
        /// The field at fault (`None`: the line as a whole).
        field: Option<&'static str>,
        /// What is wrong.
        reason: String,
    },
    /// The data folder holds something other than one text file per user.
    #[error("{path}: {reason}")]
    BadDataFile {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The users could not form a corpus, be partitioned or be tokenised.
    #[error("{what}: {source}")]
    Data {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: DataError,
    },
    /// A member's users have too little text for one training block.
    #[error(
        "{member} has no complete block of {block_size} tokens ({users} user(s), {tokens} tokens): use a smaller --block-size, fewer --members or more data"
    )]
    NoBlocks {
        /// The member (or `dp-sgd`).
        member: String,
        /// Its users.
        users: usize,
        /// Their tokens.
        tokens: u64,
        /// The block size asked for.
        block_size: usize,
    },
    /// Fine-tuning a member failed (configuration, checkpoint or numerics).
    #[error("{member}: {source}")]
    Training {
        /// The member (or `dp-sgd`).
        member: String,
        /// Why.
        #[source]
        source: TrainError,
    },
    /// A trained adapter could not be written.
    #[error("cannot write the adapter {path}: {source}")]
    AdapterWrite {
        /// The adapter folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: LoraError,
    },
    /// `--out` holds a run made with other arguments, data, base model or tokenizer.
    #[error(
        "{out} holds a training run made with other inputs ({}); rerun with the arguments and data it was made with to continue it, or choose another --out",
        differences.join("; ")
    )]
    RunMismatch {
        /// The output folder.
        out: PathBuf,
        /// Each difference, `key: recorded → now`.
        differences: Vec<String>,
    },
    /// `--out` is not empty and holds no `privmix train` run.
    #[error(
        "{0} is not empty and holds no privmix train run (no manifest.json or checkpoints/run.json): choose an empty or new --out"
    )]
    NotARun(PathBuf),
    /// A state file of the run (run.json, a member's done.json, manifest.json) is unreadable.
    #[error("{path}: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl TrainCmdError {
    /// Whether the fault is in what the command was given (malformed or
    /// too little data, a `--out` that holds something else or another run),
    /// which the command line reports as a usage error, rather than in the
    /// training itself or the files it wrote.
    pub fn is_usage(&self) -> bool {
        match self {
            Self::BadLine { .. }
            | Self::BadDataFile { .. }
            | Self::Data { .. }
            | Self::NoBlocks { .. }
            | Self::RunMismatch { .. }
            | Self::NotARun(_) => true,
            Self::Training { .. } | Self::AdapterWrite { .. } | Self::State { .. } => false,
        }
    }
}
