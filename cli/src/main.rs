//! The `privmix` command line: private generation (`privmix generate`), perplexity under a
//! mechanism (`privmix score`) and the privacy ledger (`privmix ledger
//! show|verify|export|raise`).
//!
//! Errors are printed as one message naming what to fix, with exit status 1 (2 for a
//! command line clap cannot parse).

mod args;
mod error;
mod generate;
mod ledger_cmd;
mod ledger_open;
mod ledger_store;
mod pacing;
mod protected;
mod score;
mod serve;
mod setup;
mod train;

use clap::Parser;

use crate::args::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Score(args) => score::run(args),
        Command::Ledger { action } => ledger_cmd::run(action),
        Command::Train(args) => train::run(args),
        Command::Serve(args) => serve::run(args),
    };
    if let Err(e) = result {
        let mut message = format!("privmix: error: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(&format!("\n  caused by: {text}"));
            }
            source = s.source();
        }
        eprintln!("{message}");
        std::process::exit(1);
    }
}
