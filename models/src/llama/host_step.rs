//! A Llama forward step of a few new tokens per row (decoding) held in host
//! memory from the embedding to the final norm, on plain burn-flex.
//!
//! Why: on that path every product, LoRA update and attention already runs
//! on host vectors; what was left in burn's ops (the norms, the residual
//! adds, the activation, reshapes, and the copies into and out of tensors
//! around each of them) ran on one thread while the pool's other thread
//! waited. In a SmolLM2 decode step with the N = 8 ensemble's nine rows,
//! measured with `perf`, that serial remainder was about a quarter of the
//! step.
//!
//! A block is seven parallel passes:
//! 1. the query, key and value products (one region, `x` quantised once);
//! 2. per run of rows: their LoRA updates, rotation, cache append and
//!    attention;
//! 3. the output product;
//! 4. per run of rows: its update, the residual add, the MLP's norm and its
//!    quantisation;
//! 5. the gate and up products;
//! 6. per run of rows: their updates, `SiLU(gate)·up` and its quantisation;
//! 7. the down product, then per run of rows its update, the residual add
//!    and the next block's norm and quantisation (the final norm after the
//!    last block).
//!
//! Updates go inside the per-row passes when the delta has a per-row host
//! form ([`LinearDelta::has_host_rows`]); any other delta is added after
//! each product for all rows at once.
//!
//! Same computation as [`Llama`]'s tensor path, step for step: each norm
//! by `RmsNorm::forward_host_into`, the products by the quantised kernels,
//! rotation, cache append and attention by the host code the tensor path's
//! host attention calls. Only the order of f32 sums may differ (tested
//! against the tensor path in `tests/llama_host_step.rs`).

use burn::tensor::{Tensor, TensorData, backend::Backend, module::embedding};

use super::Llama;
use crate::cpu::{Q8Row, Q8Rows};
use crate::error::ModelError;
use crate::layers::kv_cache::{HOST_QUERIES_MAX, HostShape};
use crate::layers::{KvCache, Linear, LinearDelta, Projection, RmsNorm, Scoring, Site};
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
        let rows = b * s;
        let Step { ids, positions } = start_step(self, batch, cache)?;
        let angles = self.rope.angles::<B>(&positions, &self.device);
        let shape = HostShape {
            batch: b,
            seq: s,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };
        let (h, wide) = (c.hidden_size, c.intermediate_size);
        let heads_width = c.num_attention_heads * c.head_dim;
        // A delta with a per-row host form is added inside the per-row
        // passes; any other after each product, for all rows at once.
        let (by_row, at_once) = match delta {
            Some(d) if d.has_host_rows() => (Some(d), None),
            d => (None, d),
        };
        let add_at_once = |sites: &[Site], x: &[f32], ys: &mut [Vec<f32>]| {
            if let Some(d) = at_once {
                Linear::add_deltas(sites, x, [b, s], d, &self.device, ys);
            }
        };

        let mut x = to_vec(embedding(self.embed_tokens.clone(), ids))?;
        // `n`: the normed residual stream, the next products' input; `nq`:
        // the same quantised, where those products take 8-bit input.
        let mut n = vec![0.0f32; rows * h];
        let first = &self.layers[0];
        let mut nq = quantized_for(&qkv_of(&first.attn), rows, h);
        per_row(rows, [&mut x, &mut n], nq.as_mut(), |_, [x, n], q| {
            first.input_layernorm.forward_host_into(x, n);
            if let Some(q) = q {
                q.fill(n);
            }
        });
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let (attn, mlp) = (&block.attn, &block.mlp);

            // Attention: the three products in one region, then per run of
            // rows their updates, rotation, cache append and attention.
            let mut qkv_out = base_products(qkv_of(attn), &n, rows, nq.as_ref());
            let qkv_sites = [
                site(Projection::Q),
                site(Projection::K),
                site(Projection::V),
            ];
            add_at_once(&qkv_sites, &n, &mut qkv_out);
            let [mut q, mut k, mut v] = qkv_out;
            let widths = [q.len() / rows, k.len() / rows, v.len() / rows];
            let prepare = |first: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]| {
                let Some(d) = by_row else { return };
                let runs = q
                    .chunks_exact_mut(widths[0])
                    .zip(k.chunks_exact_mut(widths[1]))
                    .zip(v.chunks_exact_mut(widths[2]));
                for (j, ((q, k), v)) in runs.enumerate() {
                    let row = first * s + j;
                    let x = &n[row * h..][..h];
                    for (y, site) in [q, k, v].into_iter().zip(qkv_sites) {
                        d.add_host_row(site, row / s, x, y);
                    }
                }
            };
            let scoring = Scoring {
                scale: attn.config.scale,
                softcap: attn.config.softcap,
            };
            let heads = cache.append_and_attend_host(
                i,
                (&mut q, &mut k, &mut v),
                shape,
                Some(&angles),
                None,
                scoring,
                Some(&prepare),
            );

            // The output projection, then per row: its update, the residual
            // add, the MLP's norm (and its quantisation).
            let hq = attn
                .o_proj
                .host_takes_int8()
                .then(|| Q8Rows::new(&heads, rows, heads_width));
            let mut o = base_products([&attn.o_proj], &heads, rows, hq.as_ref());
            add_at_once(&[site(Projection::O)], &heads, &mut o);
            let [mut o] = o;
            let mut n2 = vec![0.0f32; rows * h];
            let mut nq2 = quantized_for(&[&mlp.gate, &mlp.up], rows, h);
            residual_pass(
                (by_row, site(Projection::O), &heads),
                [s, rows],
                [&mut x, &mut o, &mut n2],
                &block.post_attention_layernorm,
                nq2.as_mut(),
            );

            // Gate and up in one region, then per row: their updates and
            // SiLU(gate)·up (and its quantisation).
            let mut gu = base_products([&mlp.gate, &mlp.up], &n2, rows, nq2.as_ref());
            let gu_sites = [site(Projection::Gate), site(Projection::Up)];
            add_at_once(&gu_sites, &n2, &mut gu);
            let [mut gate, mut up] = gu;
            let mut gq = quantized_for(&[&mlp.down], rows, wide);
            per_row(rows, [&mut gate, &mut up], gq.as_mut(), |row, [g, u], q| {
                if let Some(d) = by_row {
                    let x = &n2[row * h..][..h];
                    d.add_host_row(gu_sites[0], row / s, x, g);
                    d.add_host_row(gu_sites[1], row / s, x, u);
                }
                crate::cpu::vexp::silu_in_place(g);
                g.iter_mut().zip(u.iter()).for_each(|(g, u)| *g *= u);
                if let Some(q) = q {
                    q.fill(g);
                }
            });

            // Down, then per row: its update, the residual add and the next
            // block's norm (the final norm after the last block).
            let mut down = base_products([&mlp.down], &gate, rows, gq.as_ref());
            add_at_once(&[site(Projection::Down)], &gate, &mut down);
            let [mut down] = down;
            let norm = match self.layers.get(i + 1) {
                Some(next) => {
                    nq = quantized_for(&qkv_of(&next.attn), rows, h);
                    &next.input_layernorm
                }
                None => {
                    nq = None;
                    &self.norm
                }
            };
            residual_pass(
                (by_row, site(Projection::Down), &gate),
                [s, rows],
                [&mut x, &mut down, &mut n],
                norm,
                nq.as_mut(),
            );
        }
        Ok(Tensor::from_data(
            TensorData::new(n, [b, s, c.hidden_size]),
            &self.device,
        ))
    }
}

