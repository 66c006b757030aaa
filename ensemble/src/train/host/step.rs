//! The host step itself: forward with saved activations, cross-entropy, and
//! the backward pass to the LoRA factors (see the module docs of `host`).
//!
//! A step's rows are split into [`Group`]s, each with its own adapter, its
//! own dropout pass and its own mean loss and gradient: one group for a
//! trainer's batch, one per example for DP-SGD, one per member when several
//! members train together. The rows run in chunks whose activations fit the
//! model's activation budget (see [`HostLlama::activation_budget`]); where
//! even one row's saved activations do not, only each layer's input is kept
//! and the layer's forward pass is run again in the backward pass (gradient
//! checkpointing, "Training Deep Nets with Sublinear Memory Cost",
//! arXiv 1604.06174). Chunking and recomputation change the order of no
//! sum inside a row, only which rows share a product.

use std::collections::HashMap;
use std::ops::Range;

use privmix_models::cpu::vexp::exp_shifted_in_place;
use privmix_models::{Projection, Site};
use rayon::prelude::*;

use privmix_models::cpu::strided::{Mat, matmul};
use privmix_models::ops::attention_backward::{
    CausalShape, causal_attention, causal_attention_backward,
};

use super::kernels::{StepRope, rms_norm, rms_norm_backward, silu_gated, silu_gated_backward};
use super::weights::{HostLinear, HostLlama, PROJECTIONS};
use crate::train::error::TrainError;
use crate::train::params::{LoraParams, SiteLayout};
use crate::train::trainable::{Dropout, dropout_mask};

pub(crate) use super::pool::Pool;

/// Tokens whose logits are formed at a time (`HEAD_TOKENS × vocab` floats).
const HEAD_TOKENS: usize = 256;

/// Tokens per chunk at most when layers are recomputed (the products run as
/// fast on this many rows as on more).
const RECOMPUTE_TOKENS: usize = 2048;

/// One gradient group of a host step: `rows` consecutive blocks through one
/// adapter, with one dropout pass over them (its mask laid out over the
/// group's `[rows, seq, width]` as [`dropout_mask`] draws it), and one mean
/// loss and gradient.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group<'a> {
    /// The adapter of the group's rows.
    pub params: &'a LoraParams,
    /// How many consecutive blocks.
    pub rows: usize,
    /// The dropout pass (`None`, or one with `p > 0`).
    pub dropout: Option<Dropout>,
}

impl<'a> Group<'a> {
    /// A group of `rows` blocks through `params`; a pass with `p = 0` is none.
    pub fn new(params: &'a LoraParams, rows: usize, dropout: Option<Dropout>) -> Self {
        Self {
            params,
            rows,
            dropout: dropout.filter(|d| d.p > 0.0),
        }
    }
}

/// The rows of one group inside a chunk.
struct Segment {
    /// Index into the step's groups.
    group: usize,
    /// The rows, counted in the chunk.
    rows: Range<usize>,
    /// The first row's index inside its group.
    group_row: usize,
}

/// What the forward pass keeps of one LoRA site for the backward pass.
struct LoraSaved {
    /// The adapter's input after dropout (`None`: no dropout, the
    /// projection's input itself).
    dropped: Option<Vec<f32>>,
    /// The mask (with dropout).
    mask: Option<Vec<f32>>,
    /// `x̃ · A`, `[tokens, r]`.
    xa: Vec<f32>,
}

/// What the forward pass keeps of one block.
struct Saved {
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

impl Saved {
    fn give(self, pool: &mut Pool) {
        for b in [
            self.x, self.n1, self.q, self.k, self.v, self.probs, self.attn, self.x2, self.n2,
            self.gate, self.up, self.act,
        ] {
            pool.give(b);
        }
        for (_, l) in self.lora {
            pool.give(l.xa);
            for b in [l.dropped, l.mask].into_iter().flatten() {
                pool.give(b);
            }
        }
    }
}

/// What a step shares across its chunks.
struct Step<'a> {
    m: &'a HostLlama,
    seq: usize,
    r: usize,
    scale: f32,
    layouts: HashMap<Site, SiteLayout>,
    groups: &'a [Group<'a>],
}

