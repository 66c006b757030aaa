//! The host training step's block operations: [`BlockOps`] over host rows,
//! so that a training forward is the decoder's own block sequence
//! ([`privmix_models::decoder::Decoder::block_forward`], the one inference
//! runs), with what the backward pass needs kept on a tape; and one block's
//! backward pass, which walks that tape in reverse through the models'
//! backward kernels.
//!
//! Each product is the frozen weight's f32 product (`Ctx::frozen`; the
//! products of one input, such as the query, key and value projections',
//! run side by side) plus, per group of rows (`Group`), that group's LoRA
//! update after its dropout pass (`Ctx::lora_forward`); attention is causal inside each row of the chunk, with
//! no KV cache, its queries and keys rotated by the step's RoPE tables, and
//! every head's softmax probabilities kept. The operations run the Llama
//! family's block (the execution plan runs the host step on nothing else):
//! the fused query/key/value projection, an MLP without a gate, activations
//! other than SiLU and sandwich norms are refused.

use std::collections::HashMap;
use std::sync::Arc;

use burn::tensor::{Int, Tensor, module::embedding};
use privmix_models::cpu::strided::rows_per_task;
use privmix_models::error::ModelError;
use privmix_models::layers::{Attention, Linear, Norm, Site};
use privmix_models::ops::attention_backward::{causal_attention, causal_attention_backward};
use privmix_models::ops::{BlockOps, MlpActivation};
use privmix_models::runtime::to_vec;
use privmix_models::{Llama, Projection};
use rayon::prelude::*;

use super::chunk::{Ctx, LoraSaved};
use super::kernels::{StepRope, rms_norm_backward, silu_gated, silu_gated_backward};
use super::pool::Pool;
use super::weights::PROJECTIONS;
use privmix_models::ModelBackend;

/// Rows of activations of a chunk, `[tokens, width]` row-major, shared
/// between the block sequence and the tape.
pub(super) type Rows = Arc<Vec<f32>>;

/// A projection's output (bias and LoRA update added), with its site.
pub(super) struct Product {
    y: Vec<f32>,
    site: Site,
}

/// What one block's forward pass keeps, as its operations ran.
#[derive(Default)]
struct Tape {
    /// Each projection's input (the projections of one input share it).
    inputs: HashMap<Projection, Rows>,
    /// Each targeted projection's adapter values.
    lora: HashMap<Projection, LoraSaved>,
    /// The residual stream each residual add added to, by the projection
    /// whose output it added.
    residual_in: HashMap<Projection, Rows>,
    /// The rotated queries and keys, the values and the softmax
    /// probabilities.
    attention: Option<[Vec<f32>; 4]>,
    /// The gate's and the up projection's outputs.
    gated: Option<[Vec<f32>; 2]>,
}

/// One block's tape, in the order its backward pass reads it.
pub(super) struct Saved {
    x: Vec<f32>,
    n1: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    probs: Vec<f32>,
    attn: Vec<f32>,
    x2: Vec<f32>,
    n2: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    lora: HashMap<Projection, LoraSaved>,
}

/// `rows`' values, moved out where nothing else holds them (else copied).
fn unshared(rows: Rows) -> Vec<f32> {
    Arc::try_unwrap(rows).unwrap_or_else(|shared| shared.as_ref().clone())
}

/// Gives `rows` back to the pool where nothing else holds them.
pub(super) fn release(rows: Rows, pool: &mut Pool) {
    if let Ok(v) = Arc::try_unwrap(rows) {
        pool.give(v);
    }
}

/// The invariant every refusal below rests on.
const LLAMA_ONLY: &str = "the host training step runs Llama-family decoders only \
     (separate q/k/v, SiLU-gated MLP, RMSNorm pre-norms; the execution plan's host_training)";

/// The block operations of one chunk of a host training step, keeping a
/// tape of the block they run when asked to.
pub(super) struct TrainOps<'a> {
    ctx: &'a Ctx<'a>,
    rope: &'a StepRope<'a>,
    pool: &'a mut Pool,
    tape: Option<Tape>,
}

impl<'a> TrainOps<'a> {
    /// The operations of chunk `ctx` (its RoPE tables `rope`), keeping a
    /// tape with `keep` (one block's: see [`TrainOps::into_saved`]).
    pub fn new(ctx: &'a Ctx<'a>, rope: &'a StepRope<'a>, pool: &'a mut Pool, keep: bool) -> Self {
        Self {
            ctx,
            rope,
            pool,
            tape: keep.then(Tape::default),
        }
    }

