//! [`BlockOps`] in host memory: a decode step's activations stay in host
//! vectors from the embedding to the final norm (plain burn-flex, every
//! projection with a quantised copy; see [`crate::plan`]).
//!
//! Why: on that backend every product, LoRA update and attention runs on
//! host vectors anyway; what burn's ops would add between them (the norms,
//! residual adds, the activation, reshapes and copies into and out of
//! tensors) runs on one thread while the pool's other threads wait. Here a
//! Llama block is seven parallel passes:
//! 1. the query, key and value products (one region, `x` quantised once);
//! 2. per run of rows: their updates and biases, q/k norms, rotation, cache
//!    append and attention;
//! 3. the output product;
//! 4. per run of rows: its update, the residual add, the MLP's norm and its
//!    quantisation;
//! 5. the gate and up products;
//! 6. per run of rows: their updates, `act(gate)·up` and its quantisation;
//! 7. the down product, then per run of rows its update, the residual add
//!    and the next block's norm and quantisation.
//!
//! GPT-2's block differs in three passes: one fused product for the
//! queries, keys and values, whose update is added on its full rows before
//! they are cut ([`BlockOps::split`], one more pass); LayerNorms for RMSNorms;
//! and `act(up)` without a gate.
//!
//! A product's LoRA update is added inside the pass that consumes it when
//! the delta has a per-row host form ([`LinearDelta::has_host_rows`]); any
//! other delta is added right after the product, for all rows at once.
//!
//! Same computation as [`super::tensor`], step for step; only the order of
//! f32 sums may differ (tested against it in `tests/integration/llama_host_step.rs`).

use std::sync::Arc;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend, module::embedding};

use super::{BlockOps, Cached, MlpActivation};
use crate::backend::ModelBackend;
use crate::cpu::{Q8Row, Q8Rows};
use crate::error::ModelError;
use crate::layers::kv_cache::HostShape;
use crate::layers::{Attention, Linear, LinearDelta, Norm, Scoring, Site};
use crate::runtime::to_vec;

/// Rows of activations in host memory, `[rows, width]` row-major, with
/// their 8-bit quantisation where the next products take it.
pub struct HostRows {
    data: Vec<f32>,
    width: usize,
    quantized: Option<Q8Rows>,
}

/// A product whose LoRA update may still be owed: added row by row by the
/// pass that consumes it.
pub struct HostProduct {
    y: Vec<f32>,
    owed: Option<(Site, Arc<HostRows>)>,
}

/// The host implementation of one forward step of `batch` rows × `seq`
/// new tokens.
pub struct HostOps<'d, B: Backend> {
    /// A delta with a per-row host form: added inside the consuming passes.
    by_row: Option<&'d dyn LinearDelta<B>>,
    /// Any other delta: added after each product.
    at_once: Option<&'d dyn LinearDelta<B>>,
    batch: usize,
    seq: usize,
    /// Whether the products take 8-bit activations (their inputs are
    /// quantised in the pass that makes them).
    quantize: bool,
    device: B::Device,
}

impl<'d, B: ModelBackend> HostOps<'d, B> {
    /// The operations of a step of `batch` rows × `seq` new tokens, adding
    /// `delta`'s updates; `quantize`: the products take 8-bit activations.
    pub fn new(
        delta: Option<&'d dyn LinearDelta<B>>,
        [batch, seq]: [usize; 2],
        quantize: bool,
        device: &B::Device,
    ) -> Self {
        let (by_row, at_once) = match delta {
            Some(d) if d.has_host_rows() => (Some(d), None),
            d => (None, d),
        };
        Self {
            by_row,
            at_once,
            batch,
            seq,
            quantize,
            device: device.clone(),
        }
    }

    fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Room for the quantisation of `rows × width` outputs, where needed.
    fn quantized_room(&self, width: usize) -> Option<Q8Rows> {
        self.quantize.then(|| Q8Rows::zeroed(self.rows(), width))
    }

