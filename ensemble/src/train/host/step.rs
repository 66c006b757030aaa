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
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use privmix_models::Llama;
use privmix_models::Site;
use privmix_models::cpu::strided::{Mat, matmul};
use privmix_models::cpu::vexp::exp_shifted_in_place;
use rayon::prelude::*;

use super::block::{Rows, TrainOps, TrainingBlocks, release};
use super::chunk::{Ctx, Group, Segment};
use super::kernels::{StepRope, rms_norm_backward};
use super::pool::Pool;
use super::weights::HostLlama;
use crate::train::error::TrainError;
use crate::train::params::SiteLayout;
use privmix_models::ModelBackend;

/// Tokens whose logits are formed at a time (`HEAD_TOKENS × vocab` floats).
const HEAD_TOKENS: usize = 256;

/// Tokens per chunk at most when layers are recomputed (the products run as
/// fast on this many rows as on more).
const RECOMPUTE_TOKENS: usize = 2048;

/// A trainer's host copy of a Llama-family model: its weights in host
/// memory, and the decoder itself (sharing its tensors), whose block
/// sequence is the step's forward pass.
#[derive(Debug)]
pub(crate) struct HostModel {
    /// The frozen weights and shapes in host memory.
    pub llama: HostLlama,
    decoder: Box<dyn TrainingBlocks>,
}

impl HostModel {
    /// The host copy of `m` ([`HostLlama::from_llama`], which says when it
    /// errors).
    pub fn from_llama<B: AutodiffBackend + ModelBackend>(m: &Llama<B>) -> Result<Self, TrainError> {
        Ok(Self {
            llama: HostLlama::from_llama(m)?,
            decoder: Box::new(m.clone()),
        })
    }

    /// The host copy of `model` where it is a Llama (tests build it
    /// directly; trainers go through the execution plan).
    #[cfg(test)]
    pub fn from_model<B: AutodiffBackend + ModelBackend>(
        model: &privmix_models::Model<B>,
    ) -> Result<Option<Self>, TrainError> {
        match model {
            privmix_models::Model::Llama(m) => Self::from_llama(m).map(Some),
            _ => Ok(None),
        }
    }
}

/// What a step shares across its chunks.
struct Step<'a> {
    m: &'a HostLlama,
    decoder: &'a dyn TrainingBlocks,
    seq: usize,
    r: usize,
    scale: f32,
    layouts: HashMap<Site, SiteLayout>,
    groups: &'a [Group<'a>],
}

impl HostModel {
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
        let slot = &self.llama.pool;
        let mut pool = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
        let out = f(&mut pool);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = pool;
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
            .find(|&&t| t as usize >= self.llama.vocab)
        {
            return Err(TrainError::BadData(format!(
                "token {bad} outside the vocabulary of {}",
                self.llama.vocab
            )));
        }
        Ok(Step {
            m: &self.llama,
            decoder: self.decoder.as_ref(),
            seq: len - 1,
            r: first.config().r,
            scale: first.config().scale() as f32,
            layouts: first.layout().iter().map(|l| (l.site, *l)).collect(),
            groups,
        })
    }
}

impl HostLlama {
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
                Some(g) => ctx.run(self.decoder, chunk, g, &mut sums, recompute, pool),
                None => ctx.forward_losses(self.decoder, chunk, &mut sums, pool),
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
        let mut x = pool.take_for_overwrite(self.tokens * h);
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
            let mut logits = pool.take_for_overwrite(n * v);
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

    /// The chunk's losses only (nothing saved): the decoder's block
    /// sequence in the training operations ([`TrainOps`]), then the head.
    fn forward_losses(
        &self,
        decoder: &dyn TrainingBlocks,
        blocks: &[&Vec<u32>],
        sums: &mut [f64],
        pool: &mut Pool,
    ) {
        let m = self.m;
        let tables = StepRope::new(&m.rope, self.seq);
        let mut x: Rows = Arc::new(self.embed(blocks, pool));
        let mut n = decoder.input_norm(&mut TrainOps::new(self, &tables, pool, false), 0, &x);
        for layer in 0..m.blocks.len() {
            let mut ops = TrainOps::new(self, &tables, pool, false);
            let (next_x, next_n) = decoder.forward(&mut ops, layer, x, n);
            (x, n) = (next_x, next_n);
        }
        // `n`: the final norm's output.
        self.head(blocks, &n, None, sums, pool);
        for rows in [x, n] {
            release(rows, pool);
        }
    }

    /// The chunk's forward and backward passes: adds each token's loss into
    /// its group's sum and each group's gradient into `grads`; with
    /// `recompute`, only each layer's input is kept and the layer's forward
    /// pass runs again before its backward pass. Every forward is the
    /// decoder's block sequence in the training operations ([`TrainOps`]).
    fn run(
        &self,
        decoder: &dyn TrainingBlocks,
        blocks: &[&Vec<u32>],
        grads: &mut [Vec<f32>],
        sums: &mut [f64],
        recompute: bool,
        pool: &mut Pool,
    ) {
        let m = self.m;
        let (h, n_len) = (m.hidden, self.tokens);
        let tables = StepRope::new(&m.rope, self.seq);
        let mut x: Rows = Arc::new(self.embed(blocks, pool));
        let mut n = decoder.input_norm(&mut TrainOps::new(self, &tables, pool, false), 0, &x);
        let mut saved = Vec::with_capacity(m.blocks.len());
        let mut inputs = Vec::with_capacity(m.blocks.len());
        for layer in 0..m.blocks.len() {
            if recompute {
                let mut keep = pool.take_for_overwrite(n_len * h);
                keep.copy_from_slice(&x);
                inputs.push(keep);
            }
            let mut ops = TrainOps::new(self, &tables, pool, !recompute);
            let (next_x, next_n) = decoder.forward(&mut ops, layer, x, n);
            (x, n) = (next_x, next_n);
            if !recompute {
                saved.push(ops.into_saved());
            }
        }
        // `n`: the final norm's output; the head and cross-entropy, then
        // the final norm's backward pass.
        let mut dnf = pool.take_for_overwrite(n_len * h);
        self.head(blocks, &n, Some(&mut dnf), sums, pool);
        let mut dx = pool.take(n_len * h);
        rms_norm_backward(&x, &m.norm, m.eps, &dnf, &mut dx);
        pool.give(dnf);
        for rows in [x, n] {
            release(rows, pool);
        }
        for layer in (0..m.blocks.len()).rev() {
            let s = if recompute {
                let input = Arc::new(inputs.pop().expect("one input per layer"));
                let mut ops = TrainOps::new(self, &tables, pool, true);
                let n = decoder.input_norm(&mut ops, layer, &input);
                let (out, next_n) = decoder.forward(&mut ops, layer, input, n);
                let s = ops.into_saved();
                for rows in [out, next_n] {
                    release(rows, pool);
                }
                s
            } else {
                saved.pop().expect("one saved block per layer")
            };
            dx = self.block_backward(layer, s, dx, &tables, grads, pool);
        }
        pool.give(dx);
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