    /// The tape of the one block these operations ran.
    ///
    /// # Panics
    /// Where they kept none, or the block was not a Llama-family block.
    pub(super) fn into_saved(self) -> Saved {
        let mut t = self.tape.expect("operations that keep a tape");
        // The query, key and value projections share their input, as do
        // the gate and up projections: one reference each is kept.
        for p in [Projection::K, Projection::V, Projection::Up] {
            t.inputs.remove(&p).expect(LLAMA_ONLY);
        }
        let mut input = |p| unshared(t.inputs.remove(&p).expect(LLAMA_ONLY));
        let (n1, attn) = (input(Projection::Q), input(Projection::O));
        let (n2, act) = (input(Projection::Gate), input(Projection::Down));
        let mut residual = |p| unshared(t.residual_in.remove(&p).expect(LLAMA_ONLY));
        let (x, x2) = (residual(Projection::O), residual(Projection::Down));
        let [q, k, v, probs] = t.attention.expect(LLAMA_ONLY);
        let [gate, up] = t.gated.expect(LLAMA_ONLY);
        Saved {
            x,
            n1,
            q,
            k,
            v,
            probs,
            attn,
            x2,
            n2,
            gate,
            up,
            act,
            lora: t.lora,
        }
    }

    /// RMSNorm of `x`'s rows by `norm`'s host form, rows split over rayon's
    /// threads as the step's other row passes are.
    fn normed<B: ModelBackend>(&mut self, norm: &Norm<B>, x: &[f32]) -> Rows {
        assert!(norm.as_rms().is_some(), "{LLAMA_ONLY}");
        let width = x.len() / self.ctx.tokens.max(1);
        let per = rows_per_task(self.ctx.tokens) * width.max(1);
        let mut out = self.pool.take_for_overwrite(x.len());
        out.par_chunks_mut(per)
            .zip(x.par_chunks(per))
            .for_each(|(o, x)| norm.forward_host_into(x, o));
        Arc::new(out)
    }
}

