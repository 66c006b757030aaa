//! The host step's building blocks on row-major `f32` slices: products
//! through the `gemm` crate's packed kernels (split by output rows over
//! rayon's threads); and RMSNorm, RoPE and the SiLU-gated product with
//! their backward passes, each the models' own host kernel
//! ([`privmix_models::ops::backward`] and the forward kernels it names)
//! with its rows split over rayon's threads.

use privmix_models::cpu::vexp::silu_in_place;
use privmix_models::layers::Rope;
use privmix_models::layers::rms_norm::rms_norm_host;
use privmix_models::layers::rope::rotate_host;
use privmix_models::ops::backward;
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

/// Rows of `width` values per parallel task of a pass over `rows` rows.
fn rows_chunk(rows: usize, width: usize) -> usize {
    rows_per_task(rows) * width.max(1)
}

/// RMSNorm of each `gain`-wide row of `x` into `out`: the models' host
/// kernel ([`rms_norm_host`]), rows split over rayon's threads.
pub(crate) fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let per = rows_chunk(x.len() / gain.len().max(1), gain.len());
    out.par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .for_each(|(o, x)| rms_norm_host(x, gain, eps, o));
}

/// Adds to `dx` the gradient of RMSNorm's input given `dy`: the models'
/// backward pass ([`backward::rms_norm_backward`]), rows split over
/// rayon's threads.
pub(crate) fn rms_norm_backward(x: &[f32], gain: &[f32], eps: f32, dy: &[f32], dx: &mut [f32]) {
    let per = rows_chunk(x.len() / gain.len().max(1), gain.len());
    dx.par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .zip(dy.par_chunks(per))
        .for_each(|((dx, x), dy)| backward::rms_norm_backward(x, gain, eps, dy, dx));
}

/// The RoPE of a step whose rows are blocks of `seq` tokens, token `t` at
/// position `t % seq`: the rope and its host tables for positions `0..seq`.
pub(crate) struct StepRope<'a> {
    pub rope: &'a Rope,
    pub tables: (Vec<f32>, Vec<f32>),
    pub seq: usize,
}

impl<'a> StepRope<'a> {
    /// The tables of `rope` for positions `0..seq`.
    pub fn new(rope: &'a Rope, seq: usize) -> Self {
        Self {
            rope,
            tables: rope.host_tables(0..seq),
            seq,
        }
    }

    /// Rotates every head of `x` (`[tokens, heads · head_dim]`) in place
    /// with the models' kernel ([`rotate_host`]), or with `inverse` applies
    /// its backward pass ([`backward::rotate_host_backward`]), which maps an
    /// output gradient to the input gradient; tokens split over rayon's
    /// threads.
    pub fn apply(&self, x: &mut [f32], heads: usize, inverse: bool) {
        let d = self.rope.head_dim();
        let style = self.rope.style();
        let tables = (self.tables.0.as_slice(), self.tables.1.as_slice());
        x.par_chunks_mut(heads * d)
            .enumerate()
            .for_each(|(t, row)| {
                let at = t % self.seq;
                if inverse {
                    backward::rotate_host_backward(row, heads, tables, d, at, style);
                } else {
                    rotate_host(row, heads, tables, d, at, style);
                }
            });
    }
}

/// Elements per parallel task of an element-wise pass.
const ELEMENTS_PER_TASK: usize = 4096;

/// `silu(gate) · up`, element-wise, into `out`: the models' SiLU kernel
/// ([`silu_in_place`]) on a copy of `gate`, times `up`.
pub(crate) fn silu_gated(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(gate.par_chunks(ELEMENTS_PER_TASK))
        .zip(up.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((o, g), u)| {
            o.copy_from_slice(g);
            silu_in_place(o);
            for (o, u) in o.iter_mut().zip(u) {
                *o *= u;
            }
        });
}

/// The gradients of `silu(gate) · up` with respect to `gate` and `up`
/// given `d`, written over `gate` and `up`: the models' backward pass
/// ([`backward::silu_gated_backward`]), split over rayon's threads.
pub(crate) fn silu_gated_backward(d: &[f32], gate: &mut [f32], up: &mut [f32]) {
    gate.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(up.par_chunks_mut(ELEMENTS_PER_TASK))
        .zip(d.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((g, u), d)| backward::silu_gated_backward(d, g, u));
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
}
