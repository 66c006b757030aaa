//! HF transformers' eager attention with burn's ops: scores `q kᵀ · scale`,
//! then soft-cap, then the mask, then softmax in f32, then `· v`. A leaf
//! module: the KV cache calls it for the steps it answers with tensors.

use burn::tensor::{Bool, Tensor, activation::softmax, backend::Backend};

use super::activation::soft_cap;

/// How attention scores are formed: `q·k · scale`, then, with a cap `c`,
/// `c·tanh(score / c)` (Gemma 2's soft-capping).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// Multiplier of `q·k` (usually `head_dim^-1/2`).
    pub scale: f64,
    /// Soft-cap of the scores, if any.
    pub softcap: Option<f64>,
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
