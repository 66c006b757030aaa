//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod ledger_support;

mod amplification_golden;
mod bad_input;
mod closed_forms;
mod ledger_api;
mod ledger_budget;
mod ledger_crash;
mod ledger_events;
mod ledger_protected;
mod ledger_recovery;
mod pld;
mod properties;
mod serde;
mod upstream;
