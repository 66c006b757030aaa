//! What can go wrong on the command line, each variant naming what to fix.

use std::path::PathBuf;

use privmix_accountant::{AccountantError, LedgerError};
use privmix_ensemble::lora::LoraError;
use privmix_ensemble::runner::EnsembleError;
use privmix_mechanisms::MechanismError;
use privmix_models::ModelError;
use thiserror::Error;

/// Errors of the `privmix` command line.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CliError {
    /// The base model could not be loaded.
    #[error("cannot load the base model {path}: {source}")]
    Model {
        /// The model path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// An adapter folder is missing, malformed or made for another base model.
    #[error("cannot use adapter {path}: {source}")]
    Adapter {
        /// The adapter folder given.
        path: PathBuf,
        /// Why.
        #[source]
        source: LoraError,
    },
    /// An adapter's weight file could not be read to compute its identity.
    #[error("cannot use adapter {path}: cannot read its weights {file}: {source}")]
    AdapterWeights {
        /// The adapter folder given.
        path: PathBuf,
        /// The weight file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Two adapters have byte-identical weights: one member's data would be used twice,
    /// which the mechanisms' per-member bounds do not allow.
    #[error(
        "adapters {first} and {second} have identical weights ({identity}): a member may be given only once"
    )]
    DuplicateAdapter {
        /// The first adapter folder.
        first: PathBuf,
        /// The second one.
        second: PathBuf,
        /// Their common identity.
        identity: String,
    },
    /// The tokenizer could not be loaded, or the text not encoded or decoded.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// `--chat` needs a chat template and none could be found, compiled or rendered.
    #[error("--chat: {source}")]
    ChatTemplate {
        /// Why.
        #[source]
        source: ModelError,
    },
    /// A prompt of `--prompt-file` (or `score --text`) is malformed.
    #[error("{input}, line {line}: {reason}")]
    Prompt {
        /// The file, or standard input.
        input: String,
        /// The line (from 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `--backend` names a backend this binary was built without.
    #[error(
        "--backend {backend}: this privmix was built without it; rebuild with `cargo build -p privmix --features {feature}`"
    )]
    BackendNotBuilt {
        /// The backend asked for.
        backend: &'static str,
        /// The cargo feature of the `privmix` package that builds it in.
        feature: &'static str,
    },
    /// The backend's device could not be opened.
    #[error("--backend {backend}: {source}")]
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    Device {
        /// The backend.
        backend: &'static str,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// No way to turn the prompt into token ids.
    #[error(
        "no tokenizer: the model folder has no tokenizer.json; pass --tokenizer <tokenizer.json> or --prompt-ids"
    )]
    NoTokenizer,
    /// A flag's value is out of range or flags contradict each other.
    #[error("invalid argument {flag}: {reason}")]
    Argument {
        /// The flag.
        flag: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The ledger's budget cannot pay for the next token.
    #[error(
        "privacy budget exhausted in ledger {path}: spent ε = {spent} at δ = {delta} of the budget ε = {budget}; the next {mechanism} token would cost more than is left (a larger budget must be set explicitly: privmix ledger raise {path} --epsilon E)"
    )]
    BudgetExhausted {
        /// The ledger file.
        path: PathBuf,
        /// ε spent so far (rounded up).
        spent: f64,
        /// The budget's δ.
        delta: f64,
        /// The budget's ε.
        budget: f64,
        /// The mechanism asked for.
        mechanism: &'static str,
    },
    /// A token was ready after its `--step-time-ms` deadline: it is withheld (it was
    /// charged) and the run ends, rather than release it at a data-dependent time.
    #[error(
        "token {token} missed its --step-time-ms deadline ({deadline_ms} ms after the first step started); it was charged but not released, and generation stopped. Choose a larger --step-time-ms"
    )]
    StepOverran {
        /// The token's index (from 0).
        token: usize,
        /// Its deadline, in ms after the first step started.
        deadline_ms: u128,
    },
    /// The ledger could not be opened, created, read or written.
    #[error("ledger {path}: {source}")]
    Ledger {
        /// The ledger file.
        path: PathBuf,
        /// Why.
        #[source]
        source: LedgerError,
    },
    /// A ledger store (a file or PostgreSQL, see `ledger_store`) could not be opened,
    /// read or written, or refused; the message names the store.
    #[error(transparent)]
    Store(#[from] crate::ledger_store::StoreError),
    /// An accounting computation failed.
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// A mechanism rejected its parameters or a step failed. The message is the
    /// error's public description (`MechanismError::public_description`): the kind of
    /// problem, never a row, index or value of the private distributions; and the
    /// error is not exposed as a `source`, so that no cause chain prints its
    /// `Display` form either.
    #[error("mechanism: {}", .0.public_description())]
    Mechanism(MechanismError),
    /// The ensemble runner failed.
    #[error("ensemble: {0}")]
    Ensemble(#[from] EnsembleError),
    /// `privmix train` failed (bad data, a training error, a mismatched run to resume).
    #[error(transparent)]
    Train(#[from] crate::train::error::TrainCmdError),
    /// Reading an input or writing the output failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Exit status of a run that worked.
pub const EXIT_OK: i32 = 0;
/// Exit status of any error without a status of its own.
pub const EXIT_ERROR: i32 = 1;
/// Exit status of bad arguments: clap's (unknown flag, missing value) and ours
/// (a value out of range, contradicting flags, a malformed prompt file).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when the budget is exhausted before any token was released.
pub const EXIT_BUDGET_EXHAUSTED: i32 = 3;
/// Exit status when the budget ran out during the run: the text stopped early
/// (what was released and the summary are printed).
pub const EXIT_BUDGET_STOPPED: i32 = 4;

impl CliError {
    /// The process exit status this error ends the run with.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Argument { .. }
            | Self::NoTokenizer
            | Self::Prompt { .. }
            | Self::BackendNotBuilt { .. } => EXIT_USAGE,
            Self::Train(e) if e.is_usage() => EXIT_USAGE,
            Self::Store(e) if e.is_usage() => EXIT_USAGE,
            Self::BudgetExhausted { .. } => EXIT_BUDGET_EXHAUSTED,
            _ => EXIT_ERROR,
        }
    }

    /// An argument error.
    pub fn arg(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::Argument {
            flag,
            reason: reason.into(),
        }
    }

    /// A ledger error for `path`.
    pub fn ledger(path: &std::path::Path, source: LedgerError) -> Self {
        Self::Ledger {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<MechanismError> for CliError {
    fn from(e: MechanismError) -> Self {
        Self::Mechanism(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mechanism error leaves the process (stderr, JSON, HTTP) by its public
    /// description only: no cause chain that would print the value.
    #[test]
    fn mechanism_errors_print_no_private_values() {
        let e = CliError::from(MechanismError::NonFinite {
            row: 2,
            index: 41,
            value: -1.5e300,
        });
        let text = e.to_string();
        assert!(!text.chars().any(|c| c.is_ascii_digit()), "{text}");
        assert!(std::error::Error::source(&e).is_none());
    }
}