    /// `act(x)`, times `up` where given (a gated MLP), each row's owed
    /// updates added first and the result quantised where the next product
    /// takes 8-bit activations: one parallel pass.
    fn activated(
        &self,
        act: MlpActivation,
        x: HostProduct,
        up: Option<HostProduct>,
    ) -> Arc<HostRows> {
        let mut g = x.y;
        let width = g.len() / self.rows().max(1);
        let mut quantized = self.quantized_room(width);
        let (mut u, up_owed) = match up {
            Some(up) => (Some(up.y), up.owed),
            None => (None, None),
        };
        // Without a gate the second buffer is empty: its rows are empty too.
        let mut none = Vec::new();
        per_row(
            self.rows(),
            [&mut g, u.as_mut().unwrap_or(&mut none)],
            quantized.as_mut(),
            |row, [g, u], q| {
                self.settle(&x.owed, row, g);
                match act {
                    MlpActivation::Silu => crate::cpu::vexp::silu_in_place(g),
                    MlpActivation::GeluTanh => g.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
                    MlpActivation::Gelu => g.iter_mut().for_each(|x| *x = gelu(*x)),
                }
                if !u.is_empty() {
                    self.settle(&up_owed, row, u);
                    add_product_in_place(g, u);
                }
                if let Some(q) = q {
                    q.fill(g);
                }
            },
        );
        Arc::new(HostRows {
            data: g,
            width,
            quantized,
        })
    }

    /// Adds `p`'s owed update to its row `row` (`y`: that row's output).
    fn settle(&self, p: &Option<(Site, Arc<HostRows>)>, row: usize, y: &mut [f32]) {
        if let (Some(d), Some((site, input))) = (self.by_row, p) {
            let w = input.width;
            d.add_host_row(*site, row / self.seq, &input.data[row * w..][..w], y);
        }
    }
}

