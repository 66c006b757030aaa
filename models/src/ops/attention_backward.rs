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
//! The tests beside this file check the forward against an f64 reference and
//! the backward against central differences of that reference.

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

#[cfg(test)]
mod tests;