/// One chunk's shapes and groups.
struct Ctx<'a> {
    m: &'a HostLlama,
    rows: usize,
    seq: usize,
    tokens: usize,
    r: usize,
    scale: f32,
    layouts: &'a HashMap<Site, SiteLayout>,
    groups: &'a [Group<'a>],
    segments: Vec<Segment>,
}

impl HostLlama {
    /// Each group's mean loss and LoRA gradient on `blocks` (all of one
    /// length ≥ 2; the groups' rows in order, covering every block): the
    /// loss of a group is the mean next-token loss over its rows' predicted
    /// positions (what [`super::super::mean_nll`] computes on them through
    /// its adapter), the gradient that of its own adapter's factors.
    pub(crate) fn losses_and_gradients(
        &self,
        blocks: &[&Vec<u32>],
        groups: &[Group<'_>],
    ) -> Result<Vec<(f64, Vec<f32>)>, TrainError> {
        let step = self.plan(blocks, groups)?;
        let len = groups[0].params.len();
        let mut grads: Vec<Vec<f32>> = groups.iter().map(|_| vec![0.0f32; len]).collect();
        let losses = self.with_pool(|pool| step.run(blocks, Some(&mut grads), pool));
        Ok(losses.into_iter().zip(grads).collect())
    }

    /// Each group's mean loss on `blocks` (as
    /// [`HostLlama::losses_and_gradients`], forward only; the groups'
    /// dropout passes are applied).
    pub(crate) fn losses(
        &self,
        blocks: &[&Vec<u32>],
        groups: &[Group<'_>],
    ) -> Result<Vec<f64>, TrainError> {
        let step = self.plan(blocks, groups)?;
        Ok(self.with_pool(|pool| step.run(blocks, None, pool)))
    }

    /// Rows per chunk and whether layers are recomputed, for `blocks` in `groups`.
    #[cfg(test)]
    pub(super) fn chunking_of(
        &self,
        blocks: &[&Vec<u32>],
        groups: &[Group<'_>],
    ) -> Result<(usize, bool), TrainError> {
        Ok(self.plan(blocks, groups)?.chunking(blocks.len()))
    }

    fn with_pool<T>(&self, f: impl FnOnce(&mut Pool) -> T) -> T {
        let mut pool = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|e| e.into_inner()));
        let out = f(&mut pool);
        *self.pool.lock().unwrap_or_else(|e| e.into_inner()) = pool;
        out
    }

    /// Checks the blocks and groups.
    fn plan<'a>(
        &'a self,
        blocks: &[&Vec<u32>],
        groups: &'a [Group<'a>],
    ) -> Result<Step<'a>, TrainError> {
        let len = blocks.first().map_or(0, |b| b.len());
        if len < 2 || blocks.iter().any(|b| b.len() != len) {
            return Err(TrainError::BadData(
                "the host step needs blocks of one length ≥ 2".into(),
            ));
        }
        let covered: usize = groups.iter().map(|g| g.rows).sum();
        if covered != blocks.len() || groups.iter().any(|g| g.rows == 0) {
            return Err(TrainError::BadData(format!(
                "{} groups of {covered} rows in all (none empty) for {} blocks",
                groups.len(),
                blocks.len()
            )));
        }
        let first = groups[0].params;
        if let Some(g) = groups.iter().find(|g| {
            let (a, b) = (g.params.config(), first.config());
            a.r != b.r || a.scale() != b.scale() || g.params.layout() != first.layout()
        }) {
            return Err(TrainError::BadData(format!(
                "adapters of different shapes in one step ({:?} and {:?})",
                first.config(),
                g.params.config()
            )));
        }
        if let Some(bad) = blocks
            .iter()
            .flat_map(|b| b.iter())
            .find(|&&t| t as usize >= self.vocab)
        {
            return Err(TrainError::BadData(format!(
                "token {bad} outside the vocabulary of {}",
                self.vocab
            )));
        }
        Ok(Step {
            m: self,
            seq: len - 1,
            r: first.config().r,
            scale: first.config().scale() as f32,
            layouts: first.layout().iter().map(|l| (l.site, *l)).collect(),
            groups,
        })
    }

    /// Floats one row of `seq` tokens keeps for the backward pass: every
    /// layer's saved activations (`full`), or only every layer's input plus
    /// one layer's saved activations (`checkpointed`).
    pub(super) fn row_floats(&self, seq: usize, lora_per_token: usize) -> (usize, usize) {
        let inter = self.blocks.first().map_or(0, |b| b.proj[4].fan_out);
        let (qw, kw) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let per_token = 4 * self.hidden + 2 * qw + 2 * kw + 3 * inter + self.heads * seq;
        let layer = seq * per_token + seq * lora_per_token / self.blocks.len().max(1);
        let layers = self.blocks.len();
        (layers * layer, layers * seq * self.hidden + layer)
    }
}

