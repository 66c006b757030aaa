//! The experiment's errors: each names the stage and what to fix.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Errors of the privacy–utility experiment and its report.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A setting that cannot work (odd member count, too few held-out blocks, ...).
    #[error("configuration: {0}")]
    Config(String),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The base model or tokenizer could not be loaded or run.
    #[error(transparent)]
    Model(#[from] privmix_models::ModelError),
    /// The corpus or its partition.
    #[error(transparent)]
    Data(#[from] privmix_ensemble::data::DataError),
    /// A LoRA adapter.
    #[error(transparent)]
    Lora(#[from] privmix_ensemble::lora::LoraError),
    /// Fine-tuning.
    #[error(transparent)]
    Train(#[from] privmix_ensemble::train::TrainError),
    /// The ensemble runner.
    #[error(transparent)]
    Ensemble(#[from] privmix_ensemble::runner::EnsembleError),
    /// A mechanism.
    #[error(transparent)]
    Mechanism(#[from] privmix_mechanisms::MechanismError),
    /// The accountant.
    #[error(transparent)]
    Accountant(#[from] privmix_accountant::AccountantError),
    /// Drawing a plot.
    #[error("plot {name}: {message}")]
    Plot {
        /// The plot's file name.
        name: String,
        /// What plotters said.
        message: String,
    },
}

impl BenchError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
