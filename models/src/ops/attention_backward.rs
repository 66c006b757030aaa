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

/// `dst = beta · a b` at and below the diagonal of a block of `t` tokens,
/// tile by tile (`dst` row-major `t × t`, `a` a `[t, hd]` operand, `b` a
/// `[hd, t]` one): each tile's rows against the keys up to its last row.
/// What lies beyond a tile's last key is left unwritten.
fn below_diagonal_product(dst: &mut [f32], t: usize, hd: usize, beta: f32, a: Mat<'_>, b: Mat<'_>) {
    for r in tiles(t) {
        gemm_into(
            &mut dst[r.start * t..],
            t,
            r.len(),
            r.end,
            hd,
            false,
            beta,
            from(a, r.start, 0),
            b,
        );
    }
}

/// `dst = beta · c x` for `c` a row-major `t × t` matrix zero above the
/// diagonal and `x` a `[t, hd]` operand, into `dst`'s first `hd` columns
/// (row stride `dst_rs`): each tile's rows summed over the keys up to its
/// last row.
fn causal_product(
    dst: &mut [f32],
    dst_rs: usize,
    t: usize,
    hd: usize,
    beta: f32,
    c: &[f32],
    x: Mat<'_>,
) {
    for r in tiles(t) {
        gemm_into(
            &mut dst[r.start * dst_rs..],
            dst_rs,
            r.len(),
            hd,
            r.end,
            false,
            beta,
            from(Mat::rows(c, t), r.start, 0),
            x,
        );
    }
}

/// `dst += beta · cᵀ x` for `c` and `x` as in [`causal_product`]: each
/// tile's keys summed over the queries from its first row on (the rows of
/// `c` before it are zero in the tile's columns).
fn from_diagonal_product(
    dst: &mut [f32],
    dst_rs: usize,
    t: usize,
    hd: usize,
    beta: f32,
    c: &[f32],
    x: Mat<'_>,
) {
    for r in tiles(t) {
        gemm_into(
            &mut dst[r.start * dst_rs..],
            dst_rs,
            r.len(),
            hd,
            t - r.start,
            true,
            beta,
            from(Mat::transposed(c, t), r.start, r.start),
            from(x, r.start, 0),
        );
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
                // Scores up to the diagonal; the rest of a row is zeroed
                // below.
                below_diagonal_product(p, t, hd, scale, qh, kt);
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
                causal_product(&mut out[head * hd..], qw, t, hd, 1.0, p, vh);
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
                // dP = dO vᵀ up to the diagonal; dv += Pᵀ dO.
                below_diagonal_product(&mut ds, t, hd, 1.0, doh, vt);
                from_diagonal_product(&mut dv[g..], kw, t, hd, 1.0, p, doh);
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
                // dq = scale · dS k; dk += scale · dSᵀ q.
                causal_product(&mut dq[head * hd..], qw, t, hd, scale, &ds, kh);
                from_diagonal_product(&mut dk[g..], kw, t, hd, scale, &ds, qh);
            }
        });
}

#[cfg(test)]
mod tests;
