//! Causal self-attention for a training step on host vectors: the forward
//! pass that keeps every head's softmax probabilities, and its backward
//! pass (the host LoRA step of `privmix-ensemble`, beside the other
//! backward passes of [`super::backward`]).
//!
//! Rows are blocks of `seq` tokens, each attending to itself from position
//! 0 (no cache): `P = softmax(scale · q kᵀ)` below the diagonal (zero
//! above), `out = P v`, with `scale = 1/√head_dim` and grouped-query heads
//! (query head `h` reads key/value head `h / (heads / kv_heads)`). The
//! products are [`crate::cpu::strided`]'s (transposed operands read in
//! place), the exponentials [`crate::cpu::vexp::exp_shifted_in_place`]'s.
//!
//! The backward pass is the softmax's Jacobian product
//! (`dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dP = dO vᵀ`) and the three products'
//! transposes: `dq = scale · dS k`, `dk = scale · dSᵀ q`, `dv = Pᵀ dO`.
//!
//!
//! Causal tiles: every product runs on tiles of `TILE` query rows (the
//! last tile takes the remainder), each reaching only the keys at or below
//! its last row, so the blocks wholly above the diagonal, where `P` and
//! `dS` are zero, are neither formed nor summed. This keeps every bit of
//! the full `seq × seq` products where every value is finite: `gemm`'s
//! packed kernels sum each element in order of `k` from `+0`, in one block
//! where `k ≤ 512` (so blocks of up to `seq ≤ 512` tokens are tiled, longer
//! ones are not), and a term `±0 · x` leaves such a sum as it was, whether
//! it comes before the first other term or after the last. Every tile is
//! at least `TILE × TILE`, so no tile takes `gemm`'s paths for a few rows
//! or columns (another order of the sum).
//!
//! The tests beside this file check the forward against an f64 reference and
//! the backward against central differences of that reference, and the
//! tiled passes against the full products bit for bit.

use std::ops::Range;

use rayon::prelude::*;

use crate::cpu::strided::{Mat, gemm_into};
use crate::cpu::vexp::exp_shifted_in_place;

/// The shape of a step's attention: `[rows · seq, heads · head_dim]`
/// queries and outputs, `[rows · seq, kv_heads · head_dim]` keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CausalShape {
    /// Tokens per row (block).
    pub seq: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
}

impl CausalShape {
    fn widths(&self) -> (usize, usize) {
        (self.heads * self.head_dim, self.kv_heads * self.head_dim)
    }

    fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }

    /// Floats of the saved probabilities of `rows` rows.
    pub fn probs_len(&self, rows: usize) -> usize {
        rows * self.heads * self.seq * self.seq
    }
}

/// Query rows per causal tile (see the module docs): a multiple of 8,
/// `gemm`'s row tile, and large enough that a tile's products keep to
/// `gemm`'s packed kernels (`TILE²` elements, more than the 256 below which
/// it sums another way).
const TILE: usize = 32;

/// The longest sum `gemm` runs in one block: longer blocks of tokens are
/// not tiled (a shorter sum would be blocked another way).
const ONE_BLOCK: usize = 512;

/// The causal tiles of a block of `t` tokens: `TILE` rows each, the last
/// taking the remainder (so `TILE` to `2 · TILE - 1` rows); one tile of all
/// `t` rows where `t < 2 · TILE` or `t > ONE_BLOCK`.
fn tiles(t: usize) -> impl Iterator<Item = Range<usize>> {
    let n = if t > ONE_BLOCK { 1 } else { (t / TILE).max(1) };
    (0..n).map(move |b| b * TILE..if b + 1 == n { t } else { (b + 1) * TILE })
}

/// `m` from element `(row, col)` on.
fn from(m: Mat<'_>, row: usize, col: usize) -> Mat<'_> {
    Mat {
        data: &m.data[row * m.rs + col * m.cs..],
        ..m
    }
}

/// Causal attention of every row and head into `out`, with
/// `probs[row, head]` (`seq × seq`, zero above the diagonal) the softmax
/// probabilities, kept for [`causal_attention_backward`]. Rows split over
/// rayon's threads.
pub fn causal_attention(
    shape: CausalShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &mut [f32],
    out: &mut [f32],
) {
    let CausalShape {
        seq: t,
        heads,
        kv_heads,
        head_dim: hd,
    } = shape;
    let (qw, kw) = shape.widths();
    let rep = heads / kv_heads;
    let scale = shape.scale();
    out.par_chunks_mut(t * qw)
        .zip(probs.par_chunks_mut(heads * t * t))
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
                // Scores of each tile's rows against the keys up to its last
                // row; the rest of a row is zeroed below.
                for r in tiles(t) {
                    let dst = &mut p[r.start * t..];
                    gemm_into(
                        dst,
                        t,
                        r.len(),
                        r.end,
                        hd,
                        false,
                        scale,
                        from(qh, r.start, 0),
                        kt,
                    );
                }
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
                for r in tiles(t) {
                    gemm_into(
                        &mut out[r.start * qw + head * hd..],
                        qw,
                        r.len(),
                        hd,
                        r.end,
                        false,
                        1.0,
                        from(Mat::rows(p, t), r.start, 0),
                        vh,
                    );
                }
            }
        });
}

