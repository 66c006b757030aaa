//! Multi-head attention with grouped key/value heads (Ainslie et al. 2023,
//! "GQA"), a causal + padding (+ optional sliding-window) mask, optional
//! attention-logit soft-capping (Gemma 2) and optional per-head RMSNorm of
//! queries and keys (Gemma 3).
//!
//! Follows HF transformers' eager attention: scores `q kᵀ · scale`, then
//! soft-cap, then the mask, then softmax in f32, then `· v`.

use burn::tensor::{Bool, Tensor, activation::softmax, backend::Backend};

use super::activation::soft_cap;
use super::kv_cache::{KvCache, Scoring, StepMask};
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
        mask: &StepMask<B>,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, s, _] = x.dims();
        let site = |module| Site { layer, module };
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([b, s, n, c.head_dim]);

        let [q, k, v] = Linear::forward_shared(
            [
                (&self.q_proj, site(Projection::Q)),
                (&self.k_proj, site(Projection::K)),
                (&self.v_proj, site(Projection::V)),
            ],
            x,
            delta,
        );
        let mut q = heads(q, c.num_heads);
        let mut k = heads(k, c.num_kv_heads);
        let v = heads(v, c.num_kv_heads);
        if let Some(norm) = &self.q_norm {
            q = norm.forward(q);
        }
        if let Some(norm) = &self.k_norm {
            k = norm.forward(k);
        }
        let scoring = Scoring {
            scale: c.scale,
            softcap: c.softcap,
        };
        // The cache rotates queries and keys (in host memory where it keeps them).
        let out = cache.attend(layer, q, k, v, Some(angles), mask, scoring);
        self.o_proj.forward(out, site(Projection::O), delta)
    }
}

/// HF eager attention with burn's ops: `softmax(q kᵀ · scale, soft-capped,
/// masked with f32::MIN) v`, for `q: [batch, new, heads, head_dim]` and all
/// keys and values `[batch, kv_heads, slots, head_dim]`; returns `[batch,
/// new, heads · head_dim]`.
pub(crate) fn eager<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &Tensor<B, 4, Bool>,
    scoring: Scoring,
) -> Tensor<B, 3> {
    let [b, s, heads, d] = q.dims();
    let [_, kv_heads, t, _] = k.dims();
    // Group queries by their key/value head: [b, kv, rep·s, d], so each
    // key/value head is used without being copied.
    let rep = heads / kv_heads;
    let q = q.swap_dims(1, 2).reshape([b, kv_heads, rep * s, d]);
    let mut scores = q.matmul(k.swap_dims(2, 3)) * scoring.scale;
    if let Some(cap) = scoring.softcap {
        scores = soft_cap(scores, cap);
    }
    let scores = scores
        .reshape([b, heads, s, t])
        .mask_fill(mask.clone().expand([b, heads, s, t]), f32::MIN);
    let probs = softmax(scores, 3).reshape([b, kv_heads, rep * s, t]);
    probs
        .matmul(v)
        .reshape([b, heads, s, d])
        .swap_dims(1, 2)
        .reshape([b, s, heads * d])
}
