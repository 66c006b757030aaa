//! Small building blocks shared by the models: linear projections with the
//! LoRA hook, RMS normalisation, rotary position embeddings, grouped-query
//! attention, the per-row key/value cache and activations.

pub mod activation;
pub mod attention;
pub mod eager;
#[cfg(feature = "flex")]
pub mod f32_tiles;
#[cfg(feature = "flex")]
mod few_rows;
#[cfg(feature = "flex")]
mod host_kv;
#[cfg(feature = "flex")]
mod host_weight;
#[cfg(feature = "flex")]
pub mod int8_activations;
pub mod kv_cache;
pub mod kv_precision;
pub mod layer_norm;
pub mod linear;
#[cfg(feature = "flex")]
pub mod quantized;
pub mod rms_norm;
pub mod rope;
#[cfg(feature = "flex")]
pub mod simd;
#[cfg(feature = "flex")]
pub mod vexp;

pub use attention::{Attention, AttentionConfig};
pub use eager::Scoring;
pub use kv_cache::{KvCache, StepMask};
pub use kv_precision::KvPrecision;
pub use layer_norm::LayerNorm;
pub use linear::{Linear, LinearDelta, Projection, Site};
pub use rms_norm::RmsNorm;
pub use rope::{Rope, RopeAngles, RopeScaling, RopeStyle};