/// The backward pass of [`causal_attention`]: from `d_out`, the gradient
/// of its output, and what its forward pass read and kept, the gradients
/// of `q`, `k` and `v` (overwritten). Rows split over rayon's threads.
pub fn causal_attention_backward(
    shape: CausalShape,
    (q, k, v, probs): (&[f32], &[f32], &[f32], &[f32]),
    d_out: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let CausalShape {
        seq: t,
        heads,
        kv_heads,
        head_dim: hd,
    } = shape;
    let (qw, kw) = shape.widths();
    let rep = heads / kv_heads;
    let scale = shape.scale();
    dq.par_chunks_mut(t * qw)
        .zip(dk.par_chunks_mut(t * kw))
        .zip(dv.par_chunks_mut(t * kw))
        .enumerate()
        .for_each(|(row, ((dq, dk), dv))| {
            let q = &q[row * t * qw..(row + 1) * t * qw];
            let k = &k[row * t * kw..(row + 1) * t * kw];
            let v = &v[row * t * kw..(row + 1) * t * kw];
            let d_out = &d_out[row * t * qw..(row + 1) * t * qw];
            let probs = &probs[row * heads * t * t..(row + 1) * heads * t * t];
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
                let vt = Mat {
                    data: &v[g..],
                    rs: 1,
                    cs: kw,
                };
                let kh = Mat {
                    data: &k[g..],
                    rs: kw,
                    cs: 1,
                };
                let qh = Mat {
                    data: &q[head * hd..],
                    rs: qw,
                    cs: 1,
                };
                // dP = dO vᵀ, each tile's rows up to its last row's key.
                for r in tiles(t) {
                    let dst = &mut ds[r.start * t..];
                    gemm_into(
                        dst,
                        t,
                        r.len(),
                        r.end,
                        hd,
                        false,
                        1.0,
                        from(doh, r.start, 0),
                        vt,
                    );
                }
                // dv += Pᵀ dO: each tile's keys from the queries at or
                // after its first row.
                for c in tiles(t) {
                    gemm_into(
                        &mut dv[c.start * kw + g..],
                        kw,
                        c.len(),
                        hd,
                        t - c.start,
                        true,
                        1.0,
                        from(Mat::transposed(p, t), c.start, c.start),
                        from(doh, c.start, 0),
                    );
                }
                // dS = P ⊙ (dP − Σ_u P dP) at and below the diagonal, zero
                // above it to the end of the row's tile (the part of the
                // row the products below read).
                for (i, (prow, drow)) in p.chunks(t).zip(ds.chunks_mut(t)).enumerate() {
                    let (prow, (drow, above)) = (&prow[..=i], drow.split_at_mut(i + 1));
                    let dot: f32 = prow.iter().zip(drow.iter()).map(|(a, b)| a * b).sum();
                    for (d, p) in drow.iter_mut().zip(prow) {
                        *d = p * (*d - dot);
                    }
                    above.fill(0.0);
                }
                // dq = scale · dS k; dk += scale · dSᵀ q, tiled as P v and
                // Pᵀ dO.
                for r in tiles(t) {
                    gemm_into(
                        &mut dq[r.start * qw + head * hd..],
                        qw,
                        r.len(),
                        hd,
                        r.end,
                        false,
                        scale,
                        from(Mat::rows(&ds, t), r.start, 0),
                        kh,
                    );
                }
                for c in tiles(t) {
                    gemm_into(
                        &mut dk[c.start * kw + g..],
                        kw,
                        c.len(),
                        hd,
                        t - c.start,
                        true,
                        scale,
                        from(Mat::transposed(&ds, t), c.start, c.start),
                        from(qh, c.start, 0),
                    );
                }
            }
        });
}

#[cfg(test)]
mod tests;
