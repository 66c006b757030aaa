//! Multi-head attention with grouped key/value heads (Ainslie et al. 2023,
//! "GQA"), a causal + padding (+ optional sliding-window) mask, optional
//! attention-logit soft-capping (Gemma 2) and optional per-head RMSNorm of
//! queries and keys (Gemma 3).
//!
//! The block operations ([`crate::ops`]) run it: the projections, then the
//! KV cache's attention ([`super::KvCache::attend`], whose tensor form is
//! [`super::eager`]), then the output projection.

use burn::tensor::backend::Backend;

use super::linear::Linear;
use super::rms_norm::RmsNorm;

/// Shape and options of one attention block.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head (need not be `hidden / num_heads`).
    pub head_dim: usize,
    /// Multiplier of `q kᵀ` (usually `head_dim^-1/2`; Gemma 2/3:
    /// `query_pre_attn_scalar^-1/2`).
    pub scale: f64,
    /// Gemma 2 `attn_logit_softcapping`.
    pub softcap: Option<f64>,
}

/// The projections and norms of one attention block.
#[derive(Debug, Clone)]
pub struct Attention<B: Backend> {
    /// Configuration.
    pub config: AttentionConfig,
    /// Query projection `[heads·head_dim, hidden]`.
    pub q_proj: Linear<B>,
    /// Key projection.
    pub k_proj: Linear<B>,
    /// Value projection.
    pub v_proj: Linear<B>,
    /// Output projection.
    pub o_proj: Linear<B>,
    /// Gemma 3 per-head query norm.
    pub q_norm: Option<RmsNorm<B>>,
    /// Gemma 3 per-head key norm.
    pub k_norm: Option<RmsNorm<B>>,
}
