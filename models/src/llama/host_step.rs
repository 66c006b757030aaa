//! A Llama forward step of a few new tokens per row (decoding) held in host
//! memory from the embedding to the final norm, on plain burn-flex.
//!
//! Why: on that path every product, delta and attention already runs on
//! host vectors; what was left in burn's ops (the norms, the residual
//! adds, the activation, reshapes, and the copies into and out of tensors
//! around each of them) ran on one thread while the pool's other thread
//! waited. In a SmolLM2 decode step with the N = 8 ensemble's nine rows,
//! measured with `perf` on `ensemble/examples`-style decode loops, that
//! serial remainder was about a quarter of the step.
//!
//! Same computation as [`Llama`]'s tensor path, step for step: each norm
//! by [`RmsNorm::forward_host`](crate::layers::RmsNorm), the products and
//! deltas by [`Linear::host_products`], rotation, cache append and
//! attention by the same host code the tensor path calls. Only the order of
//! the norms' sums may differ (tested against the tensor path in
//! `tests` below).

use burn::tensor::{Tensor, TensorData, backend::Backend, module::embedding};

use super::Llama;
use crate::error::ModelError;
use crate::layers::kv_cache::{HOST_QUERIES_MAX, HostShape};
use crate::layers::{KvCache, Linear, LinearDelta, Projection, Scoring, Site};
use crate::runtime::{Batch, Step, is_plain_flex, start_step, to_vec};

impl<B: Backend> Llama<B> {
    /// The step in host memory, or `None` (the cache untouched) where it
    /// does not apply: another backend, more than `HOST_QUERIES_MAX` new
    /// tokens per row, or a projection without a host-ready quantised copy.
    pub(super) fn forward_hidden_host(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Option<Result<Tensor<B, 3>, ModelError>> {
        let c = &self.config;
        let rows = batch.rows() * batch.len();
        let ready = is_plain_flex::<B>()
            && batch.len() <= HOST_QUERIES_MAX
            && self.layers.iter().all(|block| {
                let (a, m) = (&block.attn, &block.mlp);
                [&a.q_proj, &a.k_proj, &a.v_proj, &m.gate, &m.up]
                    .iter()
                    .all(|p| p.host_ready(rows, c.hidden_size))
                    && a.o_proj
                        .host_ready(rows, c.num_attention_heads * c.head_dim)
                    && m.down.host_ready(rows, c.intermediate_size)
            });
        ready.then(|| self.host_step(batch, cache, delta))
    }

    fn host_step(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let c = &self.config;
        let (b, s) = (batch.rows(), batch.len());
        let Step { ids, positions } = start_step(self, batch, cache)?;
        let angles = self.rope.angles::<B>(&positions, &self.device);
        let shape = HostShape {
            batch: b,
            seq: s,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };
        let mut x = to_vec(embedding(self.embed_tokens.clone(), ids))?;
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let attn = &block.attn;
            let n = block.input_layernorm.forward_host(&x);
            let [mut q, mut k, v] = products(
                &self.device,
                [b, s],
                delta,
                [
                    (&attn.q_proj, site(Projection::Q)),
                    (&attn.k_proj, site(Projection::K)),
                    (&attn.v_proj, site(Projection::V)),
                ],
                &n,
            );
            let scoring = Scoring {
                scale: attn.config.scale,
                softcap: attn.config.softcap,
            };
            let heads = cache.append_and_attend_host(
                i,
                (&mut q, &mut k, &v),
                shape,
                Some(&angles),
                None,
                scoring,
            );
            let [o] = products(
                &self.device,
                [b, s],
                delta,
                [(&attn.o_proj, site(Projection::O))],
                &heads,
            );
            add_in_place(&mut x, &o);

            let n = block.post_attention_layernorm.forward_host(&x);
            let [mut gate, up] = products(
                &self.device,
                [b, s],
                delta,
                [
                    (&block.mlp.gate, site(Projection::Gate)),
                    (&block.mlp.up, site(Projection::Up)),
                ],
                &n,
            );
            crate::layers::vexp::silu_in_place(&mut gate);
            gate.iter_mut().zip(&up).for_each(|(g, u)| *g *= u);
            let [down] = products(
                &self.device,
                [b, s],
                delta,
                [(&block.mlp.down, site(Projection::Down))],
                &gate,
            );
            add_in_place(&mut x, &down);
        }
        let x = self.norm.forward_host(&x);
        Ok(Tensor::from_data(
            TensorData::new(x, [b, s, c.hidden_size]),
            &self.device,
        ))
    }
}

/// [`Linear::host_products`] of projections checked `host_ready` by
/// [`Llama::forward_hidden_host`].
fn products<B: Backend, const N: usize>(
    device: &B::Device,
    shape: [usize; 2],
    delta: Option<&dyn LinearDelta<B>>,
    projections: [(&Linear<B>, Site); N],
    x: &[f32],
) -> [Vec<f32>; N] {
    Linear::host_products(projections, x, shape, delta, device)
        .expect("host_ready checked by forward_hidden_host")
}

/// `x += y`, elementwise (the residual adds).
fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}
