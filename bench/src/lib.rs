//! # privmix-bench
//!
//! Privacy–utility experiments for privmix. The micro-benchmarks of each crate
//! live beside the crate (`cargo bench -p privmix-renyi`, …); this crate will hold
//! the end-to-end experiments of the papers (perplexity against ε, canary
//! extraction, membership inference) once the model crates exist. Until then
//! `cargo xtask bench` runs the criterion benches of the crates that exist.
