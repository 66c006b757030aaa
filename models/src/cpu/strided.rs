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
//! Determinism: [`matmul`]'s result has the same bits at every thread
//! count and from run to run. Its partition of the output into tiles is a
//! function of the product's shape alone, never of the thread count: the
//! output is halved (by columns, or by rows where it is narrow) and each
//! half cut into tiles of at most [`TILE_ROWS`] × [`TILE_COLS`]; rayon only schedules the fixed tiles, and every output
//! element is computed by one single-threaded `gemm` call.
//!
//! Why the partition has to be fixed: an element's bits depend on the shape
//! of the `gemm` call that computes it. `gemm` 0.19 blocks a sum of more
//! than 512 terms into `kc`-term blocks, and chooses `kc` by the call's
//! shape: a call of at most 64 rows and 64 columns takes blocks of 512
//! terms and then the rest, a larger one blocks `k` evenly (a `kc` from
//! `k` and the L1 cache's geometry). A call of at most 256 elements (with
//! some layouts), a single row or column, or a sum of at most 2 terms takes
//! yet other kernels. So a half is cut only into tiles of its own class
//! (a half of another kernel stays whole), and the tiles' bits are the
//! half's bits.
//!
//! The bits still depend on the CPU: `gemm`'s kernels follow the
//! instruction set, and its even `kc` follows the L1 cache's geometry.
//!
//! Why columns first: `gemm` packs the right-hand operand (the weight, in
//! the step's products) into panels before it multiplies. Split by rows,
//! every tile packs all of its columns for its share of the rows; split by
//! columns, each packs only its own columns.

use std::ops::Range;

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

/// Rows per parallel task of a pass over `m` rows (a multiple of 8): the
/// rows split evenly over rayon's threads. The split follows the thread
/// count, so it serves only passes whose rows are computed independently
/// (a row's bits do not depend on the rows beside it); [`matmul`]'s
/// partition does not use it.
pub fn rows_per_task(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(threads).next_multiple_of(8).max(8)
}

/// Columns per half below which [`matmul`] halves a product by rows
/// instead: a half this narrow would leave `gemm`'s packed kernels for its
/// small-product paths, and saves little packing.
pub const MIN_TASK_COLS: usize = 64;

/// Rows of a tile of [`matmul`]'s partition, at most (a multiple of 8,
/// the packed kernels' row tile); a last run of fewer rows joins the tile
/// before it.
pub const TILE_ROWS: usize = 256;

/// Columns of a tile of [`matmul`]'s partition, at most (a multiple of 16,
/// one vector of f32 lanes, and more than [`MIN_TASK_COLS`]); a last run
/// of [`MIN_TASK_COLS`] columns or fewer joins the tile before it.
pub const TILE_COLS: usize = 128;

/// The most rows and columns of a `gemm` call that blocks its sum by 512
/// terms and then the rest, rather than evenly.
const SMALL_SIDE: usize = 64;

/// The most elements of a `gemm` call that may take its horizontal
/// kernels (another order of the sum).
const HORIZONTAL_MAX: usize = 256;

/// A block of a product's output: rows `rows`, columns `cols`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tile {
    rows: Range<usize>,
    cols: Range<usize>,
}

/// Columns per half of a column split of `n` columns (a multiple of 16),
/// where the second half gets more than [`MIN_TASK_COLS`].
fn cols_per_half(n: usize) -> Option<usize> {
    let per = n.div_ceil(2).next_multiple_of(16);
    (per < n && n - per > MIN_TASK_COLS).then_some(per)
}

/// The halves of an `[m, n]` output: by columns where `m ≥ 16` and each
/// half keeps more than [`MIN_TASK_COLS`] columns, else by rows (halves of
/// a multiple of 8 rows; one part where `m ≤ 8`).
fn halves(m: usize, n: usize) -> Vec<Tile> {
    if let Some(per) = cols_per_half(n).filter(|_| m >= 16) {
        return vec![
            Tile {
                rows: 0..m,
                cols: 0..per,
            },
            Tile {
                rows: 0..m,
                cols: per..n,
            },
        ];
    }
    let per = m.div_ceil(2).next_multiple_of(8).max(8);
    (0..m)
        .step_by(per)
        .map(|first| Tile {
            rows: first..(first + per).min(m),
            cols: 0..n,
        })
        .collect()
}

/// `range` in runs of `size`, a last run shorter than `min` joined to the
/// run before it.
fn runs(range: Range<usize>, size: usize, min: usize) -> Vec<Range<usize>> {
    let end = range.end;
    let mut out: Vec<Range<usize>> = range
        .step_by(size)
        .map(|first| first..(first + size).min(end))
        .collect();
    if out.len() >= 2 && out.last().is_some_and(|r| r.len() < min) {
        let last = out.pop().expect("two runs");
        out.last_mut().expect("one run left").end = last.end;
    }
    out
}

