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
//! Determinism: [`matmul`] splits the output over rayon's threads, by
//! columns where every part keeps more than [`MIN_TASK_COLS`] of them, else
//! by rows, each part one single-threaded `gemm` call. Every output element
//! is computed by one call; where every part runs `gemm`'s packed kernels
//! (not its paths for a few rows and columns), in one order of its sum
//! whichever way the product is split, since `gemm` blocks the sum by `k`
//! alone there.
//!
//! Why columns first: `gemm` packs the right-hand operand (the weight, in
//! the step's products) into panels before it multiplies. Split by rows,
//! every thread packs all of it for its share of the rows; split by
//! columns, each packs only its own columns, once for all the rows.

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

    /// The operand from column `first` on.
    fn skip_cols(self, first: usize) -> Self {
        Self {
            data: &self.data[first * self.cs..],
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

/// Columns per parallel task below which [`matmul`] splits by rows instead:
/// a part this narrow would leave `gemm`'s packed kernels for its
/// small-product paths (another blocking of the sum), and saves little
/// packing.
pub const MIN_TASK_COLS: usize = 64;

/// Columns per task of a column split of `n` columns over `threads`
/// threads (a multiple of 16, one vector of f32 lanes), where there are at
/// least two tasks and every task gets more than [`MIN_TASK_COLS`].
fn cols_per_task(n: usize, threads: usize) -> Option<usize> {
    if threads < 2 {
        return None;
    }
    let per = n.div_ceil(threads).next_multiple_of(16);
    let tasks = n.div_ceil(per);
    let last = n - (tasks - 1) * per;
    (tasks >= 2 && last > MIN_TASK_COLS).then_some(per)
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, `dst` row-major and
/// contiguous; split over rayon's threads by columns or rows (see the
/// module docs), each part one single-threaded [`gemm_into`] call.
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
    if let Some(per) = cols_per_task(n, rayon::current_num_threads()).filter(|_| m >= 16) {
        let dst = &mut dst[..m * n];
        let parts = column_blocks(dst, m, n, per);
        parts.into_par_iter().for_each(|part| {
            let first = part.first;
            part.gemm(k, accumulate, beta, lhs, rhs.skip_cols(first));
        });
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

/// One block of columns `first..first + cols` of a row-major `[m, n]`
/// destination, written by one task: blocks of one destination touch
/// disjoint elements, so tasks write them in parallel.
struct ColumnBlock<'a> {
    /// The destination from its column `first` of row 0 to its end.
    base: *mut f32,
    /// Elements from `base` to the destination's end.
    len: usize,
    m: usize,
    n: usize,
    first: usize,
    cols: usize,
    _dst: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a block writes only its own columns of a destination that its
// lifetime borrows mutably; no two blocks share an element.
#[allow(unsafe_code)]
unsafe impl Send for ColumnBlock<'_> {}

/// `dst` (`[m, n]` row-major) as blocks of `per` columns.
fn column_blocks(dst: &mut [f32], m: usize, n: usize, per: usize) -> Vec<ColumnBlock<'_>> {
    assert!(dst.len() == m * n, "destination of m · n elements");
    let base = dst.as_mut_ptr();
    (0..n)
        .step_by(per)
        .map(|first| ColumnBlock {
            // In bounds: `first < n ≤ m · n`.
            base: base.wrapping_add(first),
            len: m * n - first,
            m,
            n,
            first,
            cols: per.min(n - first),
            _dst: std::marker::PhantomData,
        })
        .collect()
}

impl ColumnBlock<'_> {
    /// `gemm_into`'s product into this block's columns.
    fn gemm(self, k: usize, accumulate: bool, beta: f32, lhs: Mat<'_>, rhs: Mat<'_>) {
        // The block's last element, `(m − 1) · n + cols − 1` past `base`,
        // lies inside the destination.
        assert!((self.m - 1) * self.n + self.cols <= self.len);
        // SAFETY: `base..base + len` is the tail of a destination borrowed
        // mutably for this block's lifetime; this block's elements (rows of
        // `cols` from `base`, `n` apart) are written by no other block, and
        // nothing reads them while the blocks live.
        #[allow(unsafe_code)]
        unsafe {
            gemm_raw(
                self.base, self.n, self.m, self.cols, k, accumulate, beta, lhs, rhs,
            );
        }
    }
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
    assert!(
        (m - 1) * dst_rs + n <= dst.len(),
        "destination out of range"
    );
    // SAFETY: the elements written, `i · dst_rs + j` for `i < m`, `j < n`,
    // were checked above to lie inside `dst`, which is borrowed mutably, so
    // nothing aliases them.
    #[allow(unsafe_code)]
    unsafe {
        gemm_raw(
            dst.as_mut_ptr(),
            dst_rs,
            m,
            n,
            k,
            accumulate,
            beta,
            lhs,
            rhs,
        );
    }
}

/// [`gemm_into`] into a raw destination; the operands are checked here.
///
/// # Safety
/// `dst + i · dst_rs + j` must be valid for reads and writes for every
/// `i < m`, `j < n`, and no other reference may access those elements
/// during the call.
///
/// # Panics
/// Where an index the product would read lies outside its operand
/// (checked before the kernel runs).
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn gemm_raw(
    dst: *mut f32,
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
    if k > 0 {
        assert!(last(&lhs, m, k) < lhs.data.len(), "lhs out of range");
        assert!(last(&rhs, k, n) < rhs.data.len(), "rhs out of range");
    }
    // SAFETY: the operands' indices were checked above, the destination's
    // are the caller's to guarantee. (The `gemm` crate's entry point takes
    // raw pointers and strides.)
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
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

    /// A split product has the bits of one unsplit `gemm` call, whichever
    /// way (columns or rows) and into however many parts it is split, on
    /// shapes whose parts all run `gemm`'s packed kernels (a part of a few
    /// rows and columns takes its small-product paths, which sum in
    /// another order).
    #[test]
    fn a_split_product_keeps_the_unsplit_bits() {
        // (m, n, k): column splits with one or more blocks of the sum
        // (k > 512), row splits (n too narrow), and an uneven last part.
        for (m, n, k) in [
            (48, 300, 600),
            (512, 192, 70),
            (16, 130, 1500),
            (100, 40, 300),
            (24, 128, 9),
            (200, 150, 40),
        ] {
            let a = values(m * k, 3);
            let b = values(k * n, 4);
            let mut bt = vec![0.0; k * n];
            for l in 0..k {
                for j in 0..n {
                    bt[j * k + l] = b[l * n + j];
                }
            }
            for rhs in [Mat::rows(&b, n), Mat::transposed(&bt, k)] {
                let mut want = values(m * n, 5);
                gemm_into(&mut want, n, m, n, k, true, 0.5, Mat::rows(&a, k), rhs);
                for threads in 1..=3 {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let mut got = values(m * n, 5);
                    pool.install(|| {
                        matmul(&mut got, m, n, k, true, 0.5, Mat::rows(&a, k), rhs);
                    });
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{m}×{n}×{k} on {threads} threads");
                }
            }
        }
    }

    #[test]
    fn columns_split_only_into_wide_parts() {
        assert_eq!(cols_per_task(576, 2), Some(288));
        assert_eq!(cols_per_task(49_152, 2), Some(24_576));
        assert_eq!(cols_per_task(300, 3), Some(112));
        assert_eq!(cols_per_task(200, 3), None);
        // A part of 64 columns or fewer, or one thread: rows instead.
        assert_eq!(cols_per_task(128, 2), None);
        assert_eq!(cols_per_task(140, 2), None);
        assert_eq!(cols_per_task(576, 1), None);
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
