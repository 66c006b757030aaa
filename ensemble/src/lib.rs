//! # privmix-ensemble
//!
//! N LoRA members over one shared base model, evaluated together with the public
//! model in one batched forward (`privmix-models` underneath).
//!
//! Built: LoRA adapters in the PEFT format (load and save, checked against
//! adapters made by the `peft` package), per-row stacked adapters applied as a
//! batched low-rank product through the models' `LinearDelta` hook (their
//! factors held in f32, or in f16: [`stacked::FactorPrecision`]), and the
//! [`runner::EnsembleRunner`] (incremental decoding with a KV cache per row,
//! teacher-forced block scoring, row layouts for PMixED, SubMix and DPS-MOZO).
//! The private corpus as users and its user-level partition into disjoint
//! parts ([`data`]), and LoRA fine-tuning of a member on its part with
//! burn autodiff ([`train`]).

// The README's quick start, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub mod data;
mod error;
mod host_factors;
pub mod lora;
pub mod rows;
pub mod runner;
pub mod stacked;
pub mod train;

pub use error::EnsembleError;
