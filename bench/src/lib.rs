//! # privmix-bench
//!
//! Evaluation metrics and privacy–utility experiments for privmix.
//!
//! - [`claims`]: the papers' claims beside our figures, with verdicts.
//! - [`cache_key`]: the keys of the adapter and ICL caches (results version,
//!   canonical configuration, content hashes).
//! - [`rouge`]: ROUGE-L precision, recall and F1, equal to Google's `rouge-score` package
//!   (without stemming) on a committed golden fixture.
//! - [`experiment`]: the papers' perplexity-against-ε experiment — members fine-tuned
//!   on disjoint user-level parts of the Shakespeare plays, PMixED, AdaPMixED, SubMix,
//!   the DP-SGD baseline, the public model and the non-private ensemble scored on
//!   held-out blocks — run by the `privacy-utility` binary (and `cargo xtask bench`).
//! - [`icl`]: the DPS-MOZO experiment — zero-shot, few-shot, DPS-MOZO+On and +Off on
//!   WordNet's noun definitions, scored with ROUGE-L F1.
//! - [`report`] and [`plots`]: the report folder (Markdown, JSON, CSV, SVG plots);
//!   [`stats`]: the 95% intervals over seeds; [`run_info`]: commit, machine and phase times.
//!
//! The micro-benchmarks of each crate live beside the crate (`cargo bench -p privmix-renyi`, …).

pub mod cache_key;
pub mod claims;
pub mod error;
pub mod experiment;
pub mod icl;
pub mod plots;
pub mod report;
pub mod rouge;
pub mod run_info;
pub mod stats;

pub use error::BenchError;

/// The backend the experiments run on: burn-flex on the CPU, or burn's CUDA
/// backend when the crate is built with its `cuda` feature (`cargo run --release
/// -p privmix-bench --features cuda --bin privacy-utility`). Fine-tuning takes
/// the host step on burn-flex and burn autodiff on CUDA (see
/// `privmix_ensemble::train::StepPath`).
#[cfg(not(feature = "cuda"))]
pub type Backend = burn::backend::Flex;
/// The backend the experiments run on (see the CPU build's documentation).
#[cfg(feature = "cuda")]
pub type Backend = burn::backend::Cuda;

/// The backend's name, for the report.
pub const BACKEND_NAME: &str = if cfg!(feature = "cuda") {
    "cuda (burn)"
} else {
    "flex (burn, CPU)"
};
