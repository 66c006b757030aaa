//! f32 products of many rows with strided operands, on the `gemm` crate's
//! packed kernels (the ones burn-flex's matmul runs, so a step of many
//! rows multiplies with the same kernels whether it infers or trains).
//!
//! Why a second entry beside [`super::dense`]: the host training step
//! multiplies every weight by all of a step's tokens (hundreds of rows), so
//! its products are bound by arithmetic, not by reading the weights, and
//! its backward pass multiplies by transposed operands (`dx = dy · W`,
//! `dA = x̃ᵀ · …`, attention's `Pᵀ · dO`). An operand here is any strided
//! view ([`Mat`]), so no transpose is ever copied.
//!
//! Determinism: [`matmul`] splits the output rows over rayon's threads, each
//! part one single-threaded `gemm` call; every output element is computed
//! by one call, in one order of its sum, whatever the number of threads.

use rayon::prelude::*;

/// A matrix operand: element `(row, col)` is `data[row · rs + col · cs]`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    /// The values.
    pub data: &'a [f32],
    /// The stride between rows.
    pub rs: usize,
    /// The stride between columns.
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
pub fn rows_per_task(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(threads).next_multiple_of(8).max(8)
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, `dst` row-major and
/// contiguous; the rows are split over rayon's threads, each part one
/// single-threaded [`gemm_into`] call.
///
/// # Panics
/// Where `dst` is shorter than `m · n` or an operand does not reach its
/// last element (see [`gemm_into`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
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
///
/// # Panics
/// Where an index the product would read or write lies outside its slice
/// (checked before the kernel runs).
#[allow(clippy::too_many_arguments)]
pub fn gemm_into(
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
    #[should_panic(expected = "rhs out of range")]
    fn an_operand_too_short_is_refused_before_the_kernel_runs() {
        let a = values(4 * 3, 1);
        let b = values(3 * 2, 2);
        let mut dst = vec![0.0; 4 * 3];
        gemm_into(
            &mut dst,
            3,
            4,
            3,
            3,
            false,
            1.0,
            Mat::rows(&a, 3),
            Mat::rows(&b, 3),
        );
    }
}