impl<B: ModelBackend> BlockOps<B> for TrainOps<'_> {
    type Rows = Rows;
    type Product = Product;
    /// Nothing: attention is causal inside each row of the chunk, rotated
    /// by the step's own RoPE tables.
    type Context<'c> = ();

    fn embed(
        &mut self,
        table: &Tensor<B, 2>,
        ids: Tensor<B, 2, Int>,
        scale: Option<f32>,
        positions: Option<(&Tensor<B, 2>, Tensor<B, 2, Int>)>,
    ) -> Result<Rows, ModelError> {
        let mut data = to_vec(embedding(table.clone(), ids))?;
        if let Some(s) = scale {
            data.iter_mut().for_each(|x| *x *= s);
        }
        if let Some((table, at)) = positions {
            let learned = to_vec(embedding(table.clone(), at))?;
            data.iter_mut().zip(learned).for_each(|(x, p)| *x += p);
        }
        Ok(Arc::new(data))
    }

    fn norm(&mut self, norm: &Norm<B>, x: &Rows) -> Rows {
        self.normed(norm, x)
    }

    fn project<const N: usize>(
        &mut self,
        x: &Rows,
        projections: [(&Linear<B>, Site); N],
    ) -> [Product; N] {
        let ctx = self.ctx;
        let lins = projections.map(|(linear, site)| {
            let lin = ctx.projection(site);
            assert_eq!(
                (linear.in_features(), linear.out_features()),
                (lin.fan_in, lin.fan_out),
                "the host copy of the projection at {site:?}"
            );
            lin
        });
        let mut ys = lins.map(|lin| self.pool.take_for_overwrite(ctx.tokens * lin.fan_out));
        // The frozen products of this input side by side, each split over
        // rayon's threads as it would be alone (the same calls, so the same
        // bits): one join for all of them rather than one each, and a
        // thread done with its part of one takes a part of another.
        lins[..]
            .par_iter()
            .zip(ys[..].par_iter_mut())
            .for_each(|(lin, y)| Ctx::frozen(ctx.tokens, lin, x, y));
        let mut ys = ys.into_iter();
        projections.map(|(_, site)| {
            let mut y = ys.next().expect("one output per projection");
            let lora = ctx.lora_forward(site, x, &mut y, self.pool);
            match &mut self.tape {
                Some(tape) => {
                    tape.inputs.insert(site.module, Arc::clone(x));
                    if let Some(l) = lora {
                        tape.lora.insert(site.module, l);
                    }
                }
                None => {
                    if let Some(l) = lora {
                        l.give(self.pool);
                    }
                }
            }
            Product { y, site }
        })
    }

    fn split<const N: usize>(&mut self, _fused: Product, _widths: [usize; N]) -> [Product; N] {
        panic!("{LLAMA_ONLY}: no fused query/key/value projection");
    }

    fn attend(
        &mut self,
        attn: &Attention<B>,
        _layer: usize,
        [q, k, v]: [Product; 3],
        (): (),
    ) -> Rows {
        assert!(
            attn.q_norm.is_none() && attn.k_norm.is_none(),
            "{LLAMA_ONLY}: no q/k norms"
        );
        let shape = self.ctx.attention_shape();
        let c = &attn.config;
        assert_eq!(
            (c.num_heads, c.num_kv_heads, c.head_dim),
            (shape.heads, shape.kv_heads, shape.head_dim),
            "the host copy's attention shape"
        );
        let (mut q, mut k, v) = (q.y, k.y, v.y);
        self.rope.apply(&mut q, shape.heads, false);
        self.rope.apply(&mut k, shape.kv_heads, false);
        let (rows, seq) = (self.ctx.rows, self.ctx.seq);
        let mut probs = self.pool.take_for_overwrite(rows * shape.heads * seq * seq);
        let mut out = self
            .pool
            .take_for_overwrite(self.ctx.tokens * shape.heads * shape.head_dim);
        causal_attention(shape, &q, &k, &v, &mut probs, &mut out);
        match &mut self.tape {
            Some(tape) => tape.attention = Some([q, k, v, probs]),
            None => [q, k, v, probs].into_iter().for_each(|b| self.pool.give(b)),
        }
        Arc::new(out)
    }

    fn gated(&mut self, act: MlpActivation, gate: Product, up: Product) -> Rows {
        assert_eq!(act, MlpActivation::Silu, "{LLAMA_ONLY}");
        let mut out = self.pool.take_for_overwrite(gate.y.len());
        silu_gated(&gate.y, &up.y, &mut out);
        match &mut self.tape {
            Some(tape) => tape.gated = Some([gate.y, up.y]),
            None => [gate.y, up.y].into_iter().for_each(|b| self.pool.give(b)),
        }
        Arc::new(out)
    }

    fn activate(&mut self, _act: MlpActivation, _up: Product) -> Rows {
        panic!("{LLAMA_ONLY}: no MLP without a gate");
    }

    fn residual(
        &mut self,
        x: Rows,
        y: Product,
        post: Option<&Norm<B>>,
        norm: &Norm<B>,
    ) -> (Rows, Rows) {
        assert!(post.is_none(), "{LLAMA_ONLY}: no sandwich norms");
        let Product { y: mut sum, site } = y;
        sum.par_chunks_mut(ELEMENTS_PER_TASK)
            .zip(x.par_chunks(ELEMENTS_PER_TASK))
            .for_each(|(s, x)| s.iter_mut().zip(x).for_each(|(s, x)| *s += x));
        match &mut self.tape {
            Some(tape) => {
                tape.residual_in.insert(site.module, x);
            }
            None => release(x, self.pool),
        }
        let n = self.normed(norm, &sum);
        (Arc::new(sum), n)
    }

    fn finish(self, _normed: Rows) -> Result<Tensor<B, 3>, ModelError> {
        Err(ModelError::bad_input(
            "the host training step ends in its own head and cross-entropy, not in hidden states",
        ))
    }
}

/// Elements per parallel task of the residual add.
const ELEMENTS_PER_TASK: usize = 1 << 14;

