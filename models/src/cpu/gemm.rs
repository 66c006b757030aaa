//! The products of each weight format with rows of `x`: the work split
//! over rayon's threads, and each piece handed to the kernel that
//! [`super::dispatch`] chooses for the weight's and the activations'
//! formats (looked up once per product).

use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use rayon::prelude::*;

use crate::backend::ModelBackend;

use super::dense::{DENSE_BLOCK, untranspose, weight_rows};
use super::dispatch::{self, ActivationFormat, Isa, Kernel, KernelEntry, WeightFormat};
use super::quants::{BlockWeight, Q8Parts, Q8Row, Q8Rows};
use super::repack::TiledWeight;
use super::tiles_f32::InterleavedRows;
use super::{COLUMN_UNIT, PARALLEL_MIN_WORK, TILE};

impl BlockWeight {
    /// `x Wᵀ` for row-major `x: [rows, in]`, as row-major `[rows, out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(x, rows, self.f32_kernel())
    }

    /// [`BlockWeight::matmul`] by the kernel `entry`.
    pub(crate) fn matmul_with(&self, x: &[f32], rows: usize, entry: &KernelEntry) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.inp);
        if rows == 0 {
            return Vec::new();
        }
        let mut y = vec![0.0f32; rows * self.out];
        // One task per thread (rounded to whole column units) where the
        // work is worth a split.
        let threads = if self.q.len() * rows >= PARALLEL_MIN_WORK {
            rayon::current_num_threads().max(1)
        } else {
            1
        };
        let per_task = self.out.div_ceil(threads).div_ceil(COLUMN_UNIT) * COLUMN_UNIT;
        // Task t writes columns [t·per_task, (t+1)·per_task) of every row of
        // y: its pieces of the rows, split off without copies.
        let tasks = self.out.div_ceil(per_task);
        let mut pieces: Vec<Vec<&mut [f32]>> =
            (0..tasks).map(|_| Vec::with_capacity(rows)).collect();
        for row in y.chunks_exact_mut(self.out) {
            for (t, piece) in row.chunks_mut(per_task).enumerate() {
                pieces[t].push(piece);
            }
        }
        crate::runtime::for_each_task(pieces, |index, y: Vec<&mut [f32]>| {
            run_blocks(entry, self, x, index * per_task, y);
        });
        y
    }

    /// Output columns `first..` (`first` a multiple of [`COLUMN_UNIT`]; as
    /// many as `y[r]` has room for) of every row of `x`, written into
    /// `y[r]`: the same values as those columns of
    /// [`BlockWeight::matmul`], on the calling thread.
    pub(crate) fn columns_into(&self, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
        debug_assert_eq!(first % COLUMN_UNIT, 0);
        run_blocks(self.f32_kernel(), self, x, first, y);
    }

    /// This CPU's kernel for the weight × f32 rows.
    fn f32_kernel(&self) -> &'static KernelEntry {
        dispatch::kernel_for(self.format(), ActivationFormat::F32).expect("a portable kernel")
    }
}

/// Columns `first..` of every row of `x` into `y` by `entry`.
fn run_blocks(entry: &KernelEntry, w: &BlockWeight, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
    debug_assert_eq!(entry.weight(), Some(w.format()));
    match entry.kernel {
        Kernel::BlocksF32(kernel) => kernel(w, x, first, y),
        _ => unreachable!("{entry} does not take block weights and f32 rows"),
    }
}

