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
    /// The query, key and value projections.
    pub qkv: QkvProjections<B>,
    /// Output projection.
    pub o_proj: Linear<B>,
    /// Gemma 3 per-head query norm.
    pub q_norm: Option<RmsNorm<B>>,
    /// Gemma 3 per-head key norm.
    pub k_norm: Option<RmsNorm<B>>,
}

/// How an attention block projects its queries, keys and values.
#[derive(Debug, Clone)]
pub enum QkvProjections<B: Backend> {
    /// Three projections (HF `q_proj`, `k_proj`, `v_proj`), queries
    /// `[heads·head_dim, hidden]`, keys and values
    /// `[kv_heads·head_dim, hidden]`.
    Separate([Linear<B>; 3]),
    /// One projection whose output holds the queries', keys' and values'
    /// columns in that order (GPT-2's `c_attn`).
    Fused(Linear<B>),
}

impl<B: Backend> Attention<B> {
    /// The query, key and value projections, where they are separate.
    pub fn separate_qkv(&self) -> Option<&[Linear<B>; 3]> {
        match &self.qkv {
            QkvProjections::Separate(qkv) => Some(qkv),
            QkvProjections::Fused(_) => None,
        }
    }

    /// Widths of the queries, keys and values.
    pub fn qkv_widths(&self) -> [usize; 3] {
        let c = &self.config;
        [c.num_heads, c.num_kv_heads, c.num_kv_heads].map(|h| h * c.head_dim)
    }
}