/// The decoder whose block sequence a host training step runs, its backend
/// erased: the host copy of the model keeps one (`HostModel`).
pub(super) trait TrainingBlocks: Send + Sync + std::fmt::Debug {
    /// `norm(x)` by block `layer`'s input norm (the final norm past the
    /// last block).
    fn input_norm(&self, ops: &mut TrainOps<'_>, layer: usize, x: &Rows) -> Rows;

    /// Block `layer`'s forward from its input `x` and normed input `n`: its
    /// output and that output normed by the next norm
    /// ([`privmix_models::decoder::Decoder::block_forward`]).
    fn forward(&self, ops: &mut TrainOps<'_>, layer: usize, x: Rows, n: Rows) -> (Rows, Rows);
}

impl<B: ModelBackend> TrainingBlocks for Llama<B>
where
    Llama<B>: Send + Sync,
{
    fn input_norm(&self, ops: &mut TrainOps<'_>, layer: usize, x: &Rows) -> Rows {
        BlockOps::<B>::norm(ops, self.input_norm(layer), x)
    }

    fn forward(&self, ops: &mut TrainOps<'_>, layer: usize, x: Rows, n: Rows) -> (Rows, Rows) {
        self.block_forward(ops, layer, x, n, ())
    }
}

impl Ctx<'_> {
    /// The backward pass of block `layer` from `dx` (the gradient of its
    /// output) to the gradient of its input (not formed for layer 0, where
    /// nothing below needs it; the buffer is returned as it is).
    pub(super) fn block_backward(
        &self,
        layer: usize,
        s: Saved,
        mut dx: Vec<f32>,
        tables: &StepRope<'_>,
        grads: &mut [Vec<f32>],
        pool: &mut Pool,
    ) -> Vec<f32> {
        let m = self.m;
        let blk = &m.blocks[layer];
        let (h, n, hd) = (m.hidden, self.tokens, m.head_dim);
        let (qw, kw) = (m.heads * hd, m.kv_heads * hd);
        let site = |module| Site { layer, module };
        let Saved {
            x,
            n1,
            q,
            k,
            v,
            probs,
            attn,
            x2,
            n2,
            mut gate,
            mut up,
            act,
            lora,
        } = s;
        let inter = blk.proj[4].fan_out;
        // MLP: down, SiLU-gated product, gate and up.
        let mut dact = pool.take_for_overwrite(n * inter);
        self.project_back(&blk.proj[6], &dx, &mut dact, false);
        if let Some(l) = lora.get(&Projection::Down) {
            self.lora_backward(
                site(Projection::Down),
                l,
                &act,
                &dx,
                Some(&mut dact),
                grads,
                pool,
            );
        }
        silu_gated_backward(&dact, &mut gate, &mut up);
        pool.give(dact);
        let mut dn2 = pool.take_for_overwrite(n * h);
        self.project_back(&blk.proj[4], &gate, &mut dn2, false);
        self.project_back(&blk.proj[5], &up, &mut dn2, true);
        for (i, dy) in [(4, &gate), (5, &up)] {
            if let Some(l) = lora.get(&PROJECTIONS[i]) {
                self.lora_backward(
                    site(PROJECTIONS[i]),
                    l,
                    &n2,
                    dy,
                    Some(&mut dn2),
                    grads,
                    pool,
                );
            }
        }
        rms_norm_backward(&x2, &blk.norm2, m.eps, &dn2, &mut dx);
        pool.give(dn2);
        // Attention: o, softmax, RoPE, q/k/v.
        let mut da = pool.take_for_overwrite(n * qw);
        self.project_back(&blk.proj[3], &dx, &mut da, false);
        if let Some(l) = lora.get(&Projection::O) {
            self.lora_backward(
                site(Projection::O),
                l,
                &attn,
                &dx,
                Some(&mut da),
                grads,
                pool,
            );
        }
        let mut dq = pool.take_for_overwrite(n * qw);
        let mut dk = pool.take_for_overwrite(n * kw);
        let mut dv = pool.take_for_overwrite(n * kw);
        causal_attention_backward(
            self.attention_shape(),
            (&q, &k, &v, &probs),
            &da,
            &mut dq,
            &mut dk,
            &mut dv,
        );
        pool.give(da);
        tables.apply(&mut dq, m.heads, true);
        tables.apply(&mut dk, m.kv_heads, true);
        let need_dx = layer > 0;
        let mut dn1 = pool.take_for_overwrite(if need_dx { n * h } else { 0 });
        if need_dx {
            self.project_back(&blk.proj[0], &dq, &mut dn1, false);
            self.project_back(&blk.proj[1], &dk, &mut dn1, true);
            self.project_back(&blk.proj[2], &dv, &mut dn1, true);
        }
        for (i, dy) in [(0, &dq), (1, &dk), (2, &dv)] {
            if let Some(l) = lora.get(&PROJECTIONS[i]) {
                let dx1 = need_dx.then_some(dn1.as_mut_slice());
                self.lora_backward(site(PROJECTIONS[i]), l, &n1, dy, dx1, grads, pool);
            }
        }
        if need_dx {
            rms_norm_backward(&x, &blk.norm1, m.eps, &dn1, &mut dx);
        }
        for b in [
            dn1, dq, dk, dv, x, n1, q, k, v, probs, attn, x2, n2, gate, up, act,
        ] {
            pool.give(b);
        }
        for (_, l) in lora {
            pool.give(l.xa);
            for b in [l.dropped, l.mask].into_iter().flatten() {
                pool.give(b);
            }
        }
        dx
    }
}
