//! The proofs this crate's guarantees rest on, as written beside each construction
//! (`src/<construction>/proof.md`, shipped in the crate), one page each.

// The notes are prose with formulas, written for readers of the source as much as of the docs.
#![allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]

#[doc = include_str!("adapmixed/proof.md")]
pub mod adapmixed {}

#[doc = include_str!("baselines/proof.md")]
pub mod baselines {}

#[doc = include_str!("dps_mozo/proof.md")]
pub mod dps_mozo {}

#[doc = include_str!("embedding_aggregation/proof.md")]
pub mod embedding_aggregation {}

#[doc = include_str!("noise/proof.md")]
pub mod noise {}

#[doc = include_str!("pmixed/proof.md")]
pub mod pmixed {}

#[doc = include_str!("submix/proof.md")]
pub mod submix {}
