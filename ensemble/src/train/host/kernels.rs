//! The host step's building blocks on row-major `f32` slices: products
//! through the `gemm` crate's packed kernels (split by output rows over
//! rayon's threads), RMSNorm and its backward pass, rotate-half RoPE and its
//! inverse, SiLU-gated products.

use rayon::prelude::*;

/// A matrix operand: `data[row · rs + col · cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of row-major `[.., cols]` data.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// The operand from row `first` on.
    fn skip_rows(self, first: usize) -> Self {
        Self {
            data: &self.data[first * self.rs..],
            ..self
        }
    }
}

/// Rows per parallel task of a product of `m` rows (a multiple of 8, the
/// packed kernels' row tile, so every task but the last runs full tiles).
fn rows_per_task(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(threads).next_multiple_of(8).max(8)
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, `dst` row-major and
/// contiguous; the rows are split over rayon's threads, each part one
/// single-threaded `gemm` call. Deterministic: every output element is
/// computed by one call whatever the number of threads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    beta: f32,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
) {
    assert!(dst.len() >= m * n, "product destination too short");
    if m == 0 || n == 0 {
        return;
    }
    let per = rows_per_task(m);
    dst[..m * n]
        .par_chunks_mut(per * n)
        .enumerate()
        .for_each(|(i, part)| {
            let rows = part.len() / n;
            gemm_into(
                part,
                n,
                rows,
                n,
                k,
                accumulate,
                beta,
                lhs.skip_rows(i * per),
                rhs,
            );
        });
}

/// One single-threaded product into `dst` with row stride `dst_rs`:
/// `dst[i · dst_rs + j] (+)= beta · Σ_l lhs[i, l] · rhs[l, j]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into(
    dst: &mut [f32],
    dst_rs: usize,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    beta: f32,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    // The last element each operand reaches, checked before the raw call.
    let last = |mat: &Mat<'_>, r: usize, c: usize| (r - 1) * mat.rs + (c - 1) * mat.cs;
    assert!(
        (m - 1) * dst_rs + n <= dst.len(),
        "destination out of range"
    );
    if k > 0 {
        assert!(last(&lhs, m, k) < lhs.data.len(), "lhs out of range");
        assert!(last(&rhs, k, n) < rhs.data.len(), "rhs out of range");
    }
    // SAFETY: every index the call reads or writes was checked above to lie
    // inside its slice; `dst` is borrowed mutably, so nothing aliases it.
    // (The `gemm` crate's entry point takes raw pointers and strides.)
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// RMSNorm of each `width`-wide row of `x` into `out`, as the model
/// computes it in f32: `inv = 1 / √(mean(x²) + ε)`, `out = x · inv · g`;
/// returns every row's `inv` (the backward pass needs it).
pub(crate) fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) -> Vec<f32> {
    let width = gain.len();
    let mut inv = vec![0.0f32; x.len() / width];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .zip(inv.par_iter_mut())
        .for_each(|((o, x), inv)| {
            let ms = x.iter().map(|v| v * v).sum::<f32>() / width as f32;
            *inv = 1.0 / (ms + eps).sqrt();
            for ((o, x), g) in o.iter_mut().zip(x).zip(gain) {
                *o = x * *inv * g;
            }
        });
    inv
}

/// Adds to `dx` the gradient of RMSNorm's input given `dy`, the gradient of
/// its output: with `u = g ⊙ dy`,
/// `dx = inv · u − x · inv³ · (Σ_j u_j x_j) / width`.
pub(crate) fn rms_norm_backward(x: &[f32], inv: &[f32], gain: &[f32], dy: &[f32], dx: &mut [f32]) {
    let width = gain.len();
    dx.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .zip(dy.par_chunks(width))
        .zip(inv.par_iter())
        .for_each(|(((dx, x), dy), &inv)| {
            let dot: f32 = x
                .iter()
                .zip(dy)
                .zip(gain)
                .map(|((x, d), g)| x * d * g)
                .sum();
            let c = inv * inv * inv * dot / width as f32;
            for (((dx, x), dy), g) in dx.iter_mut().zip(x).zip(dy).zip(gain) {
                *dx += inv * g * dy - x * c;
            }
        });
}

