//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod lora_support;

mod continuous_batching;
mod dpsgd;
mod half_precision;
mod lora_errors;
mod merged;
mod partition_props;
mod peft;
mod runner;
mod shakespeare;
mod thread_count;
mod train;
