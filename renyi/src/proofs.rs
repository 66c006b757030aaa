//! The proofs this crate's guarantees rest on, as written beside each construction
//! (`src/<construction>/proof.md`, shipped in the crate), one page each.

// The notes are prose with formulas, written for readers of the source as much as of the docs.
#![allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]

#[doc = include_str!("divergence/proof.md")]
pub mod divergence {}

#[doc = include_str!("mixture/proof.md")]
pub mod mixture {}

#[doc = include_str!("round/proof.md")]
pub mod round {}
