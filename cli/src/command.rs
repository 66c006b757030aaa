//! The command tree: `privmix` and its subcommands, each with the arguments its
//! module defines. Above `args.rs` and the subcommands' modules (`train`, `serve`),
//! which it gathers; only `main.rs` reads it.

use clap::{Parser, Subcommand};

use crate::args::{GenerateArgs, LedgerAction, ScoreArgs};
use crate::serve::ServeArgs;
use crate::train::TrainArgs;

/// Private next-token prediction with LLMs: generate or score text through a private
/// mechanism over a base model and LoRA members, with every charge in a durable ledger.
#[derive(Debug, Parser)]
#[command(name = "privmix", version, about, after_help = EXIT_STATUS)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The exit statuses, shown at the end of `--help`.
pub const EXIT_STATUS: &str = "Exit status: 0 success; 1 any other error; 2 bad arguments \
(clap's, and privmix's own: a value out of range, flags that contradict each other, a malformed \
--prompt-file); 3 privacy budget exhausted before the first token (nothing released); 4 privacy \
budget exhausted during the run (the text stopped early: what was released and the summary are \
printed).";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text privately; the text goes to stdout, the spent ε to stderr
    /// (or everything as JSON lines on stdout with --json).
    ///
    /// Timing: how long a step takes depends on the private data (solver evaluations,
    /// screening, fallbacks to the public model), so the moment each token appears can
    /// leak what the ledger does not charge for. --step-time-ms releases every token at a
    /// fixed, data-independent deadline.
    ///
    /// Budget: a mechanism calibrated to the budget (PMixED's and SubMix's radius,
    /// AdaPMixED's filter) is fitted to what is left of the ledger's budget: what was
    /// spent composed with this run's --max-tokens (times the number of prompts)
    /// queries stays within ε at δ.
    #[command(after_help = EXIT_STATUS)]
    Generate(GenerateArgs),
    /// Perplexity of a mechanism's predictions on a text file (teacher forcing over
    /// fixed-length blocks). No privacy charge covers a perplexity (a mechanism's
    /// guarantee is for tokens sampled from its distributions, not the distributions),
    /// so over private adapters it needs --no-privacy and is marked non-private.
    #[command(after_help = EXIT_STATUS)]
    Score(ScoreArgs),
    /// Inspect or change a privacy ledger.
    Ledger {
        /// What to do with it.
        #[command(subcommand)]
        action: LedgerAction,
    },
    /// Fine-tune one LoRA member per shard of a provider's data (or the DP-SGD
    /// baseline), written as PEFT folders with a partition manifest.
    Train(TrainArgs),
    /// Serve private completions over an OpenAI-compatible HTTP API, every token
    /// charged to the ledger before it is sent.
    Serve(ServeArgs),
}