/// The partition of an `[m, n]` output with sums of `k` terms into tiles,
/// one single-threaded `gemm` call each: a function of `(m, n, k)` alone.
///
/// First the output is halved ([`halves`]). A half that runs `gemm`'s
/// packed kernels (more than [`HORIZONTAL_MAX`] elements, at least 2 rows
/// and 2 columns, `k > 2`) is then cut into tiles of the same class, so
/// every element keeps its half's blocking of the sum:
/// - more than [`SMALL_SIDE`] columns and at least 8 rows: tiles of up to
///   [`TILE_ROWS`] rows (at least 8) by [`TILE_COLS`] columns (more than
///   [`SMALL_SIDE`]);
/// - else more than [`SMALL_SIDE`] rows and at least 4 columns: tiles of
///   up to [`TILE_ROWS`] rows (more than [`SMALL_SIDE`]), all its columns.
///
/// Either way a tile has more than [`SMALL_SIDE`] rows or columns, like
/// its half, and more than [`HORIZONTAL_MAX`] elements. Any other half
/// (one of at most [`SMALL_SIDE`] rows and columns, or a small-product
/// path's) is one tile.
fn tiles(m: usize, n: usize, k: usize) -> Vec<Tile> {
    let mut out = Vec::new();
    for half in halves(m, n) {
        let (rows, cols) = (half.rows.len(), half.cols.len());
        let packed = k > 2 && rows >= 2 && cols >= 2 && rows * cols > HORIZONTAL_MAX;
        if packed && cols > SMALL_SIDE && rows >= 8 {
            for r in runs(half.rows.clone(), TILE_ROWS, 8) {
                for c in runs(half.cols.clone(), TILE_COLS, SMALL_SIDE + 1) {
                    out.push(Tile {
                        rows: r.clone(),
                        cols: c,
                    });
                }
            }
        } else if packed && rows > SMALL_SIDE && cols >= 4 {
            for r in runs(half.rows.clone(), TILE_ROWS, SMALL_SIDE + 1) {
                out.push(Tile {
                    rows: r,
                    cols: half.cols.clone(),
                });
            }
        } else {
            out.push(half);
        }
    }
    out
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, `dst` row-major and
/// contiguous; its tiles (fixed by the shape, see the module docs) run over rayon's
/// threads, each one single-threaded [`gemm_into`] call, so the result has
/// the same bits at every thread count (see the module docs).
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
    let dst = &mut dst[..m * n];
    let blocks = dst_blocks(dst, n, tiles(m, n, k));
    if let [one] = &blocks[..] {
        one.gemm(k, accumulate, beta, lhs, rhs);
        return;
    }
    blocks
        .into_par_iter()
        .for_each(|block| block.gemm(k, accumulate, beta, lhs, rhs));
}

/// One tile of a row-major `[m, n]` destination, written by one task:
/// tiles of one destination touch disjoint elements, so tasks write them in
/// parallel.
struct DstBlock<'a> {
    /// The destination's first element.
    base: *mut f32,
    /// The destination's elements.
    len: usize,
    n: usize,
    tile: Tile,
    _dst: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a block writes only its own tile of a destination that its
// lifetime borrows mutably; no two blocks share an element.
#[allow(unsafe_code)]
unsafe impl Send for DstBlock<'_> {}

/// `dst` (`[.., n]` row-major) as blocks of the given tiles, which must be
/// disjoint and lie inside it.
fn dst_blocks(dst: &mut [f32], n: usize, tiles: Vec<Tile>) -> Vec<DstBlock<'_>> {
    let m = dst.len() / n;
    let base = dst.as_mut_ptr();
    tiles
        .into_iter()
        .map(|tile| {
            assert!(
                tile.rows.end <= m && tile.cols.end <= n,
                "tile inside the destination"
            );
            DstBlock {
                base,
                len: dst.len(),
                n,
                tile,
                _dst: std::marker::PhantomData,
            }
        })
        .collect()
}

impl DstBlock<'_> {
    /// `gemm_into`'s product of this block's rows of `lhs` and columns of
    /// `rhs` into its tile.
    fn gemm(&self, k: usize, accumulate: bool, beta: f32, lhs: Mat<'_>, rhs: Mat<'_>) {
        let Tile { rows, cols } = &self.tile;
        if rows.is_empty() || cols.is_empty() {
            return;
        }
        let first = rows.start * self.n + cols.start;
        // The tile's last element lies inside the destination.
        assert!((rows.end - 1) * self.n + cols.end <= self.len);
        // SAFETY: `base..base + len` is a destination borrowed mutably for
        // this block's lifetime; this block's elements (rows `rows`,
        // columns `cols`, checked above to lie inside it) are written by no
        // other block (the tiles are disjoint), and nothing reads them while
        // the blocks live.
        #[allow(unsafe_code)]
        unsafe {
            gemm_raw(
                self.base.add(first),
                self.n,
                rows.len(),
                cols.len(),
                k,
                accumulate,
                beta,
                lhs.skip_rows(rows.start),
                rhs.skip_cols(cols.start),
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
mod tests;
