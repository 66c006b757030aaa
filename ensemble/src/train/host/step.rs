//! The host step itself: forward with saved activations, cross-entropy, and
//! the backward pass to the LoRA factors (see the module docs of `host`).

use std::collections::HashMap;

use privmix_models::cpu::vexp::exp_shifted_in_place;
use privmix_models::{Projection, Site};
use rayon::prelude::*;

use super::kernels::{
    Mat, gemm_into, matmul, rms_norm, rms_norm_backward, rope, rope_tables, silu_gated,
    silu_gated_backward,
};
use super::weights::{HostLinear, HostLlama, PROJECTIONS};
use crate::train::error::TrainError;
use crate::train::params::{LoraParams, SiteLayout};
use crate::train::trainable::{Dropout, dropout_mask};

pub(crate) use super::pool::Pool;

/// Which dropout masks the adapters' inputs get: none, or one [`Dropout`]
/// pass per group of consecutive rows (one pass for all rows, as
/// [`crate::train::Trainer`] draws them, or one per row, as DP-SGD's
/// per-example passes do).
#[derive(Debug, Clone, Default)]
pub(crate) struct DropoutPlan(pub Vec<Dropout>);

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
    inv1: Vec<f32>,
    n1: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    probs: Vec<f32>,
    attn: Vec<f32>,
    x2: Vec<f32>,
    inv2: Vec<f32>,
    n2: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    lora: HashMap<Projection, LoraSaved>,
}

/// One step's shapes and adapter.
struct Ctx<'a> {
    m: &'a HostLlama,
    rows: usize,
    seq: usize,
    tokens: usize,
    r: usize,
    scale: f32,
    sites: HashMap<Site, (SiteLayout, &'a [f32], &'a [f32])>,
    dropout: &'a DropoutPlan,
    /// Rows per gradient group (`rows`: one gradient; 1: one per row).
    group_rows: usize,
}