impl<B: ModelBackend> BlockOps<B> for HostOps<'_, B> {
    type Rows = Arc<HostRows>;
    type Product = HostProduct;
    type Context<'c> = Cached<'c, B>;

    fn embed(
        &mut self,
        table: &Tensor<B, 2>,
        ids: Tensor<B, 2, Int>,
        scale: Option<f32>,
        positions: Option<(&Tensor<B, 2>, Tensor<B, 2, Int>)>,
    ) -> Result<Arc<HostRows>, ModelError> {
        let width = table.dims()[1];
        let mut data = to_vec(embedding(table.clone(), ids))?;
        if let Some(s) = scale {
            data.iter_mut().for_each(|x| *x *= s);
        }
        if let Some((table, at)) = positions {
            add_in_place(&mut data, &to_vec(embedding(table.clone(), at))?);
        }
        Ok(Arc::new(HostRows {
            data,
            width,
            quantized: None,
        }))
    }

    fn norm(&mut self, norm: &Norm<B>, x: &Arc<HostRows>) -> Arc<HostRows> {
        let width = x.width;
        let mut n = vec![0.0f32; x.data.len()];
        let mut quantized = self.quantized_room(width);
        let input = &x.data;
        per_row(self.rows(), [&mut n], quantized.as_mut(), |row, [n], q| {
            norm.forward_host_into(&input[row * width..][..width], n);
            if let Some(q) = q {
                q.fill(n);
            }
        });
        Arc::new(HostRows {
            data: n,
            width,
            quantized,
        })
    }

    fn project<const N: usize>(
        &mut self,
        x: &Arc<HostRows>,
        projections: [(&Linear<B>, Site); N],
    ) -> [HostProduct; N] {
        let rows = self.rows();
        let mut ys = Linear::host_base_products(
            projections.map(|(p, _)| p),
            &x.data,
            rows,
            x.quantized.as_ref(),
        )
        .expect("every projection host-ready (checked by the execution plan)");
        for ((p, _), y) in projections.iter().zip(ys.iter_mut()) {
            if let Some(bias) = p.host_bias() {
                y.chunks_exact_mut(bias.len())
                    .for_each(|row| add_in_place(row, bias));
            }
        }
        if let Some(d) = self.at_once {
            let sites = projections.map(|(_, site)| site);
            Linear::add_deltas(
                &sites,
                &x.data,
                [self.batch, self.seq],
                d,
                &self.device,
                &mut ys,
            );
        }
        let mut ys = ys.into_iter();
        projections.map(|(_, site)| HostProduct {
            y: ys.next().expect("N products"),
            owed: self.by_row.is_some().then(|| (site, Arc::clone(x))),
        })
    }

    fn split<const N: usize>(
        &mut self,
        fused: HostProduct,
        widths: [usize; N],
    ) -> [HostProduct; N] {
        let rows = self.rows();
        let mut y = fused.y;
        let width = y.len() / rows.max(1);
        // The fused product's update is owed on its full rows: added
        // before they are cut.
        if fused.owed.is_some() {
            per_row(rows, [&mut y], None, |row, [y], _| {
                self.settle(&fused.owed, row, y)
            });
        }
        let mut parts = widths.map(|w| Vec::with_capacity(rows * w));
        for row in y.chunks_exact(width.max(1)) {
            let mut start = 0;
            for (part, w) in parts.iter_mut().zip(widths) {
                part.extend_from_slice(&row[start..start + w]);
                start += w;
            }
        }
        parts.map(|y| HostProduct { y, owed: None })
    }

    fn attend(
        &mut self,
        attn: &Attention<B>,
        layer: usize,
        [q, k, v]: [HostProduct; 3],
        Cached {
            angles,
            mask,
            cache,
        }: Cached<'_, B>,
    ) -> Arc<HostRows> {
        let c = &attn.config;
        let shape = HostShape {
            batch: self.batch,
            seq: self.seq,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let (mut qy, mut ky, mut vy) = (q.y, k.y, v.y);
        let owed = [q.owed, k.owed, v.owed];
        let widths = attn.qkv_widths();
        let norms = [attn.q_norm.as_ref(), attn.k_norm.as_ref(), None];
        let needs_prepare = self.by_row.is_some() || norms.iter().any(Option::is_some);
        let prepare = |first: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]| {
            let mut head = vec![0.0f32; c.head_dim];
            for (i, x) in [q, k, v].into_iter().enumerate() {
                for (j, y) in x.chunks_exact_mut(widths[i]).enumerate() {
                    self.settle(&owed[i], first * self.seq + j, y);
                    if let Some(norm) = norms[i] {
                        for h in y.chunks_exact_mut(c.head_dim) {
                            head.copy_from_slice(h);
                            norm.forward_host_into(&head, h);
                        }
                    }
                }
            }
        };
        let scoring = Scoring {
            scale: c.scale,
            softcap: c.softcap,
        };
        let heads = cache.append_and_attend_host(
            layer,
            (&mut qy, &mut ky, &mut vy),
            shape,
            angles,
            mask.window,
            scoring,
            needs_prepare.then_some(&prepare as &crate::layers::kv_cache::PrepareRows<'_>),
        );
        let width = widths[0];
        let quantized = self
            .quantize
            .then(|| Q8Rows::new(&heads, self.rows(), width));
        Arc::new(HostRows {
            data: heads,
            width,
            quantized,
        })
    }

    fn gated(&mut self, act: MlpActivation, gate: HostProduct, up: HostProduct) -> Arc<HostRows> {
        self.activated(act, gate, Some(up))
    }

    fn activate(&mut self, act: MlpActivation, up: HostProduct) -> Arc<HostRows> {
        self.activated(act, up, None)
    }

    fn residual(
        &mut self,
        x: Arc<HostRows>,
        y: HostProduct,
        post: Option<&Norm<B>>,
        norm: &Norm<B>,
    ) -> (Arc<HostRows>, Arc<HostRows>) {
        let mut x = take_rows(x);
        let width = x.width;
        let (mut yv, owed) = (y.y, y.owed);
        let mut n = vec![0.0f32; x.data.len()];
        let mut quantized = self.quantized_room(width);
        per_row(
            self.rows(),
            [&mut x.data, &mut yv, &mut n],
            quantized.as_mut(),
            |row, [x, y, n], q| {
                self.settle(&owed, row, y);
                match post {
                    Some(p) => {
                        p.forward_host_into(y, n);
                        add_in_place(x, n);
                    }
                    None => add_in_place(x, y),
                }
                norm.forward_host_into(x, n);
                if let Some(q) = q {
                    q.fill(n);
                }
            },
        );
        x.quantized = None;
        let n = HostRows {
            data: n,
            width,
            quantized,
        };
        (Arc::new(x), Arc::new(n))
    }

    fn finish(self, normed: Arc<HostRows>) -> Result<Tensor<B, 3>, ModelError> {
        let n = take_rows(normed);
        Ok(Tensor::from_data(
            TensorData::new(n.data, [self.batch, self.seq, n.width]),
            &self.device,
        ))
    }
}

