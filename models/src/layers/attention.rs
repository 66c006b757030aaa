//! Multi-head attention with grouped key/value heads (Ainslie et al. 2023,
//! "GQA"), a causal + padding (+ optional sliding-window) mask, optional
//! attention-logit soft-capping (Gemma 2) and optional per-head RMSNorm of
//! queries and keys (Gemma 3).
//!
//! Follows HF transformers' eager attention: scores `q kᵀ · scale`, then
//! soft-cap, then the mask, then softmax in f32, then `· v`.

use burn::tensor::{Bool, Tensor, activation::softmax, backend::Backend};

use super::activation::soft_cap;
use super::kv_cache::KvCache;
use super::linear::{Linear, LinearDelta, Projection, Site};
use super::rms_norm::RmsNorm;
use super::rope::RopeAngles;

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

impl<B: Backend> Attention<B> {
    /// Attention of `x` (`[batch, seq, hidden]`, this step's tokens) over the
    /// cached slots of `layer` plus this step; `mask` comes from
    /// [`KvCache::mask`] (after [`KvCache::push_step`] for this step).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        layer: usize,
        angles: &RopeAngles<B>,
        mask: &Tensor<B, 4, Bool>,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, s, _] = x.dims();
        let site = |module| Site { layer, module };
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([b, s, n, c.head_dim]);

        let mut q = heads(
            self.q_proj.forward(x.clone(), site(Projection::Q), delta),
            c.num_heads,
        );
        let mut k = heads(
            self.k_proj.forward(x.clone(), site(Projection::K), delta),
            c.num_kv_heads,
        );
        let v = heads(
            self.v_proj.forward(x, site(Projection::V), delta),
            c.num_kv_heads,
        );
        if let Some(norm) = &self.q_norm {
            q = norm.forward(q);
        }
        if let Some(norm) = &self.k_norm {
            k = norm.forward(k);
        }
        let q = angles.apply_seq_major(q).swap_dims(1, 2);
        let k = angles.apply_seq_major(k).swap_dims(1, 2);
        let (k, v) = cache.append(layer, k, v.swap_dims(1, 2));
        let t = k.dims()[2];

        // Group queries by their key/value head: [b, kv, rep·s, d], so each
        // key/value head is used without being copied.
        let rep = c.num_heads / c.num_kv_heads;
        let q = q.reshape([b, c.num_kv_heads, rep * s, c.head_dim]);
        let mut scores = q.matmul(k.swap_dims(2, 3)) * c.scale;
        if let Some(cap) = c.softcap {
            scores = soft_cap(scores, cap);
        }
        let scores = scores
            .reshape([b, c.num_heads, s, t])
            .mask_fill(mask.clone().expand([b, c.num_heads, s, t]), f32::MIN);
        let probs = softmax(scores, 3).reshape([b, c.num_kv_heads, rep * s, t]);
        let out = probs
            .matmul(v)
            .reshape([b, c.num_heads, s, c.head_dim])
            .swap_dims(1, 2)
            .reshape([b, s, c.num_heads * c.head_dim]);
        self.o_proj.forward(out, site(Projection::O), delta)
    }
}
