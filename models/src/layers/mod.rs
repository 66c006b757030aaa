//! Small building blocks shared by the models: linear projections with the
//! LoRA hook, RMS and layer normalisation, rotary position embeddings, grouped-query
//! attention, the per-row key/value cache and activations.

pub mod activation;
pub mod attention;
pub mod eager;
#[cfg(feature = "flex")]
mod host_kv;
pub mod kv_cache;
pub mod kv_precision;
pub mod layer_norm;
pub mod linear;
pub mod norm;
pub mod rms_norm;
pub mod rope;
/// The f32 vector loops of [`crate::cpu::simd`], at the path the other
/// crates of the workspace use.
#[cfg(feature = "flex")]
pub use crate::cpu::simd;

pub use attention::{Attention, AttentionConfig, QkvProjections};
pub use eager::Scoring;
pub use kv_cache::{KvCache, StepMask};
pub use kv_precision::KvPrecision;
pub use layer_norm::LayerNorm;
pub use linear::{Linear, LinearDelta, Projection, Site};
pub use norm::Norm;
pub use rms_norm::RmsNorm;
pub use rope::{Rope, RopeAngles, RopeScaling, RopeStyle};
