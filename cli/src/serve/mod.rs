//! `privmix serve`: an OpenAI-compatible private endpoint (work in progress).

use clap::Args;

use crate::error::CliError;

/// `privmix serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {}

/// Runs `privmix serve`.
pub fn run(_args: &ServeArgs) -> Result<(), CliError> {
    Err(CliError::arg("serve", "not built yet"))
}