impl Step<'_> {
    /// Rows per chunk, and whether layers are recomputed (see the module docs).
    fn chunking(&self, rows: usize) -> (usize, bool) {
        let dropout = self.groups.iter().any(|g| g.dropout.is_some());
        let lora_per_token: usize = self
            .layouts
            .values()
            .map(|l| self.r + if dropout { 2 * l.fan_in } else { 0 })
            .sum();
        let (full, checkpointed) = self.m.row_floats(self.seq, lora_per_token);
        let budget = self.m.activation_budget / std::mem::size_of::<f32>();
        let (most, recompute) = if full * rows <= budget {
            (rows, false)
        } else if full <= budget {
            (budget / full, false)
        } else {
            // Rows beyond `RECOMPUTE_TOKENS` tokens make no product faster.
            let cap = (RECOMPUTE_TOKENS / self.seq).max(1);
            ((budget / checkpointed).clamp(1, cap), true)
        };
        // Chunks of even size: as few as the budget allows.
        let most = most.clamp(1, rows.max(1));
        (rows.div_ceil(rows.div_ceil(most).max(1)), recompute)
    }

    /// Runs every chunk; returns each group's mean loss, and adds each
    /// group's gradient into `grads` when given.
    fn run(
        &self,
        blocks: &[&Vec<u32>],
        mut grads: Option<&mut Vec<Vec<f32>>>,
        pool: &mut Pool,
    ) -> Vec<f64> {
        let (per_chunk, recompute) = self.chunking(blocks.len());
        let mut sums = vec![0.0f64; self.groups.len()];
        let mut first = 0;
        while first < blocks.len() {
            let end = (first + per_chunk).min(blocks.len());
            let ctx = self.chunk(first..end);
            let chunk = &blocks[first..end];
            match grads.as_deref_mut() {
                Some(g) => ctx.run(chunk, g, &mut sums, recompute, pool),
                None => ctx.forward_losses(chunk, &mut sums, pool),
            }
            first = end;
        }
        sums.iter()
            .zip(self.groups)
            .map(|(s, g)| s / (g.rows * self.seq) as f64)
            .collect()
    }

    /// The context of rows `rows` of the step.
    fn chunk(&self, rows: Range<usize>) -> Ctx<'_> {
        let mut segments = Vec::new();
        let mut g0 = 0;
        for (group, g) in self.groups.iter().enumerate() {
            let (start, end) = (rows.start.max(g0), rows.end.min(g0 + g.rows));
            if start < end {
                segments.push(Segment {
                    group,
                    rows: start - rows.start..end - rows.start,
                    group_row: start - g0,
                });
            }
            g0 += g.rows;
        }
        Ctx {
            m: self.m,
            rows: rows.len(),
            seq: self.seq,
            tokens: rows.len() * self.seq,
            r: self.r,
            scale: self.scale,
            layouts: &self.layouts,
            groups: self.groups,
            segments,
        }
    }
}