impl HostLlama {
    /// Loss and LoRA gradient of `params` on `blocks` (all of one length ≥ 2,
    /// checked by the caller): with `per_block`, one `(mean loss, gradient)`
    /// per block, each of that block's own mean loss; otherwise one pair for
    /// the mean loss over all blocks' predicted positions (what
    /// [`super::super::mean_nll`] computes).
    pub(crate) fn loss_and_gradients(
        &self,
        params: &LoraParams,
        blocks: &[&Vec<u32>],
        dropout: &DropoutPlan,
        per_block: bool,
    ) -> Result<Vec<(f64, Vec<f32>)>, TrainError> {
        let rows = blocks.len();
        let len = blocks.first().map_or(0, |b| b.len());
        if len < 2 || blocks.iter().any(|b| b.len() != len) {
            return Err(TrainError::BadData(
                "the host step needs blocks of one length ≥ 2".into(),
            ));
        }
        let seq = len - 1;
        if !dropout.0.is_empty() && !rows.is_multiple_of(dropout.0.len()) {
            return Err(TrainError::BadData(format!(
                "{} dropout passes for {rows} blocks",
                dropout.0.len()
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
        let sites = params
            .layout()
            .iter()
            .map(|l| {
                let (a, b) = params.factors(l);
                (l.site, (*l, a, b))
            })
            .collect();
        let ctx = Ctx {
            m: self,
            rows,
            seq,
            tokens: rows * seq,
            r: params.config().r,
            scale: params.config().scale() as f32,
            sites,
            dropout,
            group_rows: if per_block { 1 } else { rows },
        };
        let mut pool = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|e| e.into_inner()));
        let out = ctx.run(blocks, params.len(), &mut pool);
        *self.pool.lock().unwrap_or_else(|e| e.into_inner()) = pool;
        Ok(out)
    }
}

impl Ctx<'_> {
    fn run(&self, blocks: &[&Vec<u32>], len: usize, pool: &mut Pool) -> Vec<(f64, Vec<f32>)> {
        let m = self.m;
        let (h, n) = (m.hidden, self.tokens);
        let tables = rope_tables(&m.inv_freq, self.seq);
        let mut x = pool.take(n * h);
        for (row, b) in blocks.iter().enumerate() {
            for (i, &id) in b[..self.seq].iter().enumerate() {
                let at = (row * self.seq + i) * h;
                let id = id as usize;
                x[at..at + h].copy_from_slice(&m.embed[id * h..(id + 1) * h]);
            }
        }
        let mut saved = Vec::with_capacity(m.blocks.len());
        for layer in 0..m.blocks.len() {
            let (s, next) = self.block_forward(layer, x, &tables, pool);
            saved.push(s);
            x = next;
        }
        // Final norm, head, cross-entropy.
        let mut nf = pool.take(n * h);
        let invf = rms_norm(&x, &m.norm, m.eps, &mut nf);
        let v = m.vocab;
        let mut logits = pool.take(n * v);
        self.project(&m.head, None, &nf, &mut logits, pool);
        let targets: Vec<usize> = blocks
            .iter()
            .flat_map(|b| b[1..].iter().map(|&t| t as usize))
            .collect();
        let weight = 1.0 / (self.seq * self.group_rows) as f32;
        let token_loss = cross_entropy(&mut logits, v, &targets, weight);
        let groups = self.rows / self.group_rows;
        let group_tokens = self.group_rows * self.seq;
        let losses: Vec<f64> = token_loss
            .chunks(group_tokens)
            .map(|c| c.iter().sum::<f64>() / group_tokens as f64)
            .collect();
        let mut dnf = pool.take(n * h);
        matmul(
            &mut dnf,
            n,
            h,
            v,
            false,
            1.0,
            Mat::rows(&logits, v),
            Mat::rows(&m.head.w, h),
        );
        pool.give(logits);
        let mut dx = pool.take(n * h);
        rms_norm_backward(&x, &invf, &m.norm, &dnf, &mut dx);
        for b in [x, nf, dnf] {
            pool.give(b);
        }
        let mut grads: Vec<Vec<f32>> = (0..groups).map(|_| vec![0.0f32; len]).collect();
        for layer in (0..m.blocks.len()).rev() {
            let s = saved.pop().expect("one saved block per layer");
            dx = self.block_backward(layer, s, dx, &tables, &mut grads, pool);
        }
        pool.give(dx);
        losses.into_iter().zip(grads).collect()
    }

    /// `out = input · W (+ bias)` for `out` sized `[tokens, fan_out]`, plus
    /// the adapter's `s · x̃ A B` at `site` when it has one (returning what
    /// its backward pass needs).
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
        let (l, a, b) = self.sites.get(&site?)?;
        let (fan_in, r) = (l.fan_in, self.r);
        let (dropped, mask) = if self.dropout.0.is_empty() {
            (None, None)
        } else {
            let per = n * fan_in / self.dropout.0.len();
            let mut mask = pool.take(0);
            for d in &self.dropout.0 {
                mask.extend(dropout_mask(d, l.site, per));
            }
            let mut dropped = pool.take(n * fan_in);
            for ((d, x), k) in dropped.iter_mut().zip(input).zip(&mask) {
                *d = x * k;
            }
            (Some(dropped), Some(mask))
        };
        let x_in = dropped.as_deref().unwrap_or(input);
        let mut xa = pool.take(n * r);
        matmul(
            &mut xa,
            n,
            r,
            fan_in,
            false,
            1.0,
            Mat::rows(x_in, fan_in),
            Mat::rows(a, r),
        );
        matmul(
            out,
            n,
            l.fan_out,
            r,
            true,
            self.scale,
            Mat::rows(&xa, r),
            Mat::rows(b, l.fan_out),
        );
        Some(LoraSaved { dropped, mask, xa })
    }

    /// The adapter's gradients at `site` given `dy` (the gradient of the
    /// projection's output) and its input `input`, added to `grads` (one per
    /// group of rows); and, with `dx`, the adapter's part of the input
    /// gradient added to it.
    #[allow(clippy::too_many_arguments)]
    fn lora_backward(
        &self,
        site: Site,
        saved: &LoraSaved,
        input: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        grads: &mut [Vec<f32>],
        pool: &mut Pool,
    ) {
        let Some((l, a, b)) = self.sites.get(&site) else {
            return;
        };
        let (n, r, s) = (self.tokens, self.r, self.scale);
        let (fan_in, fan_out) = (l.fan_in, l.fan_out);
        let x_in = saved.dropped.as_deref().unwrap_or(input);
        // dxa = s · dy Bᵀ.
        let mut dxa = pool.take(n * r);
        matmul(
            &mut dxa,
            n,
            r,
            fan_out,
            false,
            s,
            Mat::rows(dy, fan_out),
            Mat::transposed(b, fan_out),
        );
        let gt = self.group_rows * self.seq;
        for (g, grad) in grads.iter_mut().enumerate() {
            let rows = g * gt..(g + 1) * gt;
            // dB = s · (x̃A)ᵀ dy; dA = x̃ᵀ dxa.
            let xa = &saved.xa[rows.start * r..rows.end * r];
            let dy_g = &dy[rows.start * fan_out..rows.end * fan_out];
            let db = &mut grad[l.b_offset..l.b_offset + r * fan_out];
            matmul(
                db,
                r,
                fan_out,
                gt,
                true,
                s,
                Mat::transposed(xa, r),
                Mat::rows(dy_g, fan_out),
            );
            let x_g = &x_in[rows.start * fan_in..rows.end * fan_in];
            let dxa_g = &dxa[rows.start * r..rows.end * r];
            let da = &mut grad[l.a_offset..l.b_offset];
            matmul(
                da,
                fan_in,
                r,
                gt,
                true,
                1.0,
                Mat::transposed(x_g, fan_in),
                Mat::rows(dxa_g, r),
            );
        }
        if let Some(dx) = dx {
            match &saved.mask {
                None => matmul(
                    dx,
                    n,
                    fan_in,
                    r,
                    true,
                    1.0,
                    Mat::rows(&dxa, r),
                    Mat::transposed(a, r),
                ),
                Some(mask) => {
                    let mut tmp = pool.take(n * fan_in);
                    matmul(
                        &mut tmp,
                        n,
                        fan_in,
                        r,
                        false,
                        1.0,
                        Mat::rows(&dxa, r),
                        Mat::transposed(a, r),
                    );
                    for ((d, t), k) in dx.iter_mut().zip(&tmp).zip(mask) {
                        *d += t * k;
                    }
                    pool.give(tmp);
                }
            }
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
            Mat::rows(&lin.w, lin.fan_in),
        );
    }