impl TiledWeight {
    /// `x Wᵀ` for row-major `x: [rows, in]`, as row-major `[rows, out]`, with
    /// `x` quantised to 8 bits per block first.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(x, rows, self.q8_kernel())
    }

    /// [`TiledWeight::matmul`] with the kernel of instruction set `isa` (or
    /// the widest the CPU has below it): the same bits as `matmul`, for
    /// comparing the instruction sets' kernels (`benches/forward.rs`).
    pub fn matmul_at_isa(&self, x: &[f32], rows: usize, isa: Isa) -> Vec<f32> {
        self.matmul_with(x, rows, self.q8_kernel_for(isa))
    }

    /// [`TiledWeight::matmul`] with the kernel `entry` (the tests run every
    /// instruction set's kernel; the results are the same bits).
    pub(crate) fn matmul_with(&self, x: &[f32], rows: usize, entry: &KernelEntry) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.in_features());
        if rows == 0 {
            return Vec::new();
        }
        self.matmul_q8_with(&Q8Rows::new(x, rows, self.in_features()), entry)
    }

    /// [`TiledWeight::matmul`] of rows quantised already (by
    /// [`Q8Rows::new`] or row by row, with this weight's input width).
    pub(crate) fn matmul_q8(&self, xq: &Q8Rows) -> Vec<f32> {
        self.matmul_q8_with(xq, self.q8_kernel())
    }

    /// Output columns `first..` (`first` a multiple of
    /// [`super::COLUMN_UNIT`]; as many as `y[r]` has room for, a multiple
    /// of it too) of every row of `xq`, written into `y[r]`: the same
    /// values as those columns of [`TiledWeight::matmul`], on the calling
    /// thread.
    pub(crate) fn q8_columns_into(&self, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
        debug_assert_eq!(first % TILE, 0);
        run_tiles_q8(self.q8_kernel(), self, xq, first / TILE, y);
    }

    /// This CPU's kernel for the weight × 8-bit rows.
    fn q8_kernel(&self) -> &'static KernelEntry {
        dispatch::kernel_for(self.format(), ActivationFormat::Q8_1).expect("a portable kernel")
    }

    /// The kernel for the weight × 8-bit rows of instruction set `isa` (or
    /// the widest the CPU has below it).
    pub(crate) fn q8_kernel_for(&self, isa: Isa) -> &'static KernelEntry {
        dispatch::kernel_for_isa(self.format(), ActivationFormat::Q8_1, isa)
            .expect("a portable kernel")
    }

    fn matmul_q8_with(&self, xq: &Q8Rows, entry: &KernelEntry) -> Vec<f32> {
        debug_assert_eq!(xq.inp, self.in_features());
        let (out, inp) = (self.out_features(), self.in_features());
        let rows = xq.q.len() / inp.max(1);
        if rows == 0 {
            return Vec::new();
        }
        let mut y = vec![0.0f32; rows * out];
        let tiles = out / TILE;
        let threads = if self.bytes_per_column() * out * rows >= PARALLEL_MIN_WORK {
            rayon::current_num_threads().clamp(1, tiles)
        } else {
            1
        };
        let per_task = tiles.div_ceil(threads);
        // Task t writes columns [t·per_task·16, (t+1)·per_task·16) of every row.
        let mut pieces: Vec<Vec<&mut [f32]>> = (0..tiles.div_ceil(per_task))
            .map(|_| Vec::with_capacity(rows))
            .collect();
        for row in y.chunks_exact_mut(out) {
            for (t, piece) in row.chunks_mut(per_task * TILE).enumerate() {
                pieces[t].push(piece);
            }
        }
        crate::runtime::for_each_task(pieces, |index, mut y: Vec<&mut [f32]>| {
            run_tiles_q8(entry, self, xq, index * per_task, &mut y);
        });
        y
    }

    /// `x Wᵀ` with f32 activations for row-major `x: [rows, in]`, as
    /// row-major `[rows, out]`, on the calling thread, by the tile × f32
    /// kernel ([`super::tiles_f32`]); `None` where the CPU has none
    /// (AVX-512 only).
    pub fn matmul_f32(&self, x: &[f32], rows: usize) -> Option<Vec<f32>> {
        let out = self.out_features();
        let mut y = vec![0.0f32; rows * out];
        if rows == 0 {
            return self.f32_kernel().is_some().then_some(y);
        }
        let mut views: Vec<&mut [f32]> = y.chunks_mut(out).collect();
        let xs = InterleavedRows::new(x, rows, self.in_features());
        self.f32_columns_into(&xs, 0, &mut views).then_some(y)
    }

    /// Output columns `first..` (`first` a multiple of 16; as many as
    /// `y[r]` has room for, a multiple of 16 too) of every row of `x`, on
    /// the calling thread, by the tile × f32 kernel. `false`, leaving `y`
    /// untouched, where the CPU has none.
    pub(crate) fn f32_columns_into(
        &self,
        x: &InterleavedRows,
        first: usize,
        y: &mut [&mut [f32]],
    ) -> bool {
        debug_assert_eq!(first % TILE, 0);
        debug_assert_eq!(x.inp, self.in_features());
        debug_assert_eq!(x.rows(), y.len());
        match self.f32_kernel().map(|e| e.kernel) {
            Some(Kernel::TilesF32(kernel)) => {
                kernel(self, x, first / TILE, y);
                true
            }
            _ => false,
        }
    }

    /// This CPU's kernel for the weight × f32 rows, if it has one.
    pub(crate) fn f32_kernel(&self) -> Option<&'static KernelEntry> {
        dispatch::kernel_for(self.format(), ActivationFormat::F32)
    }
}

