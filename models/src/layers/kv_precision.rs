//! How a KV cache holds its keys and values (a leaf module, shared by the
//! cache and its host storage).

/// How a [`super::KvCache`] holds keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvPrecision {
    /// As the projections make them (f32).
    #[default]
    F32,
    /// Each key and value entry rounded to the nearest f16 when it is
    /// appended (llama.cpp's default cache type); attention then runs in
    /// f32 exactly as for [`KvPrecision::F32`] over those values (widening
    /// an f16 is exact). Host-held caches (plain burn-flex) keep the f16
    /// bits: half the memory, and half the bytes a decode step reads from
    /// its cache. Tensor-held caches keep the rounded values in f32 (burn's
    /// cast to f16 and back). An entry beyond f16's range (|x| ≥ 65520)
    /// becomes infinite and the step's outputs NaN, which the mechanisms
    /// reject with a typed error (non-finite probabilities), never used.
    F16,
}
