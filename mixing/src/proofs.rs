//! The proofs this crate's guarantees rest on, as written beside each construction
//! (`src/<construction>/proof.md`, shipped in the crate), one page each.

// The notes are prose with formulas, written for readers of the source as much as of the docs.
#![allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]

#[doc = include_str!("logit/proof.md")]
pub mod logit {}

#[doc = include_str!("margin/proof.md")]
pub mod margin {}

#[doc = include_str!("pmixed/proof.md")]
pub mod pmixed {}

#[doc = include_str!("solver/proof.md")]
pub mod solver {}

#[doc = include_str!("submix/proof.md")]
pub mod submix {}

#[doc = include_str!("topk/proof.md")]
pub mod topk {}