/// The rows themselves: moved out where `rows` is their only holder, else
/// their values copied (without the quantisation, which only products read).
fn take_rows(rows: Arc<HostRows>) -> HostRows {
    Arc::try_unwrap(rows).unwrap_or_else(|shared| HostRows {
        data: shared.data.clone(),
        width: shared.width,
        quantized: None,
    })
}

/// A row of each of `K` buffers, and of the quantised rows if any.
type RowParts<'a, const K: usize> = (usize, [&'a mut [f32]; K], Option<Q8Row<'a>>);

/// Runs `f(row, [row of each buffer], row of quantized)` for every row, in
/// one run of consecutive rows per thread: a product's update, a residual
/// add, a norm and a quantisation together in one parallel pass.
fn per_row<const K: usize>(
    rows: usize,
    buffers: [&mut [f32]; K],
    quantized: Option<&mut Q8Rows>,
    f: impl Fn(usize, [&mut [f32]; K], Option<&mut Q8Row<'_>>) + Sync,
) {
    // An empty buffer (no up projection beside an ungated MLP's) gives
    // every row an empty slice.
    let mut parts: Vec<_> = buffers
        .into_iter()
        .map(|b| {
            let width = b.len() / rows.max(1);
            (width > 0).then(|| b.chunks_exact_mut(width))
        })
        .collect();
    let mut quantized = quantized.map(|q| q.rows_mut());
    let all: Vec<RowParts<'_, K>> = (0..rows)
        .map(|row| {
            let bufs = std::array::from_fn(|i| match &mut parts[i] {
                Some(chunks) => chunks.next().expect("a row of each buffer"),
                None => &mut [][..],
            });
            let q = quantized
                .as_mut()
                .map(|q| q.next().expect("a quantised row"));
            (row, bufs, q)
        })
        .collect();
    let per = crate::runtime::rows_per_task(rows, rows > 1);
    let mut runs: Vec<Vec<RowParts<'_, K>>> = Vec::with_capacity(rows.div_ceil(per));
    let mut all = all.into_iter().peekable();
    while all.peek().is_some() {
        runs.push(all.by_ref().take(per).collect());
    }
    crate::runtime::for_each_task(runs, |_, run| {
        for (row, bufs, mut q) in run {
            f(row, bufs, q.as_mut());
        }
    });
}

/// `x += y`, elementwise (residual adds, biases).
fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

/// `g *= u`, elementwise (the gated MLP's product).
fn add_product_in_place(g: &mut [f32], u: &[f32]) {
    g.iter_mut().zip(u).for_each(|(g, u)| *g *= u);
}

/// GELU, tanh approximation, in f32 (as `gelu_pytorch_tanh`).
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// Exact GELU `x Φ(x)`, in f64 through the error function, rounded to f32.
fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))) as f32
}

#[cfg(test)]
mod tests;
