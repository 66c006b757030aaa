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
    /// The tokenizer could not be loaded, or the text not encoded or decoded.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
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
        "privacy budget exhausted in ledger {path}: spent ε = {spent} at δ = {delta} of the budget ε = {budget}; the next {mechanism} token would cost more than is left (use a new ledger or raise the budget with --epsilon)"
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
    /// The ledger could not be opened, created, read or written.
    #[error("ledger {path}: {source}")]
    Ledger {
        /// The ledger file.
        path: PathBuf,
        /// Why.
        #[source]
        source: LedgerError,
    },
    /// An accounting computation failed.
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// A mechanism rejected its parameters or a step failed.
    #[error("mechanism: {0}")]
    Mechanism(#[from] MechanismError),
    /// The ensemble runner failed.
    #[error("ensemble: {0}")]
    Ensemble(#[from] EnsembleError),
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

impl CliError {
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