impl Ctx<'_> {
    /// The chunk's embedded inputs.
    fn embed(&self, blocks: &[&Vec<u32>], pool: &mut Pool) -> Vec<f32> {
        let (m, h) = (self.m, self.m.hidden);
        let table = m.embedding();
        let mut x = pool.take(self.tokens * h);
        for (row, b) in blocks.iter().enumerate() {
            for (i, &id) in b[..self.seq].iter().enumerate() {
                let at = (row * self.seq + i) * h;
                let id = id as usize;
                x[at..at + h].copy_from_slice(&table[id * h..(id + 1) * h]);
            }
        }
        x
    }

    /// Every token's group and loss weight `1 / (seq · group rows)`.
    fn token_groups(&self) -> (Vec<usize>, Vec<f32>) {
        let mut group = Vec::with_capacity(self.tokens);
        let mut weight = Vec::with_capacity(self.tokens);
        for s in &self.segments {
            let n = s.rows.len() * self.seq;
            group.extend(std::iter::repeat_n(s.group, n));
            let w = 1.0 / (self.seq * self.groups[s.group].rows) as f32;
            weight.extend(std::iter::repeat_n(w, n));
        }
        (group, weight)
    }

    /// The final norm's output `nf` through the head and the cross-entropy,
    /// `HEAD_TOKENS` tokens at a time: adds each token's loss into its
    /// group's sum and, with `dnf`, writes the gradient of `nf`.
    fn head(
        &self,
        blocks: &[&Vec<u32>],
        nf: &[f32],
        mut dnf: Option<&mut [f32]>,
        sums: &mut [f64],
        pool: &mut Pool,
    ) {
        let m = self.m;
        let (h, v) = (m.hidden, m.vocab);
        let targets: Vec<usize> = blocks
            .iter()
            .flat_map(|b| b[1..].iter().map(|&t| t as usize))
            .collect();
        let (group, weight) = self.token_groups();
        let mut first = 0;
        while first < self.tokens {
            let end = (first + HEAD_TOKENS).min(self.tokens);
            let n = end - first;
            let mut logits = pool.take(n * v);
            matmul(
                &mut logits,
                n,
                v,
                h,
                false,
                1.0,
                Mat::rows(&nf[first * h..end * h], h),
                Mat::rows(&m.head.w_t, v),
            );
            if let Some(bias) = &m.head.bias {
                logits.par_chunks_mut(v).for_each(|row| {
                    for (y, b) in row.iter_mut().zip(bias) {
                        *y += b;
                    }
                });
            }
            let loss = cross_entropy(&mut logits, v, &targets[first..end], &weight[first..end]);
            for (l, g) in loss.iter().zip(&group[first..end]) {
                sums[*g] += l;
            }
            if let Some(dnf) = dnf.as_deref_mut() {
                matmul(
                    &mut dnf[first * h..end * h],
                    n,
                    h,
                    v,
                    false,
                    1.0,
                    Mat::rows(&logits, v),
                    Mat::rows(m.head_w(), h),
                );
            }
            pool.give(logits);
            first = end;
        }
    }

    /// The chunk's losses only (nothing saved).
    fn forward_losses(&self, blocks: &[&Vec<u32>], sums: &mut [f64], pool: &mut Pool) {
        let m = self.m;
        let tables = StepRope::new(&m.rope, self.seq);
        let mut x = self.embed(blocks, pool);
        for layer in 0..m.blocks.len() {
            let (s, next) = self.block_forward(layer, x, &tables, pool);
            s.give(pool);
            x = next;
        }
        let mut nf = pool.take(self.tokens * m.hidden);
        rms_norm(&x, &m.norm, m.eps, &mut nf);
        self.head(blocks, &nf, None, sums, pool);
        pool.give(x);
        pool.give(nf);
    }

    /// The chunk's forward and backward passes: adds each token's loss into
    /// its group's sum and each group's gradient into `grads`; with
    /// `recompute`, only each layer's input is kept and the layer's forward
    /// pass runs again before its backward pass.
    fn run(
        &self,
        blocks: &[&Vec<u32>],
        grads: &mut [Vec<f32>],
        sums: &mut [f64],
        recompute: bool,
        pool: &mut Pool,
    ) {
        let m = self.m;
        let (h, n) = (m.hidden, self.tokens);
        let tables = StepRope::new(&m.rope, self.seq);
        let mut x = self.embed(blocks, pool);
        let mut saved = Vec::with_capacity(m.blocks.len());
        let mut inputs = Vec::with_capacity(m.blocks.len());
        for layer in 0..m.blocks.len() {
            if recompute {
                let mut keep = pool.take(n * h);
                keep.copy_from_slice(&x);
                let (s, next) = self.block_forward(layer, x, &tables, pool);
                s.give(pool);
                inputs.push(keep);
                x = next;
            } else {
                let (s, next) = self.block_forward(layer, x, &tables, pool);
                saved.push(s);
                x = next;
            }
        }
        // Final norm, head, cross-entropy.
        let mut nf = pool.take(n * h);
        rms_norm(&x, &m.norm, m.eps, &mut nf);
        let mut dnf = pool.take(n * h);
        self.head(blocks, &nf, Some(&mut dnf), sums, pool);
        let mut dx = pool.take(n * h);
        rms_norm_backward(&x, &m.norm, m.eps, &dnf, &mut dx);
        for b in [x, nf, dnf] {
            pool.give(b);
        }
        for layer in (0..m.blocks.len()).rev() {
            let s = if recompute {
                let input = inputs.pop().expect("one input per layer");
                let (s, out) = self.block_forward(layer, input, &tables, pool);
                pool.give(out);
                s
            } else {
                saved.pop().expect("one saved block per layer")
            };
            dx = self.block_backward(layer, s, dx, &tables, grads, pool);
        }
        pool.give(dx);
    }

    /// Each segment's token range in the chunk.
    fn tokens_of(&self, s: &Segment) -> Range<usize> {
        s.rows.start * self.seq..s.rows.end * self.seq
    }

    /// `out = input · W (+ bias)` for `out` sized `[tokens, fan_out]`, plus
    /// the adapter's `s · x̃ A B` at `site` when it has one, each segment's
    /// rows through its group's factors (returning what the backward pass
    /// needs).
    fn project(
        &self,
        lin: &HostLinear,
        site: Option<Site>,
        input: &[f32],
        out: &mut [f32],
        pool: &mut Pool,
    ) -> Option<LoraSaved> {
        let n = self.tokens;
        matmul(
            out,
            n,
            lin.fan_out,
            lin.fan_in,
            false,
            1.0,
            Mat::rows(input, lin.fan_in),
            Mat::rows(&lin.w_t, lin.fan_out),
        );
        if let Some(bias) = &lin.bias {
            out.par_chunks_mut(lin.fan_out).for_each(|row| {
                for (y, b) in row.iter_mut().zip(bias) {
                    *y += b;
                }
            });
        }
        let l = self.layouts.get(&site?)?;
        let (fan_in, fan_out, r) = (l.fan_in, l.fan_out, self.r);
        let dropout = self
            .segments
            .iter()
            .any(|s| self.groups[s.group].dropout.is_some());
        let (dropped, mask) = if dropout {
            let mut mask = pool.take(0);
            for s in &self.segments {
                let len = s.rows.len() * self.seq * fan_in;
                match &self.groups[s.group].dropout {
                    Some(d) => {
                        let skip = s.group_row * self.seq * fan_in;
                        mask.extend_from_slice(&dropout_mask(d, l.site, skip + len)[skip..]);
                    }
                    None => mask.extend(std::iter::repeat_n(1.0, len)),
                }
            }
            let mut dropped = pool.take(n * fan_in);
            for ((d, x), k) in dropped.iter_mut().zip(input).zip(&mask) {
                *d = x * k;
            }
            (Some(dropped), Some(mask))
        } else {
            (None, None)
        };
        let x_in = dropped.as_deref().unwrap_or(input);
        let mut xa = pool.take(n * r);
        for s in &self.segments {
            let (a, b) = self.groups[s.group].params.factors(l);
            let t = self.tokens_of(s);
            matmul(
                &mut xa[t.start * r..t.end * r],
                t.len(),
                r,
                fan_in,
                false,
                1.0,
                Mat::rows(&x_in[t.start * fan_in..t.end * fan_in], fan_in),
                Mat::rows(a, r),
            );
            matmul(
                &mut out[t.start * fan_out..t.end * fan_out],
                t.len(),
                fan_out,
                r,
                true,
                self.scale,
                Mat::rows(&xa[t.start * r..t.end * r], r),
                Mat::rows(b, fan_out),
            );
        }
        Some(LoraSaved { dropped, mask, xa })
    }

    /// The adapters' gradients at `site` given `dy` (the gradient of the
    /// projection's output) and its input `input`, each segment's added to
    /// its group's gradient in `grads`; and, with `dx`, the adapters' part
    /// of the input gradient added to it.
    #[allow(clippy::too_many_arguments)]
    fn lora_backward(
        &self,
        site: Site,
        saved: &LoraSaved,
        input: &[f32],
        dy: &[f32],
        mut dx: Option<&mut [f32]>,
        grads: &mut [Vec<f32>],
        pool: &mut Pool,
    ) {
        let Some(l) = self.layouts.get(&site) else {
            return;
        };
        let (n, r, s) = (self.tokens, self.r, self.scale);
        let (fan_in, fan_out) = (l.fan_in, l.fan_out);
        let x_in = saved.dropped.as_deref().unwrap_or(input);
        let mut dxa = pool.take(n * r);
        let mut through_a = match (&saved.mask, &dx) {
            (Some(_), Some(_)) => Some(pool.take(n * fan_in)),
            _ => None,
        };
        for seg in &self.segments {
            let (a, b) = self.groups[seg.group].params.factors(l);
            let t = self.tokens_of(seg);
            let dy_t = &dy[t.start * fan_out..t.end * fan_out];
            // dxa = s · dy Bᵀ.
            let dxa_t = &mut dxa[t.start * r..t.end * r];
            matmul(
                dxa_t,
                t.len(),
                r,
                fan_out,
                false,
                s,
                Mat::rows(dy_t, fan_out),
                Mat::transposed(b, fan_out),
            );
            let dxa_t = &dxa[t.start * r..t.end * r];
            // dB = s · (x̃A)ᵀ dy; dA = x̃ᵀ dxa.
            let grad = &mut grads[seg.group];
            matmul(
                &mut grad[l.b_offset..l.b_offset + r * fan_out],
                r,
                fan_out,
                t.len(),
                true,
                s,
                Mat::transposed(&saved.xa[t.start * r..t.end * r], r),
                Mat::rows(dy_t, fan_out),
            );
            matmul(
                &mut grad[l.a_offset..l.b_offset],
                fan_in,
                r,
                t.len(),
                true,
                1.0,
                Mat::transposed(&x_in[t.start * fan_in..t.end * fan_in], fan_in),
                Mat::rows(dxa_t, r),
            );
            // dx += dxa Aᵀ (masked with dropout).
            let target = match (&mut through_a, dx.as_deref_mut()) {
                (Some(tmp), _) => Some((&mut tmp[t.start * fan_in..t.end * fan_in], false)),
                (None, Some(dx)) => Some((&mut dx[t.start * fan_in..t.end * fan_in], true)),
                (None, None) => None,
            };
            if let Some((dst, accumulate)) = target {
                matmul(
                    dst,
                    t.len(),
                    fan_in,
                    r,
                    accumulate,
                    1.0,
                    Mat::rows(dxa_t, r),
                    Mat::transposed(a, r),
                );
            }
        }
        if let (Some(tmp), Some(mask), Some(dx)) = (through_a, &saved.mask, dx) {
            for ((d, t), k) in dx.iter_mut().zip(&tmp).zip(mask) {
                *d += t * k;
            }
            pool.give(tmp);
        }
        pool.give(dxa);
    }

    /// `dx (+)= dy · Wᵀ` through a frozen projection (`dx` sized
    /// `[tokens, fan_in]`).
    fn project_back(&self, lin: &HostLinear, dy: &[f32], dx: &mut [f32], accumulate: bool) {
        matmul(
            dx,
            self.tokens,
            lin.fan_in,
            lin.fan_out,
            accumulate,
            1.0,
            Mat::rows(dy, lin.fan_out),
            Mat::rows(lin.w.as_slice(), lin.fan_in),
        );
    }

    fn block_forward(
        &self,
        layer: usize,
        x: Vec<f32>,
        tables: &StepRope<'_>,
        pool: &mut Pool,
    ) -> (Saved, Vec<f32>) {
        let m = self.m;
        let blk = &m.blocks[layer];
        let (h, n, hd) = (m.hidden, self.tokens, m.head_dim);
        let (qw, kw) = (m.heads * hd, m.kv_heads * hd);
        let site = |module| Some(Site { layer, module });
        let mut lora = HashMap::new();
        let mut n1 = pool.take(n * h);
        rms_norm(&x, &blk.norm1, m.eps, &mut n1);
        let mut q = pool.take(n * qw);
        let mut k = pool.take(n * kw);
        let mut v = pool.take(n * kw);
        for (i, out) in [(0, &mut q), (1, &mut k), (2, &mut v)] {
            if let Some(s) = self.project(&blk.proj[i], site(PROJECTIONS[i]), &n1, out, pool) {
                lora.insert(PROJECTIONS[i], s);
            }
        }
        tables.apply(&mut q, m.heads, false);
        tables.apply(&mut k, m.kv_heads, false);
        let mut probs = pool.take(self.rows * m.heads * self.seq * self.seq);
        let mut attn = pool.take(n * qw);
        causal_attention(self.attention_shape(), &q, &k, &v, &mut probs, &mut attn);
        let mut o = pool.take(n * h);
        if let Some(s) = self.project(&blk.proj[3], site(Projection::O), &attn, &mut o, pool) {
            lora.insert(Projection::O, s);
        }
        let mut x2 = pool.take(n * h);
        for ((y, a), b) in x2.iter_mut().zip(&x).zip(&o) {
            *y = a + b;
        }
        pool.give(o);
        let mut n2 = pool.take(n * h);
        rms_norm(&x2, &blk.norm2, m.eps, &mut n2);
        let inter = blk.proj[4].fan_out;
        let mut gate = pool.take(n * inter);
        let mut up = pool.take(n * inter);
        for (i, out) in [(4, &mut gate), (5, &mut up)] {
            if let Some(s) = self.project(&blk.proj[i], site(PROJECTIONS[i]), &n2, out, pool) {
                lora.insert(PROJECTIONS[i], s);
            }
        }
        let mut act = pool.take(n * inter);
        silu_gated(&gate, &up, &mut act);
        let mut down = pool.take(n * h);
        if let Some(s) = self.project(&blk.proj[6], site(Projection::Down), &act, &mut down, pool) {
            lora.insert(Projection::Down, s);
        }
        for (d, a) in down.iter_mut().zip(&x2) {
            *d += a;
        }
        let saved = Saved {
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
            lora,
        };
        (saved, down)
    }

    /// The chunk's attention shape.
    fn attention_shape(&self) -> CausalShape {
        CausalShape {
            seq: self.seq,
            heads: self.m.heads,
            kv_heads: self.m.kv_heads,
            head_dim: self.m.head_dim,
        }
    }

    /// The backward pass of block `layer` from `dx` (the gradient of its
    /// output) to the gradient of its input (not formed for layer 0, where
    /// nothing below needs it; the buffer is returned as it is).
    fn block_backward(
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
        let mut dact = pool.take(n * inter);
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
        let mut dn2 = pool.take(n * h);
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
        let mut da = pool.take(n * qw);
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
        let mut dq = pool.take(n * qw);
        let mut dk = pool.take(n * kw);
        let mut dv = pool.take(n * kw);
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
        let mut dn1 = pool.take(if need_dx { n * h } else { 0 });
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

/// Cross-entropy of each token's logits row (`width` wide) against its
/// target, returned per token (`lse − logit[target]`, in f64), with the
/// logits overwritten by the loss gradient `weight · (softmax − onehot)`
/// (each token's own weight).
fn cross_entropy(logits: &mut [f32], width: usize, targets: &[usize], weights: &[f32]) -> Vec<f64> {
    let mut loss = vec![0.0f64; targets.len()];
    logits
        .par_chunks_mut(width)
        .zip(loss.par_iter_mut())
        .zip(targets.par_iter().zip(weights.par_iter()))
        .for_each(|((row, loss), (&target, &weight))| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let at_target = row[target];
            let sum = exp_shifted_in_place(row, max);
            *loss = f64::from(max) + sum.ln() - f64::from(at_target);
            let c = (f64::from(weight) / sum) as f32;
            for s in row.iter_mut() {
                *s *= c;
            }
            row[target] -= weight;
        });
    loss
}
