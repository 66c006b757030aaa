//! The row update shared by every factor type: `y += Σ_j (x · Aᵀ_j) B_j`, four
//! ranks at a time, over rows of factors read through [`FactorRow`]. Below both
//! the parent module (f32 factors, f16 widened entry by entry) and `half_rows`
//! (f16 widened on AVX-512), which implement [`FactorRow`] for their rows.

use pulp::Simd;

/// `y += Σ_{j < rank} (x · Aᵀ_j) B_j`, four ranks at a time, with rank
/// `j`'s rows of `Aᵀ` and `B` read through `a(j)` and `b(j)`.
#[inline(always)]
pub(super) fn add_rank_groups<S: Simd, R: FactorRow<S>>(
    simd: S,
    rank: usize,
    x: &[f32],
    (a, b): (&impl Fn(usize) -> R, &impl Fn(usize) -> R),
    y: &mut [f32],
) {
    for first in (0..rank).step_by(4) {
        match rank - first {
            1 => add_ranks::<S, R, 1>(simd, x, (a, b), first, y),
            2 => add_ranks::<S, R, 2>(simd, x, (a, b), first, y),
            3 => add_ranks::<S, R, 3>(simd, x, (a, b), first, y),
            _ => add_ranks::<S, R, 4>(simd, x, (a, b), first, y),
        }
    }
}

/// One rank's row of `Aᵀ` or `B` as [`add_ranks`] reads it: whole vectors,
/// then the entries of the tail past them.
pub(super) trait FactorRow<S: Simd>: Copy {
    /// Vector `v` (entries `v · lanes ..`), widened to f32.
    fn vector(self, simd: S, v: usize) -> S::f32s;
    /// Entry `i` of the tail past the whole vectors.
    fn tail(self, i: usize) -> f32;
}

/// `y += Σ_{j < K} (x · Aᵀ_{first+j}) B_{first+j}`; see `AddRow` (in the parent module).
#[inline(always)]
fn add_ranks<S: Simd, R: FactorRow<S>, const K: usize>(
    simd: S,
    x: &[f32],
    (a, b): (&impl Fn(usize) -> R, &impl Fn(usize) -> R),
    first: usize,
    y: &mut [f32],
) {
    let rows_a: [R; K] = std::array::from_fn(|j| a(first + j));
    let rows_b: [R; K] = std::array::from_fn(|j| b(first + j));
    // u_j, as `dot` sums it: lane by lane, then across lanes, then the tail.
    let (xv, xt) = S::as_simd_f32s(x);
    let mut acc = [simd.splat_f32s(0.0); K];
    for (v, xi) in xv.iter().enumerate() {
        for j in 0..K {
            acc[j] = simd.mul_add_e_f32s(*xi, rows_a[j].vector(simd, v), acc[j]);
        }
    }
    let mut u = [0.0f32; K];
    for j in 0..K {
        u[j] = simd.reduce_sum_f32s(acc[j]);
        for (i, p) in xt.iter().enumerate() {
            u[j] += p * rows_a[j].tail(i);
        }
    }
    // y += u_j B_j, each entry's updates in the order of j, as `axpy` does.
    let (yv, yt) = S::as_mut_simd_f32s(y);
    let uv = u.map(|u| simd.splat_f32s(u));
    for (v, yi) in yv.iter_mut().enumerate() {
        for j in 0..K {
            *yi = simd.mul_add_e_f32s(uv[j], rows_b[j].vector(simd, v), *yi);
        }
    }
    for (i, yi) in yt.iter_mut().enumerate() {
        for j in 0..K {
            *yi += u[j] * rows_b[j].tail(i);
        }
    }
}
