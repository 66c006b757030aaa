//! [`BlockOps`] with burn's tensor ops: every backend, every step. Where
//! tensors live in host memory the projections and the KV cache still call
//! the CPU kernels for the products and attention they serve (as the model's
//! [`crate::plan::ExecutionPlan`] set them up at load).

use burn::tensor::{Int, Tensor, backend::Backend, module::embedding};

use super::{BlockOps, Cached, MlpActivation};
use crate::backend::ModelBackend;
use crate::error::ModelError;
use crate::layers::activation::{gelu, gelu_tanh, silu};
use crate::layers::{Attention, Linear, LinearDelta, Norm, Scoring, Site};

/// The tensor implementation of one forward step.
pub struct TensorOps<'d, B: Backend> {
    delta: Option<&'d dyn LinearDelta<B>>,
    /// SiLU in host memory (vectorised) rather than burn's element-wise op.
    host_silu: bool,
}

impl<'d, B: ModelBackend> TensorOps<'d, B> {
    /// Block operations adding `delta`'s updates to the projections;
    /// `host_silu`: SiLU computed in host memory (tensors there).
    pub fn new(delta: Option<&'d dyn LinearDelta<B>>, host_silu: bool) -> Self {
        Self { delta, host_silu }
    }
}

impl<B: ModelBackend> BlockOps<B> for TensorOps<'_, B> {
    type Rows = Tensor<B, 3>;
    type Product = Tensor<B, 3>;
    type Context<'c> = Cached<'c, B>;

    fn embed(
        &mut self,
        table: &Tensor<B, 2>,
        ids: Tensor<B, 2, Int>,
        scale: Option<f32>,
        positions: Option<(&Tensor<B, 2>, Tensor<B, 2, Int>)>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = embedding(table.clone(), ids);
        let x = match scale {
            Some(s) => x * s,
            None => x,
        };
        Ok(match positions {
            Some((table, at)) => x + embedding(table.clone(), at),
            None => x,
        })
    }

    fn norm(&mut self, norm: &Norm<B>, x: &Tensor<B, 3>) -> Tensor<B, 3> {
        norm.forward(x.clone())
    }

    fn project<const N: usize>(
        &mut self,
        x: &Tensor<B, 3>,
        projections: [(&Linear<B>, Site); N],
    ) -> [Tensor<B, 3>; N] {
        Linear::forward_shared(projections, x.clone(), self.delta)
    }

    fn split<const N: usize>(
        &mut self,
        fused: Tensor<B, 3>,
        widths: [usize; N],
    ) -> [Tensor<B, 3>; N] {
        let mut start = 0;
        widths.map(|w| {
            let part = fused.clone().narrow(2, start, w);
            start += w;
            part
        })
    }

    fn attend(
        &mut self,
        attn: &Attention<B>,
        layer: usize,
        [q, k, v]: [Tensor<B, 3>; 3],
        Cached {
            angles,
            mask,
            cache,
        }: Cached<'_, B>,
    ) -> Tensor<B, 3> {
        let c = &attn.config;
        let [b, s, _] = q.dims();
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([b, s, n, c.head_dim]);
        let mut q = heads(q, c.num_heads);
        let mut k = heads(k, c.num_kv_heads);
        let v = heads(v, c.num_kv_heads);
        if let Some(norm) = &attn.q_norm {
            q = norm.forward(q);
        }
        if let Some(norm) = &attn.k_norm {
            k = norm.forward(k);
        }
        let scoring = Scoring {
            scale: c.scale,
            softcap: c.softcap,
        };
        // The cache rotates queries and keys (in host memory where it keeps them).
        cache.attend(layer, q, k, v, angles, mask, scoring)
    }

    fn gated(&mut self, act: MlpActivation, gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        self.activate(act, gate) * up
    }

    fn activate(&mut self, act: MlpActivation, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match act {
            MlpActivation::Silu if self.host_silu => host_silu(x),
            MlpActivation::Silu => silu(x),
            MlpActivation::GeluTanh => gelu_tanh(x),
            MlpActivation::Gelu => gelu(x),
        }
    }

    fn residual(
        &mut self,
        x: Tensor<B, 3>,
        y: Tensor<B, 3>,
        post: Option<&Norm<B>>,
        norm: &Norm<B>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let y = match post {
            Some(p) => p.forward(y),
            None => y,
        };
        let x = x + y;
        let n = norm.forward(x.clone());
        (x, n)
    }

    fn finish(self, normed: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        Ok(normed)
    }
}

/// SiLU vectorised in host memory (burn-flex takes each exponential through
/// libm, one element at a time); burn's op where the data cannot be read.
fn host_silu<B: ModelBackend>(x: Tensor<B, 3>) -> Tensor<B, 3> {
    #[cfg(feature = "flex")]
    {
        let (dims, device) = (x.shape(), x.device());
        if let Ok(mut v) = crate::runtime::to_vec(x.clone()) {
            crate::cpu::vexp::silu_in_place(&mut v);
            return Tensor::from_data(burn::tensor::TensorData::new(v, dims), &device);
        }
    }
    silu(x)
}
