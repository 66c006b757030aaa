//! `x Wᵀ` for a few rows of `x` on burn-flex, reading each row of the
//! `[out, in]` weight once from memory and forming all its dot products
//! while it sits in L1.
//!
//! Why: decoding multiplies 1 to ~32 rows (one per sequence or ensemble
//! member) by every weight of the model, so a step is bound by reading the
//! weights. burn-flex hands such products to `gemm`, which for one row uses
//! a single-threaded gemv and for two or more rows *packs the whole weight*
//! (a read and a write of it) before its microkernel runs, which dominates
//! a step of a few rows. Here each weight
//! row is read once, on all cores (rayon over output blocks), and the rows
//! of `x` (at most a few hundred KB) stay in cache.
//!
//! Precision: each output is an f32 dot product accumulated with fused
//! multiply-adds in one vector accumulator per output, a different order
//! from gemm's but within the same `γ_k Σ|w_j x_j|` bound of the exact sum
//! (Higham, *Accuracy and Stability*, Thm 3.1), which the tests check.
//!
//! SIMD: one kernel on pulp's vectors, run at AVX-512, AVX2+FMA or scalar
//! width as [`super::dispatch`] chooses (as `gemm` itself does); no
//! `unsafe` here. The product itself is `cpu::gemm`'s
//! `few_rows_matmul`.

use crate::backend::HostF32;
use pulp::{Simd, WithSimd};

/// Output columns per parallel task (a multiple of the SIMD width; 64 rows of
/// a 576-wide weight are 147 KB, enough to amortise rayon's scheduling).
pub(crate) const DENSE_BLOCK: usize = 64;

/// The `[out, in]` rows behind an `[in, out]` view with strides `[1, in]`.
pub(crate) fn weight_rows(t: &HostF32, k: usize, out: usize) -> Option<&[f32]> {
    if t.shape() != [k, out] {
        return None;
    }
    t.values_with_strides(&[1, k])
}

/// `y` (`[rows, out]`, row-major) from `yt` (`[out, rows]`), the layout in which
/// each parallel task owns a contiguous block of outputs.
pub(crate) fn untranspose(yt: &[f32], rows: usize, out: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * out];
    for (o, col) in yt.chunks_exact(rows).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * out + o] = *v;
        }
    }
    y
}

/// One block of output columns: `yt[o, r] = w[o] · x[r]` (`gemm_f32_f32` of
/// [`super::dispatch`], at each instruction set's width).
pub(crate) struct Block<'a> {
    pub w: &'a [f32],
    pub k: usize,
    pub x: &'a [f32],
    pub rows: usize,
    pub yt: &'a mut [f32],
}

impl WithSimd for Block<'_> {
    type Output = ();

    /// Tiles of [`OUT_TILE`] weight rows × [`ROW_TILE`] rows of `x`: per
    /// vector of `k`, 4 + 2 loads feed 8 independent FMA chains, so the FMA
    /// units, not the loads, set the pace (a 1 × 4 tile needs 5 loads for 4
    /// FMAs). The weight rows come from memory once; the tile's other rows
    /// of `x` find them in L1.
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Block { w, k, x, rows, yt } = self;
        let n_out = w.len() / k;
        let mut o = 0;
        while o < n_out {
            let width = if n_out - o >= OUT_TILE { OUT_TILE } else { 1 };
            let wo = &w[o * k..(o + width) * k];
            let mut r = 0;
            while r < rows {
                let height = (rows - r).min(ROW_TILE);
                let xr = &x[r * k..(r + height) * k];
                match (width, height) {
                    (OUT_TILE, ROW_TILE) => put(
                        yt,
                        rows,
                        o,
                        r,
                        tile::<S, OUT_TILE, ROW_TILE>(simd, wo, xr, k),
                    ),
                    (OUT_TILE, _) => put(yt, rows, o, r, tile::<S, OUT_TILE, 1>(simd, wo, xr, k)),
                    (_, ROW_TILE) => put(yt, rows, o, r, tile::<S, 1, ROW_TILE>(simd, wo, xr, k)),
                    _ => put(yt, rows, o, r, tile::<S, 1, 1>(simd, wo, xr, k)),
                }
                r += height;
            }
            o += width;
        }
    }
}

/// Weight rows per tile.
const OUT_TILE: usize = 4;
/// Rows of `x` per tile.
const ROW_TILE: usize = 2;

/// Stores a tile's dot products at `yt[o + i, r + j]`.
#[inline(always)]
fn put<const O: usize, const R: usize>(
    yt: &mut [f32],
    rows: usize,
    o: usize,
    r: usize,
    t: [[f32; R]; O],
) {
    for (i, ti) in t.iter().enumerate() {
        yt[(o + i) * rows + r..][..R].copy_from_slice(ti);
    }
}

/// `[w_i · x_j]` for the `O` rows of `w` and `R` rows of `x` (each `k` long).
///
/// Plain loops over const-sized arrays, no closures: a closure that is not
/// inlined into pulp's `#[target_feature]` frame compiles its intrinsics as
/// out-of-line calls, which are slow in the reductions.
#[inline(always)]
fn tile<S: Simd, const O: usize, const R: usize>(
    simd: S,
    w: &[f32],
    x: &[f32],
    k: usize,
) -> [[f32; R]; O] {
    let empty: (&[S::f32s], &[f32]) = (&[], &[]);
    let mut ws = [empty; O];
    for i in 0..O {
        ws[i] = S::as_simd_f32s(&w[i * k..][..k]);
    }
    let mut xs = [empty; R];
    for j in 0..R {
        xs[j] = S::as_simd_f32s(&x[j * k..][..k]);
    }
    let n = ws[0].0.len();
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; R]; O];
    for v in 0..n {
        let mut xl = [zero; R];
        for j in 0..R {
            xl[j] = xs[j].0[v];
        }
        for i in 0..O {
            let wl = ws[i].0[v];
            for j in 0..R {
                acc[i][j] = simd.mul_add_e_f32s(wl, xl[j], acc[i][j]);
            }
        }
    }
    let mut out = [[0.0f32; R]; O];
    for i in 0..O {
        for j in 0..R {
            let mut s = simd.reduce_sum_f32s(acc[i][j]);
            for (a, b) in ws[i].1.iter().zip(xs[j].1) {
                s = a.mul_add(*b, s);
            }
            out[i][j] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests;