/// `cos`/`sin` tables `[seq, head_dim]` of positions `0..seq` for HF's
/// rotate-half RoPE: `inv_freq · position` in f32, then `cos`/`sin` in f32,
/// each half-table repeated twice.
pub(crate) fn rope_tables(inv_freq: &[f32], seq: usize) -> (Vec<f32>, Vec<f32>) {
    let d = 2 * inv_freq.len();
    let (mut cos, mut sin) = (Vec::with_capacity(seq * d), Vec::with_capacity(seq * d));
    for p in 0..seq {
        let angle: Vec<f32> = inv_freq.iter().map(|f| f * p as f32).collect();
        for _ in 0..2 {
            cos.extend(angle.iter().map(|a| a.cos()));
            sin.extend(angle.iter().map(|a| a.sin()));
        }
    }
    (cos, sin)
}

/// Rotates every head of `x` (`[tokens, heads · d]`, token `t` at position
/// `t % seq`) in place: pairs `(a, b) = (x_i, x_{i+d/2})` become
/// `(a·cos − b·sin, b·cos + a·sin)`; `inverse` applies the transpose (the
/// rotation by the opposite angle), which maps an output gradient to the
/// input gradient.
pub(crate) fn rope(
    x: &mut [f32],
    width: usize,
    d: usize,
    seq: usize,
    tables: &(Vec<f32>, Vec<f32>),
    inverse: bool,
) {
    let (cos, sin) = tables;
    let half = d / 2;
    let sign = if inverse { -1.0f32 } else { 1.0 };
    x.par_chunks_mut(width).enumerate().for_each(|(t, row)| {
        let at = (t % seq) * d;
        let (c, s) = (&cos[at..at + d], &sin[at..at + d]);
        for head in row.chunks_exact_mut(d) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - sign * b * s[i];
                head[i + half] = b * c[i + half] + sign * a * s[i + half];
            }
        }
    });
}

/// The logistic function.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `silu(gate) · up`, element-wise, into `out`.
pub(crate) fn silu_gated(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(4096)
        .zip(gate.par_chunks(4096))
        .zip(up.par_chunks(4096))
        .for_each(|((o, g), u)| {
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = g * sigmoid(*g) * u;
            }
        });
}

/// The gradients of `silu(gate) · up` with respect to `gate` and `up`
/// given `d` (the gradient of its output), written over `gate` and `up`:
/// `d_up = d · silu(gate)`, `d_gate = d · up · σ(gate)(1 + gate(1 − σ(gate)))`.
pub(crate) fn silu_gated_backward(d: &[f32], gate: &mut [f32], up: &mut [f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks_mut(4096))
        .zip(d.par_chunks(4096))
        .for_each(|((g, u), d)| {
            for ((g, u), d) in g.iter_mut().zip(u.iter_mut()).zip(d) {
                let s = sigmoid(*g);
                let silu = *g * s;
                let dg = d * *u * s * (1.0 + *g * (1.0 - s));
                *u = d * silu;
                *g = dg;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matmul_matches_the_naive_product_in_every_layout() {
        let (m, n, k) = (37, 13, 21);
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let want = naive(&a, &b, m, n, k);
        let mut bt = vec![0.0; k * n];
        for l in 0..k {
            for j in 0..n {
                bt[j * k + l] = b[l * n + j];
            }
        }
        for (rhs, name) in [
            (Mat::rows(&b, n), "rows"),
            (Mat::transposed(&bt, k), "transposed"),
        ] {
            let mut got = vec![1.0; m * n];
            matmul(&mut got, m, n, k, true, 2.0, Mat::rows(&a, k), rhs);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - (1.0 + 2.0 * w)).abs() < 1e-4, "{name}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn rope_inverse_undoes_rope() {
        let (seq, d, heads) = (5, 8, 3);
        let inv: Vec<f32> = (0..d / 2).map(|i| 1.0 / 10f32.powi(i as i32)).collect();
        let tables = rope_tables(&inv, seq);
        let x = values(2 * seq * heads * d, 3);
        let mut y = x.clone();
        rope(&mut y, heads * d, d, seq, &tables, false);
        assert!(y.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-3));
        rope(&mut y, heads * d, d, seq, &tables, true);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