    fn block_forward(
        &self,
        layer: usize,
        x: Vec<f32>,
        tables: &(Vec<f32>, Vec<f32>),
        pool: &mut Pool,
    ) -> (Saved, Vec<f32>) {
        let m = self.m;
        let blk = &m.blocks[layer];
        let (h, n, hd) = (m.hidden, self.tokens, m.head_dim);
        let (qw, kw) = (m.heads * hd, m.kv_heads * hd);
        let site = |module| Some(Site { layer, module });
        let mut lora = HashMap::new();
        let mut n1 = pool.take(n * h);
        let inv1 = rms_norm(&x, &blk.norm1, m.eps, &mut n1);
        let mut q = pool.take(n * qw);
        let mut k = pool.take(n * kw);
        let mut v = pool.take(n * kw);
        for (i, out) in [(0, &mut q), (1, &mut k), (2, &mut v)] {
            if let Some(s) = self.project(&blk.proj[i], site(PROJECTIONS[i]), &n1, out, pool) {
                lora.insert(PROJECTIONS[i], s);
            }
        }
        rope(&mut q, qw, hd, self.seq, tables, false);
        rope(&mut k, kw, hd, self.seq, tables, false);
        let mut probs = pool.take(self.rows * m.heads * self.seq * self.seq);
        let mut attn = pool.take(n * qw);
        self.attention(&q, &k, &v, &mut probs, &mut attn);
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
        let inv2 = rms_norm(&x2, &blk.norm2, m.eps, &mut n2);
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
            inv1,
            n1,
            q,
            k,
            v,
            probs,
            attn,
            x2,
            inv2,
            n2,
            gate,
            up,
            act,
            lora,
        };
        (saved, down)
    }

    /// Causal attention of every row and head: `probs[row, head]` the
    /// softmax of `scale · q kᵀ` (zero above the diagonal), `out = probs · v`.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], probs: &mut [f32], out: &mut [f32]) {
        let m = self.m;
        let (t, hd) = (self.seq, m.head_dim);
        let (qw, kw) = (m.heads * hd, m.kv_heads * hd);
        let rep = m.heads / m.kv_heads;
        let scale = (hd as f32).powf(-0.5);
        out.par_chunks_mut(t * qw)
            .zip(probs.par_chunks_mut(m.heads * t * t))
            .enumerate()
            .for_each(|(row, (out, probs))| {
                let q = &q[row * t * qw..(row + 1) * t * qw];
                let k = &k[row * t * kw..(row + 1) * t * kw];
                let v = &v[row * t * kw..(row + 1) * t * kw];
                for (head, p) in probs.chunks_mut(t * t).enumerate() {
                    let g = (head / rep) * hd;
                    let qh = Mat {
                        data: &q[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    let kt = Mat {
                        data: &k[g..],
                        rs: 1,
                        cs: kw,
                    };
                    gemm_into(p, t, t, t, hd, false, scale, qh, kt);
                    for (i, row) in p.chunks_mut(t).enumerate() {
                        let max = row[..=i].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let inv = (1.0 / exp_shifted_in_place(&mut row[..=i], max)) as f32;
                        for s in &mut row[..=i] {
                            *s *= inv;
                        }
                        row[i + 1..].fill(0.0);
                    }
                    let vh = Mat {
                        data: &v[g..],
                        rs: kw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut out[head * hd..],
                        qw,
                        t,
                        hd,
                        t,
                        false,
                        1.0,
                        Mat::rows(p, t),
                        vh,
                    );
                }
            });
    }

    /// The backward pass of [`Ctx::attention`]: from `d_out`, the gradients
    /// of `q`, `k` and `v` (overwritten).
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        (q, k, v, probs): (&[f32], &[f32], &[f32], &[f32]),
        d_out: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let m = self.m;
        let (t, hd) = (self.seq, m.head_dim);
        let (qw, kw) = (m.heads * hd, m.kv_heads * hd);
        let rep = m.heads / m.kv_heads;
        let scale = (hd as f32).powf(-0.5);
        dq.par_chunks_mut(t * qw)
            .zip(dk.par_chunks_mut(t * kw))
            .zip(dv.par_chunks_mut(t * kw))
            .enumerate()
            .for_each(|(row, ((dq, dk), dv))| {
                let q = &q[row * t * qw..(row + 1) * t * qw];
                let k = &k[row * t * kw..(row + 1) * t * kw];
                let v = &v[row * t * kw..(row + 1) * t * kw];
                let d_out = &d_out[row * t * qw..(row + 1) * t * qw];
                let probs = &probs[row * m.heads * t * t..(row + 1) * m.heads * t * t];
                dk.fill(0.0);
                dv.fill(0.0);
                let mut ds = vec![0.0f32; t * t];
                for (head, p) in probs.chunks(t * t).enumerate() {
                    let g = (head / rep) * hd;
                    let doh = Mat {
                        data: &d_out[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    // dP = dO vᵀ; dv += Pᵀ dO.
                    gemm_into(
                        &mut ds,
                        t,
                        t,
                        t,
                        hd,
                        false,
                        1.0,
                        doh,
                        Mat {
                            data: &v[g..],
                            rs: 1,
                            cs: kw,
                        },
                    );
                    gemm_into(
                        &mut dv[g..],
                        kw,
                        t,
                        hd,
                        t,
                        true,
                        1.0,
                        Mat::transposed(p, t),
                        doh,
                    );
                    // dS = P ⊙ (dP − Σ_u P dP).
                    for (prow, drow) in p.chunks(t).zip(ds.chunks_mut(t)) {
                        let dot: f32 = prow.iter().zip(drow.iter()).map(|(a, b)| a * b).sum();
                        for (d, p) in drow.iter_mut().zip(prow) {
                            *d = p * (*d - dot);
                        }
                    }
                    // dq = scale · dS k; dk += scale · dSᵀ q.
                    let kh = Mat {
                        data: &k[g..],
                        rs: kw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut dq[head * hd..],
                        qw,
                        t,
                        hd,
                        t,
                        false,
                        scale,
                        Mat::rows(&ds, t),
                        kh,
                    );
                    let qh = Mat {
                        data: &q[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut dk[g..],
                        kw,
                        t,
                        hd,
                        t,
                        true,
                        scale,
                        Mat::transposed(&ds, t),
                        qh,
                    );
                }
            });
    }

    /// The backward pass of block `layer` from `dx` (the gradient of its
    /// output) to the gradient of its input (not formed for layer 0, where
    /// nothing below needs it; the buffer is returned as it is).
    fn block_backward(
        &self,
        layer: usize,
        s: Saved,
        mut dx: Vec<f32>,
        tables: &(Vec<f32>, Vec<f32>),
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
            inv1,
            n1,
            q,
            k,
            v,
            probs,
            attn,
            x2,
            inv2,
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
        rms_norm_backward(&x2, &inv2, &blk.norm2, &dn2, &mut dx);
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
        self.attention_backward((&q, &k, &v, &probs), &da, &mut dq, &mut dk, &mut dv);
        pool.give(da);
        rope(&mut dq, qw, hd, self.seq, tables, true);
        rope(&mut dk, kw, hd, self.seq, tables, true);
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
            rms_norm_backward(&x, &inv1, &blk.norm1, &dn1, &mut dx);
        }
        for b in [
            dn1, dq, dk, dv, x, inv1, n1, q, k, v, probs, attn, x2, inv2, n2, gate, up, act,
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
/// logits overwritten by the loss gradient `weight · (softmax − onehot)`.
fn cross_entropy(logits: &mut [f32], width: usize, targets: &[usize], weight: f32) -> Vec<f64> {
    let mut loss = vec![0.0f64; targets.len()];
    logits
        .par_chunks_mut(width)
        .zip(loss.par_iter_mut())
        .zip(targets.par_iter())
        .for_each(|((row, loss), &target)| {
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
