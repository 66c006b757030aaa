//! The `privmix` command line: private generation (`privmix generate`), perplexity under a
//! mechanism (`privmix score`) and the privacy ledger (`privmix ledger
//! show|verify|export|raise|tenant-budget`).
//!
//! Errors are printed as one message naming what to fix. Exit status: 0 success; 1 any
//! other error; 2 bad arguments (clap's, and our own: a value out of range, flags that
//! contradict each other, a malformed prompt file); 3 the privacy budget exhausted before
//! the first token; 4 the budget exhausted during the run (the text stopped early, what was
//! released and the summary printed).

mod args;
mod command;
mod error;
mod generate;
mod ledger_cmd;
mod ledger_common;
mod ledger_store;
mod pacing;
mod prompts;
mod protected;
mod score;
mod serve;
mod setup;
mod step_sink;
mod temper;
mod train;

use clap::Parser;

use crate::command::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let ok = |()| error::EXIT_OK;
    let result = match &cli.command {
        Command::Generate(args) => generate::run(args).map(generate::RunEnd::exit_code),
        Command::Score(args) => score::run(args).map(ok),
        Command::Ledger { action } => ledger_cmd::run(action).map(ok),
        Command::Train(args) => train::run(args).map(ok),
        Command::Serve(args) => serve::run(args).map(ok),
    };
    match result {
        Ok(error::EXIT_OK) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => fail(&e),
    }
}

/// Prints `e` with its causes and exits with its status.
fn fail(e: &error::CliError) -> ! {
    let mut message = format!("privmix: error: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(&format!("\n  caused by: {text}"));
        }
        source = s.source();
    }
    eprintln!("{message}");
    std::process::exit(e.exit_code());
}
