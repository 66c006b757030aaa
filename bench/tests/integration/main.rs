//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod privacy_utility_tiny;
mod rouge_golden;
mod rouge_props;
