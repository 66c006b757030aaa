//! Linear projections and the LoRA hook.
//!
//! Every projection a LoRA adapter may target goes through [`Linear::forward`],
//! which adds, besides `x Wᵀ + b`, whatever the optional [`LinearDelta`] returns
//! for that [`Site`]. With no adapter the hook costs one `Option` check.

use burn::tensor::{Tensor, backend::Backend};

/// Which projection of a layer (the modules a LoRA may target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Projection {
    /// Attention query projection (`q_proj`).
    Q,
    /// Attention key projection (`k_proj`).
    K,
    /// Attention value projection (`v_proj`).
    V,
    /// Attention output projection (`o_proj`).
    O,
    /// MLP gate projection (`gate_proj`).
    Gate,
    /// MLP up projection (`up_proj`).
    Up,
    /// MLP down projection (`down_proj`).
    Down,
    /// GPT-2 fused query/key/value projection (`attn.c_attn`).
    CAttn,
    /// GPT-2 attention output projection (`attn.c_proj`).
    CProj,
    /// GPT-2 MLP input projection (`mlp.c_fc`).
    CFc,
    /// GPT-2 MLP output projection (`mlp.c_proj`).
    MlpCProj,
}

/// Where in the network a linear projection sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    /// Transformer block index, from 0.
    pub layer: usize,
    /// Which projection of the block.
    pub module: Projection,
}

/// A per-call source of additive corrections to linear projections (a LoRA
/// adapter, or one adapter per batch row).
pub trait LinearDelta<B: Backend> {
    /// Extra output to add to the base projection of `x`
    /// (`[batch, seq, in]` → `[batch, seq, out]`), or `None` when this site
    /// carries no adapter. Each batch row may belong to a different member.
    ///
    /// Contract: a returned tensor has exactly the base projection's shape.
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>>;
}

/// `y = x Wᵀ + b` with `W` stored `[out, in]` as in PyTorch checkpoints.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// `Wᵀ`, `[in, out]` (a transposed view of the `[out, in]` weight).
    weight_t: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> Linear<B> {
    /// A projection from a PyTorch-layout `[out, in]` weight and optional `[out]` bias.
    pub fn new(weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        Self {
            weight_t: weight.transpose(),
            bias,
        }
    }

    /// A projection from an `[in, out]` weight (GPT-2 `Conv1D` layout).
    pub fn from_in_out(weight_in_out: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        Self {
            weight_t: weight_in_out,
            bias,
        }
    }

    /// The weight as `[in, out]` (a view of the checkpoint's `[out, in]`).
    pub fn weight_t(&self) -> &Tensor<B, 2> {
        &self.weight_t
    }

    /// The bias, `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight_t.dims()[0]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight_t.dims()[1]
    }

    /// `x Wᵀ + b` (+ the adapter's delta at `site`), `[batch, seq, in]` →
    /// `[batch, seq, out]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        site: Site,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Tensor<B, 3> {
        let extra = delta.and_then(|d| d.delta(site, &x));
        let y = self.forward_base(x);
        match extra {
            Some(e) => y + e,
            None => y,
        }
    }

    /// `x Wᵀ + b` without any adapter.
    pub fn forward_base(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, s, i] = x.dims();
        let y = x.reshape([b * s, i]).matmul(self.weight_t.clone());
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        y.reshape([b, s, self.out_features()])
    }
}
