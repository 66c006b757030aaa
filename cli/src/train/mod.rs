//! `privmix train`: LoRA members from a provider's data (work in progress).

use clap::Args;

use crate::error::CliError;

/// `privmix train`.
#[derive(Debug, Args)]
pub struct TrainArgs {}

/// Runs `privmix train`.
pub fn run(_args: &TrainArgs) -> Result<(), CliError> {
    Err(CliError::arg("train", "not built yet"))
}