impl Q8Rows {
    /// `x: [rows, inp]` quantised by this CPU's quantiser.
    pub(crate) fn new(x: &[f32], rows: usize, inp: usize) -> Self {
        let mut me = Self::zeroed(rows, inp);
        let parts = (
            &mut me.q[..],
            &mut me.d[..],
            &mut me.s[..],
            &mut me.biased[..],
        );
        quantize(dispatch::quantizer(), x, parts);
        me
    }
}

impl Q8Row<'_> {
    /// Quantises `x` (the row's width) into this row: the same values as
    /// [`Q8Rows::new`] gives that row.
    pub(crate) fn fill(&mut self, x: &[f32]) {
        quantize(dispatch::quantizer(), x, self.parts());
    }
}

/// `x` quantised into `parts` by the quantiser `entry`.
fn quantize(entry: &KernelEntry, x: &[f32], parts: Q8Parts<'_>) {
    match entry.kernel {
        Kernel::QuantizeQ8_1(quantize) => quantize(x, parts),
        _ => unreachable!("{entry} is not a quantiser"),
    }
}

/// `x Wᵀ` (`[rows, in]` → `[rows, out]`) where `B` keeps tensors in host
/// memory and `weight_t` is the `[in, out]` transposed view of a contiguous
/// f32 `[out, in]` tensor there (read in place through
/// [`ModelBackend::host_f32`]), or `None` where that does not hold (another
/// backend, autodiff, another layout or dtype): the caller then uses burn's
/// matmul. See [`super::dense`].
pub(crate) fn few_rows_matmul<B: ModelBackend>(
    x: &Tensor<B, 2>,
    weight_t: &Tensor<B, 2>,
) -> Option<Tensor<B, 2>> {
    let [rows, k] = x.dims();
    let [k_w, out] = weight_t.dims();
    // The product is a new tensor: only where the backend's tensors are
    // plain host memory (under autodiff it would leave the graph).
    if !B::KIND.is_host_memory() || k != k_w || rows == 0 || k == 0 || out == 0 {
        return None;
    }
    let w_prim = match weight_t.clone().into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => return None,
    };
    let w_host = B::host_f32(&w_prim)?;
    let w = weight_rows(&w_host, k, out)?;
    let xs = crate::runtime::to_vec(x.clone()).ok()?;
    if xs.len() != rows * k {
        return None;
    }
    let y = few_rows_times_weight_rows(&xs, rows, w, k, out);
    Some(Tensor::from_data(
        TensorData::new(y, [rows, out]),
        &x.device(),
    ))
}

/// `y[r, o] = Σ_j x[r, j] · w[o, j]` for row-major `x: [rows, k]` and
/// `w: [out, k]`, as row-major `[rows, out]`: each weight row read once, on
/// all cores (rayon over blocks of output rows).
pub(crate) fn few_rows_times_weight_rows(
    x: &[f32],
    rows: usize,
    w: &[f32],
    k: usize,
    out: usize,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(w.len(), out * k);
    let entry =
        dispatch::kernel_for(WeightFormat::F32, ActivationFormat::F32).expect("a portable kernel");
    let Kernel::DenseF32(kernel) = entry.kernel else {
        unreachable!("{entry} does not take f32 weights and rows")
    };
    // Computed as yᵀ ([out, rows]) so that each task owns a contiguous block.
    let mut yt = vec![0.0f32; out * rows];
    yt.par_chunks_mut(DENSE_BLOCK * rows)
        .zip(w.par_chunks(DENSE_BLOCK * k))
        .for_each(|(yt, w)| kernel(w, k, x, rows, yt));
    untranspose(&yt, rows, out)
}

/// Tiles `first..` of every row of `xq` into `y` by `entry`.
fn run_tiles_q8(
    entry: &KernelEntry,
    w: &TiledWeight,
    xq: &Q8Rows,
    first: usize,
    y: &mut [&mut [f32]],
) {
    debug_assert_eq!(entry.weight(), Some(w.format()));
    match entry.kernel {
        Kernel::TilesQ8(kernel) => kernel(w, xq, first, y),
        _ => unreachable!("{entry} does not take 8-bit rows"),
    }
}
