//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod verifier;

mod adapmixed_exact;
mod adapmixed_refusal;
mod adapmixed_step;
mod baselines_exact;
mod dps_mozo_exact;
mod dps_mozo_paper_bound;
mod dps_mozo_workflows;
mod embedding_aggregation_exact;
mod no_model_runtime;
mod pmixed_exact;
mod pmixed_paper_bound;
mod release;
mod submix_paper_protocol;
mod tight_pmixed_search;
mod verify_adapmixed;
mod verify_dps_mozo;
mod verify_noise_baselines;
mod verify_pmixed;
mod verify_samplers;
mod verify_submix;
