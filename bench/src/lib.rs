//! # privmix-bench
//!
//! Evaluation metrics and privacy–utility experiments for privmix.
//!
//! - [`rouge`]: ROUGE-L precision, recall and F1, equal to Google's `rouge-score` package
//!   (without stemming) on a committed golden fixture.
//!
//! The micro-benchmarks of each crate live beside the crate (`cargo bench -p privmix-renyi`, …);
//! perplexity is computed by `privmix score` (crate `privmix-cli`). The end-to-end experiments of
//! the papers (perplexity against ε, canary extraction, membership inference) are still to come.

pub mod rouge;
