//! The proofs this crate's guarantees rest on, as written beside each construction
//! (`src/<construction>/proof.md`, shipped in the crate), one page each.

// The notes are prose with formulas, written for readers of the source as much as of the docs.
#![allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]

#[doc = include_str!("amplification/proof.md")]
pub mod amplification {}

#[doc = include_str!("conversion/proof.md")]
pub mod conversion {}

#[doc = include_str!("event/pmixed/proof.md")]
pub mod event_pmixed {}

#[doc = include_str!("event/randomized_response/proof.md")]
pub mod event_randomized_response {}

#[doc = include_str!("pld/proof.md")]
pub mod pld {}