/// The per-row pass after a product `y` that feeds the residual stream `x`
/// (all `[rows, hidden]`): the update at `site` of `input` (the product's
/// input, `[rows, width]`) where added by row, `x += y`, then `norm(x)`
/// into `n` and, where the next products take 8-bit input, into `nq`.
fn residual_pass<B: Backend>(
    (by_row, site, input): (Option<&dyn LinearDelta<B>>, Site, &[f32]),
    [seq, rows]: [usize; 2],
    buffers: [&mut [f32]; 3],
    norm: &RmsNorm<B>,
    nq: Option<&mut Q8Rows>,
) {
    let width = input.len() / rows.max(1);
    per_row(rows, buffers, nq, |row, [x, y, n], q| {
        if let Some(d) = by_row {
            d.add_host_row(site, row / seq, &input[row * width..][..width], y);
        }
        add_in_place(x, y);
        norm.forward_host_into(x, n);
        if let Some(q) = q {
            q.fill(n);
        }
    });
}

/// [`Linear::host_base_products`] of projections checked `host_ready` by
/// [`Llama::forward_hidden_host`].
fn base_products<B: Backend, const N: usize>(
    projections: [&Linear<B>; N],
    x: &[f32],
    rows: usize,
    quantized: Option<&Q8Rows>,
) -> [Vec<f32>; N] {
    Linear::host_base_products(projections, x, rows, quantized)
        .expect("host_ready checked by forward_hidden_host")
}

/// A block's query, key and value projections.
fn qkv_of<B: Backend>(a: &crate::layers::Attention<B>) -> [&Linear<B>; 3] {
    [&a.q_proj, &a.k_proj, &a.v_proj]
}

/// Room for `rows` quantised rows of width `width`, where any of
/// `projections` takes 8-bit activations.
fn quantized_for<B: Backend>(
    projections: &[&Linear<B>],
    rows: usize,
    width: usize,
) -> Option<Q8Rows> {
    projections
        .iter()
        .any(|p| p.host_takes_int8())
        .then(|| Q8Rows::zeroed(rows, width))
}

/// A row of each of `K` buffers, and of the quantised rows if any.
type RowParts<'a, const K: usize> = (usize, [&'a mut [f32]; K], Option<Q8Row<'a>>);

/// Runs `f(row, [row of each buffer], row of quantized)` for every row, in
/// one run of consecutive rows per thread: the decode
/// step's per-row passes, each a product's update, a residual add, a norm
/// and a quantisation together where they were one serial step each.
fn per_row<const K: usize>(
    rows: usize,
    buffers: [&mut [f32]; K],
    quantized: Option<&mut Q8Rows>,
    f: impl Fn(usize, [&mut [f32]; K], Option<&mut Q8Row<'_>>) + Sync,
) {
    let mut parts: Vec<_> = buffers
        .into_iter()
        .map(|b| {
            let width = b.len() / rows.max(1);
            b.chunks_exact_mut(width.max(1))
        })
        .collect();
    let mut quantized = quantized.map(|q| q.rows_mut());
    let all: Vec<RowParts<'_, K>> = (0..rows)
        .map(|row| {
            let bufs = std::array::from_fn(|i| parts[i].next().expect("a row of each buffer"));
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

/// `x += y`, elementwise (the residual adds).
fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}
