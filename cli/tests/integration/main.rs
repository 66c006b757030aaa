//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod serve_support;
mod support;

mod cli;
mod leaks;
mod ledger_store;
mod readme;
mod serve;
mod serve_replicas;
mod train;
