//! `x Wᵀ` for rows of `x` the way llama.cpp's CPU kernels take it for a Q4_1
//! or Q8_0 weight: each row of `x` is first quantised to 8 bits per block of
//! 32 values (one scale per block, llama.cpp's Q8_1/Q8_0 activation
//! formats), and every block's dot product is an exact integer sum, scaled
//! once in f32.
//!
//! Why: with many rows (an ensemble step has N + 1) the f32 kernel of
//! [`super::quantized`] is bound by the multiply-adds, 16 per AVX-512
//! instruction. An 8-bit product (`vpmaddubsw` + `vpmaddwd`) does 64 per two
//! instructions, and with the weights laid out 16 output rows to a register
//! (below) each block costs one conversion and two FMAs per 16 outputs
//! instead of 32 FMAs per 16 outputs. On SmolLM2's shapes, one thread
//! (`examples/qk`): 9 rows × [1536, 576] 99.4 → 33.2 µs; 1 row 20.7 →
//! 7.9 µs. The kernel prefetches the records 8 KB ahead, so that a product
//! read from memory overlaps its loads with its arithmetic.
//!
//! What it costs: the activations are rounded to 8 bits. Each block of `x`
//! is replaced by `x̂ = dₓ·q` with `dₓ = max|x|/127` and `q = round(x/dₓ)`
//! (ties to even), so `|x − x̂| ≤ dₓ/2` per entry and each output moves by at
//! most `Σ_b (dₓ,b/2)·Σ_{k∈b}|w_k|` from the product with the exact `x`
//! (checked by the tests). That is the size of llama.cpp's own rounding, not
//! the same rounding (llama.cpp rounds ties away from zero, keeps its KV
//! cache in f16 and sums in other orders): decoding SmolLM2 along
//! llama.cpp's greedy paths, the mean |Δ| of the top-20 log-probs from
//! llama.cpp's is 0.126 this way and 0.115 with f32 activations
//! (`tests/llama_cpp_agreement.rs`). It is opt-in:
//! [`crate::weights::DecodeProducts::Int8Activations`].
//!
//! Kernels: AVX-512 with VNNI, whose `vpdpbusd` does the 8-bit multiply
//! and both sums in one instruction (9 rows × [1536, 576]: 33.2 → 26.6 µs on
//! one thread; the Q8_0 head [49152, 576], 9 rows: 1.85 → 1.09 ms); AVX-512
//! without it (16 outputs per register); AVX2 (two halves of 8; forced on
//! this machine, 9 rows × [1536, 576] take 95 µs on one thread, where the
//! f32 kernel's AVX2 level took 154 µs at its last measurement); and a
//! portable one.
//!
//! The arithmetic, exactly (output `o`, row `r`, blocks `b`, in order):
//! `acc = fma(m_ob, s_rb, acc)` (Q4_1 only; `s_rb = dₓ,rb · Σ_k q_rbk`, as
//! llama.cpp's Q8_1 `s`), then `acc = fma(I_orb as f32, d_ob · dₓ,rb, acc)`
//! with `I_orb = Σ_k qw_obk · q_rbk` summed in integers (`|I| < 2²⁴`, so the
//! conversion is exact). Each kernel follows it step for step, so they
//! agree bit for bit (tested), and a row's result does not depend on the
//! other rows.
//!
//! Layout: the weight is stored in tiles of 16 output rows; a tile's block
//! `b` is one record whose register `j` holds, in 32-bit lane `i`, four
//! consecutive bytes of output row `i`'s block. One 8-bit multiply of that
//! register by four bytes of `x` broadcast to every lane then sums four
//! products of each of the 16 outputs into its own lane: no horizontal sums.
//! The scales stay f16, as in the file, so a record is as large as the
//! GGUF blocks it replaces (a decode step with one row reads every weight
//! once and is bound by their size).

use super::quantized::{QuantizedBlocks, QuantizedWeight};

/// Values per block, in the weights and in the quantised rows of `x`.
const QK: usize = 32;
/// Output rows per tile: the 16 32-bit lanes of an AVX-512 register.
const TILE: usize = 16;
/// Output columns are computed in runs of whole multiples of this
/// ([`Int8Weight::columns_into`]).
pub(crate) const COLUMN_UNIT: usize = TILE;
/// Bytes of a Q4_1 record: 4 registers of nibbles, 16 f16 scales, 16 f16 minima.
const Q4_1_RECORD: usize = 4 * 64 + 2 * 32;
/// Bytes of a Q8_0 record: 8 registers of signed bytes, 16 f16 scales.
const Q8_0_RECORD: usize = 8 * 64 + 32;
/// Most rows of `x` per pass over a tile (accumulators in registers).
const ROW_GROUP: usize = 12;
/// Products of at least this many bytes of records × rows are split over
/// rayon's threads (as in [`super::quantized`]).
const PARALLEL_MIN_WORK: usize = 128 << 10;

/// A Q4_1 or Q8_0 `[out, in]` weight in 16-row tiles, for products with
/// 8-bit activations (see the module documentation).
#[derive(Clone)]
pub struct Int8Weight {
    q4_1: bool,
    out: usize,
    inp: usize,
    /// Records, tile after tile, block after block within a tile.
    records: Vec<u8>,
}

impl std::fmt::Debug for Int8Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = if self.q4_1 { "Q4_1" } else { "Q8_0" };
        write!(f, "Int8Weight({format}, [{}, {}])", self.out, self.inp)
    }
}

impl Int8Weight {
    /// The weight's blocks rearranged into tiles, or `None` when its output
    /// width is not a multiple of 16 (the f32 kernel then serves it).
    pub fn from_quantized(w: &QuantizedWeight) -> Option<Self> {
        let (out, inp) = (w.out_features(), w.in_features());
        if out == 0 || !out.is_multiple_of(TILE) {
            return None;
        }
        let blocks = w.blocks();
        let q4_1 = matches!(blocks, QuantizedBlocks::Q4_1 { .. });
        let nb = inp / QK;
        let record = if q4_1 { Q4_1_RECORD } else { Q8_0_RECORD };
        let mut records = Vec::with_capacity(out / TILE * nb * record);
        // The scales were widened from f16 at load, so narrowing them back is exact.
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        for t in 0..out / TILE {
            for b in 0..nb {
                let at = |i: usize| (t * TILE + i) * nb + b;
                match blocks {
                    QuantizedBlocks::Q4_1 { q, scale, min } => {
                        for p in 0..4 {
                            for i in 0..TILE {
                                records.extend_from_slice(&q[at(i) * 16 + 4 * p..][..4]);
                            }
                        }
                        (0..TILE).for_each(|i| records.extend(f16(scale[at(i)])));
                        (0..TILE).for_each(|i| records.extend(f16(min[at(i)])));
                    }
                    QuantizedBlocks::Q8_0 { q, scale } => {
                        for j in 0..8 {
                            for i in 0..TILE {
                                records.extend_from_slice(&q[at(i) * QK + 4 * j..][..4]);
                            }
                        }
                        (0..TILE).for_each(|i| records.extend(f16(scale[at(i)])));
                    }
                }
            }
        }
        Some(Int8Weight {
            q4_1,
            out,
            inp,
            records,
        })
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    pub(super) fn record_bytes(&self) -> usize {
        if self.q4_1 { Q4_1_RECORD } else { Q8_0_RECORD }
    }

    /// Whether the blocks are Q4_1 (else Q8_0).
    pub(super) fn is_q4_1(&self) -> bool {
        self.q4_1
    }

    /// The records of tile `tile` and all after it.
    pub(super) fn tile_records(&self, tile: usize) -> &[u8] {
        &self.records[tile * (self.inp / QK) * self.record_bytes()..]
    }

    /// `x Wᵀ` for row-major `x: [rows, in]`, as row-major `[rows, out]`, with
    /// `x` quantised to 8 bits per block first.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_at(x, rows, Level::Widest)
    }

    /// [`Int8Weight::matmul`] with the kernel of `level` (the tests run
    /// every level the CPU has; the results are the same bits).
    fn matmul_at(&self, x: &[f32], rows: usize, level: Level) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.inp);
        if rows == 0 {
            return Vec::new();
        }
        self.matmul_quantized_at(&QuantizedRows::new(x, rows, self.inp), level)
    }

    /// [`Int8Weight::matmul`] of rows quantised already (by
    /// [`QuantizedRows::new`] or row by row, with this weight's input width).
    pub(crate) fn matmul_quantized(&self, xq: &QuantizedRows) -> Vec<f32> {
        self.matmul_quantized_at(xq, Level::Widest)
    }

    /// Output columns `first..` (`first` a multiple of [`COLUMN_UNIT`]; as
    /// many as `y[r]` has room for, a multiple of it too) of every row of
    /// `xq`, written into `y[r]`: the same values as those columns of
    /// [`Int8Weight::matmul`], on the calling thread.
    pub(crate) fn columns_into(&self, xq: &QuantizedRows, first: usize, y: &mut [&mut [f32]]) {
        debug_assert_eq!(first % TILE, 0);
        self.tiles_into(xq, first / TILE, y, Level::Widest);
    }

    /// Bytes of records per output column.
    pub(crate) fn bytes_per_column(&self) -> usize {
        self.records.len() / self.out.max(1)
    }

    fn matmul_quantized_at(&self, xq: &QuantizedRows, level: Level) -> Vec<f32> {
        debug_assert_eq!(xq.inp, self.inp);
        let rows = xq.q.len() / self.inp.max(1);
        if rows == 0 {
            return Vec::new();
        }
        let mut y = vec![0.0f32; rows * self.out];
        let tiles = self.out / TILE;
        let threads = if self.records.len() * rows >= PARALLEL_MIN_WORK {
            rayon::current_num_threads().clamp(1, tiles)
        } else {
            1
        };
        let per_task = tiles.div_ceil(threads);
        // Task t writes columns [t·per_task·16, (t+1)·per_task·16) of every row.
        let mut pieces: Vec<Vec<&mut [f32]>> = (0..tiles.div_ceil(per_task))
            .map(|_| Vec::with_capacity(rows))
            .collect();
        for row in y.chunks_exact_mut(self.out) {
            for (t, piece) in row.chunks_mut(per_task * TILE).enumerate() {
                pieces[t].push(piece);
            }
        }
        crate::runtime::for_each_task(pieces, |index, mut y: Vec<&mut [f32]>| {
            self.tiles_into(xq, index * per_task, &mut y, level);
        });
        y
    }

    /// Tiles `first..` (as many as `y[r]` has room for) of every row, by the
    /// widest kernel the CPU has that `level` allows.
    fn tiles_into(&self, xq: &QuantizedRows, first: usize, y: &mut [&mut [f32]], level: Level) {
        #[cfg(target_arch = "x86_64")]
        {
            if level == Level::Widest
                && let Some(kernel) = vnni::Kernel::new(self.q4_1, xq)
            {
                let simd = kernel.v4();
                let tiles = Tiles {
                    w: self,
                    first,
                    y,
                    kernel,
                };
                return <pulp::x86::V4 as pulp::Simd>::vectorize(simd, tiles);
            }
            if matches!(level, Level::Widest | Level::Avx512)
                && let Some(simd) = pulp::x86::V4::try_new()
            {
                let kernel = avx512::Kernel::new(simd, self.q4_1, xq);
                let tiles = Tiles {
                    w: self,
                    first,
                    y,
                    kernel,
                };
                return <pulp::x86::V4 as pulp::Simd>::vectorize(simd, tiles);
            }
            if level != Level::Portable
                && let Some(simd) = pulp::x86::V3::try_new()
            {
                let kernel = avx2::Kernel::new(simd, self.q4_1, xq);
                let tiles = Tiles {
                    w: self,
                    first,
                    y,
                    kernel,
                };
                return <pulp::x86::V3 as pulp::Simd>::vectorize(simd, tiles);
            }
        }
        let _ = level;
        let mut portable = Portable {
            q4_1: self.q4_1,
            xq,
        };
        self.for_each_tile(first, y, &mut portable);
    }

    /// Runs `kernel` over tiles `first..` (as many as `y[r]` has room for)
    /// and the rows in groups of at most its `GROUP` (≤ [`ROW_GROUP`]),
    /// writing each group's outputs into `y`. (A trait, not a closure: a closure's
    /// body need not be inlined into the SIMD frame, and the intrinsics must
    /// be.)
    #[inline(always)]
    fn for_each_tile<K: TileKernel>(&self, first: usize, y: &mut [&mut [f32]], kernel: &mut K) {
        let rows = y.len();
        let nb = self.inp / QK;
        let record = self.record_bytes();
        let groups = rows.div_ceil(K::GROUP);
        for t in 0..y[0].len() / TILE {
            // The tile's records and all after it (the kernel prefetches ahead).
            let tile = &self.records[(first + t) * nb * record..];
            let mut r = 0;
            for g in 0..groups {
                let size = rows / groups + usize::from(g < rows % groups);
                let mut out = [[0.0f32; TILE]; ROW_GROUP];
                kernel.run(tile, r..r + size, &mut out);
                for (j, o) in out.iter().take(size).enumerate() {
                    y[r + j][t * TILE..][..TILE].copy_from_slice(o);
                }
                r += size;
            }
        }
    }
}

/// Which kernels [`Int8Weight::matmul_at`] may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// AVX-512 with VNNI, else AVX-512, else AVX2, else portable.
    Widest,
    /// AVX-512 without VNNI, else AVX2, else portable.
    #[cfg_attr(not(test), allow(dead_code))]
    Avx512,
    /// AVX2, else portable.
    #[cfg_attr(not(test), allow(dead_code))]
    Avx2,
    /// The portable definition.
    #[cfg_attr(not(test), allow(dead_code))]
    Portable,
}

/// `out[j][i] = w_i · x_{rows.start + j}` over one tile (`tile`: its records).
trait TileKernel {
    /// Most rows per pass (≤ [`ROW_GROUP`]).
    const GROUP: usize;

    fn run(
        &mut self,
        tile: &[u8],
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; ROW_GROUP],
    );
}

/// [`tile_rows_portable`] as a [`TileKernel`].
struct Portable<'a> {
    q4_1: bool,
    xq: &'a QuantizedRows,
}

impl TileKernel for Portable<'_> {
    const GROUP: usize = ROW_GROUP;

    fn run(
        &mut self,
        tile: &[u8],
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; ROW_GROUP],
    ) {
        tile_rows_portable(self.q4_1, tile, self.xq, rows, out);
    }
}

/// [`Int8Weight::tiles_into`] with a SIMD `kernel`, run inside the frame of
/// the kernel's instruction set (pulp's `vectorize`).
#[cfg(target_arch = "x86_64")]
struct Tiles<'a, 'y, K> {
    w: &'a Int8Weight,
    first: usize,
    y: &'a mut [&'y mut [f32]],
    kernel: K,
}

#[cfg(target_arch = "x86_64")]
impl<K: TileKernel> pulp::WithSimd for Tiles<'_, '_, K> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Tiles {
            w,
            first,
            y,
            mut kernel,
        } = self;
        w.for_each_tile(first, y, &mut kernel);
    }
}

/// Rows of `x` quantised to 8 bits per block of 32 (llama.cpp's Q8_1 as
/// its SIMD code rounds: ties to even).
pub(crate) struct QuantizedRows {
    inp: usize,
    /// `q`, row after row.
    q: Vec<i8>,
    /// `dₓ` per row and block; NaN for a block holding a non-finite value,
    /// so that it reaches the outputs (as it would in an f32 product).
    d: Vec<f32>,
    /// `dₓ · Σq` per row and block.
    s: Vec<f32>,
    /// `q + 128` as unsigned bytes (`q`'s bits with the top one flipped),
    /// for the VNNI kernel's Q8_0 products.
    biased: Vec<u8>,
}

impl QuantizedRows {
    pub(crate) fn new(x: &[f32], rows: usize, inp: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            return simd
                .vectorize(|| Self::with(x, rows, inp, |x, q| avx512::quantize_block(simd, x, q)));
        }
        Self::with(x, rows, inp, quantize_block)
    }

    /// The rows quantised block by block by `quantize`.
    #[inline(always)]
    fn with(
        x: &[f32],
        rows: usize,
        inp: usize,
        quantize: impl FnMut(&[f32; QK], &mut [i8; QK]) -> (f32, f32),
    ) -> Self {
        let mut me = Self::zeroed(rows, inp);
        fill_blocks(
            x,
            (&mut me.q, &mut me.d, &mut me.s, &mut me.biased),
            quantize,
        );
        me
    }

    /// Room for `rows` rows of width `inp`, to be filled row by row
    /// (possibly on several threads) through [`QuantizedRows::rows_mut`].
    pub(crate) fn zeroed(rows: usize, inp: usize) -> Self {
        let blocks = rows * (inp / QK);
        QuantizedRows {
            inp,
            q: vec![0; rows * inp],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            biased: vec![0x80; rows * inp],
        }
    }

    /// Each row's parts, in order, for [`QuantizedRow::fill`].
    pub(crate) fn rows_mut(&mut self) -> impl Iterator<Item = QuantizedRow<'_>> {
        let (inp, nb) = (self.inp.max(1), (self.inp / QK).max(1));
        self.q
            .chunks_exact_mut(inp)
            .zip(self.biased.chunks_exact_mut(inp))
            .zip(self.d.chunks_exact_mut(nb).zip(self.s.chunks_exact_mut(nb)))
            .map(|((q, biased), (d, s))| QuantizedRow { q, d, s, biased })
    }
}

/// One row of a [`QuantizedRows`], to be filled.
pub(crate) struct QuantizedRow<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    biased: &'a mut [u8],
}

impl QuantizedRow<'_> {
    /// Quantises `x` (the row's width) into this row: the same values as
    /// [`QuantizedRows::new`] gives that row.
    pub(crate) fn fill(&mut self, x: &[f32]) {
        let parts = (&mut *self.q, &mut *self.d, &mut *self.s, &mut *self.biased);
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            return simd
                .vectorize(|| fill_blocks(x, parts, |x, q| avx512::quantize_block(simd, x, q)));
        }
        fill_blocks(x, parts, quantize_block);
    }
}

/// Quantises `x` block by block by `quantize` into `q`, `d`, `s` and the
/// biased copy of `q`.
#[inline(always)]
fn fill_blocks(
    x: &[f32],
    (q, d, s, biased): (&mut [i8], &mut [f32], &mut [f32], &mut [u8]),
    mut quantize: impl FnMut(&[f32; QK], &mut [i8; QK]) -> (f32, f32),
) {
    let parts = x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut().zip(s.iter_mut()));
    for ((xb, qb), (d, s)) in parts {
        let xb: &[f32; QK] = xb.try_into().expect("QK values");
        let qb: &mut [i8; QK] = qb.try_into().expect("QK values");
        (*d, *s) = quantize(xb, qb);
    }
    for (b, &v) in biased.iter_mut().zip(q.iter()) {
        *b = (v as u8) ^ 0x80;
    }
}

/// One block of `x`: `q = round(x/d)` with `d = max|x|/127`, so `|q| ≤ 127`.
/// Returns `(d, d·Σq)`.
fn quantize_block(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    if x.iter().any(|v| !v.is_finite()) {
        q.fill(0);
        return (f32::NAN, f32::NAN);
    }
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    // Below 127 times the least subnormal, d underflows to 0: the block is
    // taken as zeros (an error under 1e-43 per weight).
    let d = amax / 127.0;
    if d == 0.0 {
        q.fill(0);
        return (0.0, 0.0);
    }
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        // |x/d| ≤ 127·(1 + 2⁻²³), which rounds to at most 127.
        let v = (xi / d).round_ties_even() as i32;
        *qi = v as i8;
        sum += v;
    }
    (d, d * sum as f32)
}

/// `out[j][i] = w_i · x_{rows.start + j}` over one tile (`tile`: its
/// records), one output and block at a time: the definition the SIMD
/// kernel follows step for step.
fn tile_rows_portable(
    q4_1: bool,
    tile: &[u8],
    xq: &QuantizedRows,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; ROW_GROUP],
) {
    let nb = xq.inp / QK;
    let record = if q4_1 { Q4_1_RECORD } else { Q8_0_RECORD };
    let f16 = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    for (j, r) in rows.enumerate() {
        for i in 0..TILE {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let rec = &tile[b * record..][..record];
                let qx = &xq.q[r * xq.inp + b * QK..][..QK];
                let (dx, sx) = (xq.d[r * nb + b], xq.s[r * nb + b]);
                let mut isum = 0i32;
                for (k, &xk) in qx.iter().enumerate() {
                    let w = if q4_1 {
                        let byte = rec[(k % 16 / 4) * 64 + i * 4 + k % 4];
                        i32::from(if k < 16 { byte & 0x0f } else { byte >> 4 })
                    } else {
                        i32::from(rec[(k / 4) * 64 + i * 4 + k % 4] as i8)
                    };
                    isum += w * i32::from(xk);
                }
                if q4_1 {
                    acc = f16(&rec[256 + 32..], i).mul_add(sx, acc);
                    acc = (isum as f32).mul_add(f16(&rec[256..], i) * dx, acc);
                } else {
                    acc = (isum as f32).mul_add(f16(&rec[512..], i) * dx, acc);
                }
            }
            out[j][i] = acc;
        }
    }
}

/// The `Kernel` of a SIMD module: its `tile_rows::<Q4, R>` as a
/// [`TileKernel`] for groups of at most `$group` rows, dispatched on the
/// format and the group's size (`$r`: every size from 1 to `$group`).
#[cfg(target_arch = "x86_64")]
macro_rules! tile_kernel {
    ($simd:ty, $group:expr, $($r:literal)*) => {
        /// [`tile_rows`] as a [`super::TileKernel`].
        pub(super) struct Kernel<'a> {
            simd: $simd,
            q4_1: bool,
            xq: &'a QuantizedRows,
        }

        impl<'a> Kernel<'a> {
            pub(super) fn new(simd: $simd, q4_1: bool, xq: &'a QuantizedRows) -> Self {
                Kernel { simd, q4_1, xq }
            }
        }

        impl super::TileKernel for Kernel<'_> {
            const GROUP: usize = $group;

            #[inline(always)]
            fn run(
                &mut self,
                tile: &[u8],
                rows: std::ops::Range<usize>,
                out: &mut [[f32; TILE]; ROW_GROUP],
            ) {
                let Kernel { simd, q4_1, xq } = *self;
                match (q4_1, rows.len()) {
                    $((true, $r) => tile_rows::<true, $r>(simd, tile, xq, rows, out),
                      (false, $r) => tile_rows::<false, $r>(simd, tile, xq, rows, out),)*
                    _ => unreachable!("row groups hold 1 to {} rows", $group),
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The AVX-512 tile kernel, through pulp's safe intrinsics.

    use core::arch::x86_64::{__m256i, __m512, __m512i};

    use super::{QK, QuantizedRows, ROW_GROUP, TILE};

    /// How far ahead in the records the kernel prefetches.
    const PREFETCH_AHEAD: usize = 8 << 10;

    tile_kernel!(pulp::x86::V4, ROW_GROUP, 1 2 3 4 5 6 7 8 9 10 11 12);

    /// [`super::quantize_block`], with the same roundings: the largest
    /// magnitude, `x/d` divided and rounded to nearest even (the default
    /// rounding of `vcvtps2dq`), the integer sum.
    #[inline(always)]
    pub(super) fn quantize_block(
        simd: pulp::x86::V4,
        x: &[f32; QK],
        q: &mut [i8; QK],
    ) -> (f32, f32) {
        let f = simd.avx512f;
        let [x0, x1]: [__m512; 2] = bytemuck::cast(*x);
        let zero = f._mm512_setzero_ps();
        // x·0 is NaN exactly where x is NaN or infinite.
        let probe = f._mm512_add_ps(f._mm512_mul_ps(x0, zero), f._mm512_mul_ps(x1, zero));
        if f._mm512_cmp_ps_mask::<{ core::arch::x86_64::_CMP_UNORD_Q }>(probe, probe) != 0 {
            q.fill(0);
            return (f32::NAN, f32::NAN);
        }
        let amax =
            f._mm512_reduce_max_ps(f._mm512_max_ps(f._mm512_abs_ps(x0), f._mm512_abs_ps(x1)));
        let d = amax / 127.0;
        if d == 0.0 {
            q.fill(0);
            return (0.0, 0.0);
        }
        let dv = f._mm512_set1_ps(d);
        let q0 = f._mm512_cvtps_epi32(f._mm512_div_ps(x0, dv));
        let q1 = f._mm512_cvtps_epi32(f._mm512_div_ps(x1, dv));
        let sum = f._mm512_reduce_add_epi32(f._mm512_add_epi32(q0, q1));
        let bytes: [[i8; 16]; 2] = [
            bytemuck::cast(f._mm512_cvtepi32_epi8(q0)),
            bytemuck::cast(f._mm512_cvtepi32_epi8(q1)),
        ];
        *q = bytemuck::cast(bytes);
        (d, d * sum as f32)
    }

    /// 64 bytes of `b` from `at` as a register.
    #[inline(always)]
    pub(in crate::layers) fn load(b: &[u8], at: usize) -> __m512i {
        bytemuck::cast::<[u8; 64], __m512i>(b[at..at + 64].try_into().expect("64 bytes"))
    }

    /// 16 f16 values of `b` from `at`, widened.
    #[inline(always)]
    pub(in crate::layers) fn load_f16(simd: pulp::x86::V4, b: &[u8], at: usize) -> __m512 {
        let h = bytemuck::cast::<[u8; 32], __m256i>(b[at..at + 32].try_into().expect("32 bytes"));
        simd.avx512f._mm512_cvtph_ps(h)
    }

    /// Four bytes of a quantised row broadcast to every 32-bit lane.
    #[inline(always)]
    pub(super) fn splat4(simd: pulp::x86::V4, q: &[i8], at: usize) -> __m512i {
        let b: [i8; 4] = q[at..at + 4].try_into().expect("4 bytes");
        simd.avx512f
            ._mm512_set1_epi32(i32::from_le_bytes(b.map(|v| v as u8)))
    }

    /// Prefetches the `record` bytes [`PREFETCH_AHEAD`] on from `at` in
    /// `tile` (nothing past its end), so that memory latency overlaps with
    /// this block's products.
    #[inline(always)]
    pub(in crate::layers) fn prefetch_ahead(
        simd: pulp::x86::V4,
        tile: &[u8],
        at: usize,
        record: usize,
    ) {
        for line in (0..record).step_by(64) {
            if let Some(ahead) = tile.get(at + PREFETCH_AHEAD + line) {
                let at: *const u8 = ahead;
                simd.sse
                    ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
            }
        }
    }

    /// A Q4_1 record's nibbles as 8 registers: 0–3 hold entries 4p..4p+3
    /// (low nibbles) and 4–7 entries 16+4p..16+4p+3 (high nibbles) of each
    /// lane's output row.
    #[inline(always)]
    pub(super) fn q4_1_weights(simd: pulp::x86::V4, rec: &[u8]) -> [__m512i; 8] {
        let (f, bw) = (simd.avx512f, simd.avx512bw);
        let nibble = f._mm512_set1_epi8(0x0f);
        let mut w = [f._mm512_setzero_si512(); 8];
        for p in 0..4 {
            let v = load(rec, 64 * p);
            w[p] = f._mm512_and_si512(v, nibble);
            w[4 + p] = f._mm512_and_si512(bw._mm512_srli_epi16::<4>(v), nibble);
        }
        w
    }

    /// `out[j][i] = w_i · x_{rows.start + j}` over one tile, as
    /// [`super::tile_rows_portable`] computes it.
    #[inline(always)]
    fn tile_rows<const Q4: bool, const R: usize>(
        simd: pulp::x86::V4,
        tile: &[u8],
        xq: &QuantizedRows,
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; ROW_GROUP],
    ) {
        let (f, bw) = (simd.avx512f, simd.avx512bw);
        let nb = xq.inp / QK;
        let record = if Q4 {
            super::Q4_1_RECORD
        } else {
            super::Q8_0_RECORD
        };
        let ones = f._mm512_set1_epi16(1);
        let zero = f._mm512_setzero_si512();
        let mut acc = [f._mm512_setzero_ps(); R];
        for b in 0..nb {
            let rec = &tile[b * record..][..record];
            prefetch_ahead(simd, tile, b * record, record);
            let at = |j: usize| (rows.start + j) * nb + b;
            if Q4 {
                let w = q4_1_weights(simd, rec);
                let d = load_f16(simd, rec, 256);
                let m = load_f16(simd, rec, 288);
                for j in 0..R {
                    let qx = &xq.q[(rows.start + j) * xq.inp + b * QK..][..QK];
                    // Each 16-bit sum is at most 8 · 2 · 15 · 127 = 30480.
                    let mut s = bw._mm512_maddubs_epi16(w[0], splat4(simd, qx, 0));
                    for p in 1..8 {
                        let x = splat4(simd, qx, 4 * (p % 4) + 16 * (p / 4));
                        s = bw._mm512_add_epi16(s, bw._mm512_maddubs_epi16(w[p], x));
                    }
                    let i = f._mm512_cvtepi32_ps(bw._mm512_madd_epi16(s, ones));
                    let (dx, sx) = (xq.d[at(j)], xq.s[at(j)]);
                    acc[j] = f._mm512_fmadd_ps(m, f._mm512_set1_ps(sx), acc[j]);
                    let scale = f._mm512_mul_ps(d, f._mm512_set1_ps(dx));
                    acc[j] = f._mm512_fmadd_ps(i, scale, acc[j]);
                }
            } else {
                // Signed weights: |w| (unsigned) times x with w's sign, since
                // the 8-bit multiply takes one unsigned operand. Each 16-bit
                // sum is at most 2 · 128 · 127 = 32512, so each register's
                // is widened before the next is added.
                // Four registers at a time: their sign masks then fit the
                // mask registers (seven usable), which eight did not.
                let mut s = [zero; R];
                for half in 0..2 {
                    let mut w = [zero; 4];
                    let mut negative = [0u64; 4];
                    for p in 0..4 {
                        let v = load(rec, 64 * (4 * half + p));
                        w[p] = bw._mm512_abs_epi8(v);
                        negative[p] = bw._mm512_movepi8_mask(v);
                    }
                    for j in 0..R {
                        let qx = &xq.q[(rows.start + j) * xq.inp + b * QK..][..QK];
                        for p in 0..4 {
                            let x = splat4(simd, qx, 4 * (4 * half + p));
                            let x = bw._mm512_mask_sub_epi8(x, negative[p], zero, x);
                            let prod = bw._mm512_maddubs_epi16(w[p], x);
                            s[j] = f._mm512_add_epi32(s[j], bw._mm512_madd_epi16(prod, ones));
                        }
                    }
                }
                let d = load_f16(simd, rec, 512);
                for j in 0..R {
                    let i = f._mm512_cvtepi32_ps(s[j]);
                    let scale = f._mm512_mul_ps(d, f._mm512_set1_ps(xq.d[at(j)]));
                    acc[j] = f._mm512_fmadd_ps(i, scale, acc[j]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = bytemuck::cast(a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni {
    //! The AVX-512 tile kernel with VNNI's `vpdpbusd`, which sums four
    //! 8-bit products into each 32-bit lane in one instruction: the
    //! `vpmaddubsw` + `vpaddw` + `vpmaddwd` chain of [`super::avx512`] in
    //! one. Its unsigned operand is the Q4_1 nibbles, or for Q8_0 `x + 128`
    //! (the weights stay signed, so no sign trick per row is needed; `128·Σw`
    //! is subtracted once per block). Same integer sums (all exact), same f32
    //! steps after them, so the same bits.
    //!
    //! The one `unsafe` of the crate, and why: pulp 0.22 (through which
    //! every other kernel reaches its intrinsics safely) wraps no VNNI
    //! instruction. Rust's own intrinsics are safe inside a function
    //! compiled for their features, and calling such a function is safe
    //! only from one compiled for them too; [`Kernel`] is the bridge. It can
    //! only be made by [`Kernel::new`], after the CPU was seen to have every
    //! feature [`tile_rows`] is compiled for, so each call through it is
    //! sound.

    use core::arch::x86_64::{
        __m512i, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_mul_ps,
        _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_setzero_si512, _mm512_slli_epi32, _mm512_sub_epi32,
    };

    use super::avx512::{load, load_f16, prefetch_ahead, q4_1_weights, splat4};
    use super::{QK, QuantizedRows, ROW_GROUP, TILE};

    /// [`tile_rows`] as a [`super::TileKernel`], for a CPU known to have
    /// AVX-512 F/BW and VNNI.
    pub(super) struct Kernel<'a> {
        v4: pulp::x86::V4,
        q4_1: bool,
        xq: &'a QuantizedRows,
    }

    impl<'a> Kernel<'a> {
        /// The kernel, if this CPU has AVX-512 F/BW/VL and VNNI.
        pub(super) fn new(q4_1: bool, xq: &'a QuantizedRows) -> Option<Self> {
            let v4 = pulp::x86::V4::try_new()?;
            std::arch::is_x86_feature_detected!("avx512vnni").then_some(Kernel { v4, q4_1, xq })
        }

        /// The SIMD token whose frame the tile loop runs in.
        pub(super) fn v4(&self) -> pulp::x86::V4 {
            self.v4
        }
    }

    impl super::TileKernel for Kernel<'_> {
        const GROUP: usize = ROW_GROUP;

        #[inline(always)]
        fn run(
            &mut self,
            tile: &[u8],
            rows: std::ops::Range<usize>,
            out: &mut [[f32; TILE]; ROW_GROUP],
        ) {
            let Kernel { v4, q4_1, xq } = *self;
            macro_rules! dispatch {
                ($($r:literal)*) => {
                    match (q4_1, rows.len()) {
                        // SAFETY: a `Kernel` exists only where `Kernel::new`
                        // found AVX-512 F/BW/VL and VNNI on this CPU, every
                        // feature `tile_rows` is compiled for.
                        $((true, $r) => unsafe { tile_rows::<true, $r>(v4, tile, xq, rows, out) },
                          (false, $r) => unsafe { tile_rows::<false, $r>(v4, tile, xq, rows, out) },)*
                        _ => unreachable!("row groups hold 1 to {} rows", ROW_GROUP),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6 7 8 9 10 11 12)
        }
    }

    /// Four unsigned bytes broadcast to every 32-bit lane.
    #[target_feature(enable = "avx512f")]
    fn splat4_u8(q: &[u8], at: usize) -> __m512i {
        let b: [u8; 4] = q[at..at + 4].try_into().expect("4 bytes");
        _mm512_set1_epi32(i32::from_le_bytes(b))
    }

    /// `out[j][i] = w_i · x_{rows.start + j}` over one tile, as
    /// [`super::tile_rows_portable`] computes it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    fn tile_rows<const Q4: bool, const R: usize>(
        v4: pulp::x86::V4,
        tile: &[u8],
        xq: &QuantizedRows,
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; ROW_GROUP],
    ) {
        let nb = xq.inp / QK;
        let record = if Q4 {
            super::Q4_1_RECORD
        } else {
            super::Q8_0_RECORD
        };
        let ones = _mm512_set1_epi8(1);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let rec = &tile[b * record..][..record];
            prefetch_ahead(v4, tile, b * record, record);
            let at = |j: usize| (rows.start + j) * nb + b;
            if Q4 {
                let w = q4_1_weights(v4, rec);
                let d = load_f16(v4, rec, 256);
                let m = load_f16(v4, rec, 288);
                for j in 0..R {
                    let qx = &xq.q[(rows.start + j) * xq.inp + b * QK..][..QK];
                    let mut s = zero;
                    for (p, wp) in w.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(s, *wp, splat4(v4, qx, 4 * (p % 4) + 16 * (p / 4)));
                    }
                    let i = _mm512_cvtepi32_ps(s);
                    let (dx, sx) = (xq.d[at(j)], xq.s[at(j)]);
                    acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), acc[j]);
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
                    acc[j] = _mm512_fmadd_ps(i, scale, acc[j]);
                }
            } else {
                // `vpdpbusd` multiplies unsigned bytes by signed ones: it
                // takes x + 128 (unsigned) times the signed weights, and
                // 128·Σw is taken off after: Σ(x + 128)·w − 128·Σw = Σx·w,
                // in 32-bit integers (at most 32 · 255 · 128 in size).
                let mut w = [zero; 8];
                let mut sum_w = zero;
                for (p, wp) in w.iter_mut().enumerate() {
                    *wp = load(rec, 64 * p);
                    sum_w = _mm512_dpbusd_epi32(sum_w, ones, *wp);
                }
                let bias = _mm512_slli_epi32::<7>(sum_w);
                let mut s = [zero; R];
                for (j, sj) in s.iter_mut().enumerate() {
                    let qx = &xq.biased[(rows.start + j) * xq.inp + b * QK..][..QK];
                    let mut acc = zero;
                    for (p, wp) in w.iter().enumerate() {
                        acc = _mm512_dpbusd_epi32(acc, splat4_u8(qx, 4 * p), *wp);
                    }
                    *sj = _mm512_sub_epi32(acc, bias);
                }
                let d = load_f16(v4, rec, 512);
                for j in 0..R {
                    let i = _mm512_cvtepi32_ps(s[j]);
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(xq.d[at(j)]));
                    acc[j] = _mm512_fmadd_ps(i, scale, acc[j]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = bytemuck::cast(a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 tile kernel, through pulp's safe intrinsics: each tile in
    //! two halves of 8 outputs (one 256-bit register of lanes), rows in
    //! groups of [`ROW_GROUP_AVX2`] (AVX2 has 16 vector registers).

    use core::arch::x86_64::{__m128i, __m256, __m256i};

    use super::{QK, QuantizedRows, ROW_GROUP, TILE};

    /// Most rows per pass: 8 weight registers and 4 accumulators fit.
    const ROW_GROUP_AVX2: usize = 4;

    tile_kernel!(pulp::x86::V3, ROW_GROUP_AVX2, 1 2 3 4);

    /// 32 bytes of `b` from `at` as a register.
    #[inline(always)]
    fn load(b: &[u8], at: usize) -> __m256i {
        bytemuck::cast::<[u8; 32], __m256i>(b[at..at + 32].try_into().expect("32 bytes"))
    }

    /// 8 f16 values of `b` from `at`, widened exactly (pulp's AVX2 level has
    /// no F16C): the exponent and mantissa shifted into f32's places and
    /// scaled by 2¹¹² (the exponent biases' difference; exact for normal and
    /// subnormal values alike), infinities and NaNs given f32's all-ones
    /// exponent, then the sign.
    #[inline(always)]
    pub(super) fn load_f16(simd: pulp::x86::V3, b: &[u8], at: usize) -> __m256 {
        let (a, a2) = (simd.avx, simd.avx2);
        let h: __m128i =
            bytemuck::cast::<[u8; 16], _>(b[at..at + 16].try_into().expect("16 bytes"));
        let h = a2._mm256_cvtepu16_epi32(h);
        let sign = a2._mm256_slli_epi32::<16>(a2._mm256_and_si256(h, a._mm256_set1_epi32(0x8000)));
        let shifted =
            a2._mm256_slli_epi32::<13>(a2._mm256_and_si256(h, a._mm256_set1_epi32(0x7fff)));
        let value = a._mm256_mul_ps(
            bytemuck::cast(shifted),
            a._mm256_set1_ps(f32::from_bits(0x7780_0000)),
        );
        let inf_nan = a2._mm256_cmpgt_epi32(shifted, a._mm256_set1_epi32(0x0f7f_ffff));
        let top = a2._mm256_and_si256(inf_nan, a._mm256_set1_epi32(0x7f80_0000));
        let bits = a2._mm256_or_si256(a2._mm256_or_si256(bytemuck::cast(value), top), sign);
        bytemuck::cast(bits)
    }

    /// Four bytes of a quantised row broadcast to every 32-bit lane.
    #[inline(always)]
    fn splat4(simd: pulp::x86::V3, q: &[i8], at: usize) -> __m256i {
        let b: [i8; 4] = q[at..at + 4].try_into().expect("4 bytes");
        simd.avx
            ._mm256_set1_epi32(i32::from_le_bytes(b.map(|v| v as u8)))
    }

    /// `out[j][i] = w_i · x_{rows.start + j}` over one tile, as
    /// [`super::tile_rows_portable`] computes it, 8 outputs at a time.
    #[inline(always)]
    fn tile_rows<const Q4: bool, const R: usize>(
        simd: pulp::x86::V3,
        tile: &[u8],
        xq: &QuantizedRows,
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; ROW_GROUP],
    ) {
        let (a, a2, f) = (simd.avx, simd.avx2, simd.fma);
        let nb = xq.inp / QK;
        let record = if Q4 {
            super::Q4_1_RECORD
        } else {
            super::Q8_0_RECORD
        };
        let nibble = a._mm256_set1_epi8(0x0f);
        let ones = a._mm256_set1_epi16(1);
        let zero = a._mm256_setzero_si256();
        for half in 0..2 {
            let mut acc = [a._mm256_setzero_ps(); R];
            for b in 0..nb {
                let rec = &tile[b * record..][..record];
                let at = |j: usize| (rows.start + j) * nb + b;
                let qx = |j: usize| &xq.q[(rows.start + j) * xq.inp + b * QK..][..QK];
                if Q4 {
                    let mut w = [zero; 8];
                    for p in 0..4 {
                        let v = load(rec, 64 * p + 32 * half);
                        w[p] = a2._mm256_and_si256(v, nibble);
                        w[4 + p] = a2._mm256_and_si256(a2._mm256_srli_epi16::<4>(v), nibble);
                    }
                    let d = load_f16(simd, rec, 256 + 16 * half);
                    let m = load_f16(simd, rec, 288 + 16 * half);
                    for j in 0..R {
                        let qx = qx(j);
                        let mut s = a2._mm256_maddubs_epi16(w[0], splat4(simd, qx, 0));
                        for p in 1..8 {
                            let x = splat4(simd, qx, 4 * (p % 4) + 16 * (p / 4));
                            s = a2._mm256_add_epi16(s, a2._mm256_maddubs_epi16(w[p], x));
                        }
                        let i = a._mm256_cvtepi32_ps(a2._mm256_madd_epi16(s, ones));
                        let (dx, sx) = (xq.d[at(j)], xq.s[at(j)]);
                        acc[j] = f._mm256_fmadd_ps(m, a._mm256_set1_ps(sx), acc[j]);
                        let scale = a._mm256_mul_ps(d, a._mm256_set1_ps(dx));
                        acc[j] = f._mm256_fmadd_ps(i, scale, acc[j]);
                    }
                } else {
                    // |w| times x with w's sign (x zeroed where w is 0,
                    // where |w| is 0 too), each register's 16-bit sums
                    // widened before the next is added (see the AVX-512
                    // kernel); four registers at a time, |w| formed per row,
                    // so that nothing spills from AVX2's 16 registers.
                    let mut s = [zero; R];
                    for quarter in 0..2 {
                        let w: [__m256i; 4] =
                            std::array::from_fn(|p| load(rec, 64 * (4 * quarter + p) + 32 * half));
                        for j in 0..R {
                            let qx = qx(j);
                            for p in 0..4 {
                                let x = splat4(simd, qx, 4 * (4 * quarter + p));
                                let x = a2._mm256_sign_epi8(x, w[p]);
                                let prod = a2._mm256_maddubs_epi16(a2._mm256_abs_epi8(w[p]), x);
                                s[j] = a2._mm256_add_epi32(s[j], a2._mm256_madd_epi16(prod, ones));
                            }
                        }
                    }
                    let d = load_f16(simd, rec, 512 + 16 * half);
                    for j in 0..R {
                        let i = a._mm256_cvtepi32_ps(s[j]);
                        let scale = a._mm256_mul_ps(d, a._mm256_set1_ps(xq.d[at(j)]));
                        acc[j] = f._mm256_fmadd_ps(i, scale, acc[j]);
                    }
                }
            }
            for (o, v) in out.iter_mut().zip(acc) {
                o[8 * half..8 * half + 8].copy_from_slice(&bytemuck::cast::<__m256, [f32; 8]>(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use half::f16;
    use proptest::prelude::*;

    /// GGUF bytes of `out × in/32` blocks cycling through `bytes`, with
    /// scales and minima that vary by block.
    fn gguf_blocks(q8: bool, out: usize, inp: usize, bytes: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let mut next = bytes.iter().cycle();
        for i in 0..out * (inp / QK) {
            v.extend(f16::from_f32(0.01 + (i % 7) as f32 * 0.003).to_le_bytes());
            if q8 {
                v.extend((0..32).map(|_| *next.next().unwrap()));
            } else {
                v.extend(f16::from_f32(-0.05 + (i % 5) as f32 * 0.01).to_le_bytes());
                v.extend((0..16).map(|_| *next.next().unwrap()));
            }
        }
        v
    }

    fn weight(q8: bool, out: usize, inp: usize, bytes: &[u8]) -> (QuantizedWeight, Int8Weight) {
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
        let raw = gguf_blocks(q8, out, inp, bytes);
        let w = QuantizedWeight::from_ggml(ty, &raw, out, inp)
            .unwrap()
            .unwrap();
        let int8 = Int8Weight::from_quantized(&w).unwrap();
        (w, int8)
    }

    /// `x Wᵀ` by the portable definition alone.
    fn portable(w: &Int8Weight, x: &[f32], rows: usize) -> Vec<f32> {
        let xq = QuantizedRows::new(x, rows, w.inp);
        let nb = w.inp / QK;
        let record = w.record_bytes();
        let mut y = vec![0.0f32; rows * w.out];
        for t in 0..w.out / TILE {
            let tile = &w.records[t * nb * record..][..nb * record];
            for r in 0..rows {
                let mut out = [[0.0f32; TILE]; ROW_GROUP];
                tile_rows_portable(w.q4_1, tile, &xq, r..r + 1, &mut out);
                y[r * w.out + t * TILE..][..TILE].copy_from_slice(&out[0]);
            }
        }
        y
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// The dispatched kernel (AVX-512 where the CPU has it, split over
        /// threads, rows in groups) and the AVX2 one equal the portable
        /// definition bit for bit, row by row; and each output lies within the activation
        /// rounding's bound (plus f32 summation error) of the exact f64
        /// product with the dequantised weights.
        #[test]
        fn equals_the_definition_and_stays_within_the_rounding_bound(
            q8 in any::<bool>(),
            tiles in 1usize..6,
            nb in prop_oneof![1usize..4, 17usize..50],
            rows in 1usize..27,
            bytes in prop::collection::vec(any::<u8>(), 1..97),
            xs in prop::collection::vec(-3.0f32..3.0, 1..97),
        ) {
            let (out, inp) = (tiles * TILE, nb * QK);
            let (w, int8) = weight(q8, out, inp, &bytes);
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| xs[i % xs.len()] * (1.0 + i as f32 * 1e-3))
                .collect();
            let y = int8.matmul(&x, rows);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let want = bits(&portable(&int8, &x, rows));
            prop_assert_eq!(&bits(&y), &want);
            // Every level the CPU has (AVX-512 and AVX2 where the dispatch takes VNNI).
            for level in [Level::Avx512, Level::Avx2, Level::Portable] {
                prop_assert_eq!(&bits(&int8.matmul_at(&x, rows, level)), &want, "{:?}", level);
            }
            // Each row alone gives the same bits (the grouping of rows does
            // not reach a row's sums).
            for r in [0, rows - 1] {
                let alone = int8.matmul(&x[r * inp..(r + 1) * inp], 1);
                prop_assert_eq!(&y[r * out..(r + 1) * out], &alone[..]);
            }
            let xq = QuantizedRows::new(&x, rows, inp);
            let u = f64::from(f32::EPSILON) / 2.0;
            let gamma = (2 * nb + 2) as f64 * u / (1.0 - (2 * nb + 2) as f64 * u);
            for r in 0..rows {
                for o in 0..out {
                    let wr = w.row(o);
                    let (mut exact, mut rounding, mut magnitude) = (0.0f64, 0.0f64, 0.0f64);
                    for b in 0..nb {
                        let dx = f64::from(xq.d[r * nb + b]);
                        for k in b * QK..(b + 1) * QK {
                            let (wk, xk) = (f64::from(wr[k]), f64::from(x[r * inp + k]));
                            exact += wk * xk;
                            rounding += wk.abs() * dx / 2.0;
                            magnitude += (wk * xk).abs() + wk.abs() * dx;
                        }
                    }
                    let got = f64::from(y[r * out + o]);
                    // The f32 scale products (d·dₓ, and the widened minima)
                    // add a relative γ-size error over the same magnitudes.
                    let bound = rounding * (1.0 + 4.0 * u) + gamma * magnitude + 1e-30;
                    prop_assert!((got - exact).abs() <= bound,
                        "row {} out {}: {} vs {} (bound {})", r, o, got, exact, bound);
                }
            }
        }
    }

    proptest! {
        /// The AVX-512 quantiser gives the portable one's bits, for blocks
        /// of every magnitude, with zeros, ties and non-finite values.
        #[test]
        fn avx512_quantisation_is_the_portable_one(
            raw in prop::collection::vec(
                prop_oneof![
                    -1e3f32..1e3,
                    Just(0.0f32),
                    Just(0.5f32),
                    Just(-2.5f32),
                    (-64i32..64).prop_map(|e| 2f32.powi(e)),
                    Just(f32::NAN),
                    Just(f32::INFINITY),
                    Just(f32::from_bits(3)),
                    Just(f32::from_bits(200)),
                    Just(f32::MAX),
                ],
                QK,
            ),
            scale in prop_oneof![Just(1.0f32), Just(1e-38), Just(1e-44), Just(1e30), Just(127.0)],
        ) {
            #[cfg(target_arch = "x86_64")]
            if let Some(simd) = pulp::x86::V4::try_new() {
                let x: [f32; QK] = std::array::from_fn(|k| raw[k] * scale);
                let (mut a, mut b) = ([0i8; QK], [0i8; QK]);
                let want = quantize_block(&x, &mut a);
                let got = simd.vectorize(|| avx512::quantize_block(simd, &x, &mut b));
                prop_assert_eq!(a, b);
                prop_assert_eq!(want.0.to_bits(), got.0.to_bits());
                prop_assert_eq!(want.1.to_bits(), got.1.to_bits());
            }
        }
    }

    /// Quantising a block: `|q| ≤ 127`, ties to even, `q = 0` for a zero
    /// block, and a non-finite value makes the block's scale NaN (so that
    /// the outputs it reaches are NaN, not silently finite).
    #[test]
    fn blocks_of_x_quantise_as_documented() {
        let mut q = [0i8; QK];
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = -127.0;
        x[2] = 2.5;
        x[3] = 3.5;
        x[4] = -0.5;
        let (d, s) = quantize_block(&x, &mut q);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..5], &[127, -127, 2, 4, 0]);
        assert_eq!(s, 6.0);
        // x/d lands exactly on −119.5 here, which x·(1/d) misses
        // (−119.49999): the quantisers divide, then round to even.
        let mut tie = [0.0f32; QK];
        tie[0] = 1.0;
        tie[1] = f32::from_bits(0xbf70_e1c3);
        quantize_block(&tie, &mut q);
        assert_eq!(q[1], -120);
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            let mut q4 = [0i8; QK];
            simd.vectorize(|| avx512::quantize_block(simd, &tie, &mut q4));
            assert_eq!(q4[1], -120);
        }
        assert_eq!(quantize_block(&[0.0; QK], &mut q), (0.0, 0.0));
        assert_eq!(q, [0; QK]);
        // A block so small that max|x|/127 underflows is taken as zeros.
        assert_eq!(
            quantize_block(&[f32::from_bits(60); QK], &mut q),
            (0.0, 0.0)
        );
        assert_eq!(q, [0; QK]);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            x[7] = bad;
            let (d, s) = quantize_block(&x, &mut q);
            assert!(d.is_nan() && s.is_nan());
        }
        let (_, int8) = weight(false, 16, 32, &[0x5a, 0x13]);
        let mut xs = vec![1.0f32; 32];
        xs[3] = f32::NAN;
        assert!(int8.matmul(&xs, 1).iter().all(|v| v.is_nan()));
    }

    /// The AVX2 kernel's f16 widening is `half`'s, for every f16 but NaNs
    /// (whose payloads may differ; they are NaN either way).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_f16_widening_is_exact() {
        let Some(simd) = pulp::x86::V3::try_new() else {
            return;
        };
        for chunk in (0..=u16::MAX).collect::<Vec<_>>().chunks(8) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|h| h.to_le_bytes()).collect();
            let got: [f32; 8] = bytemuck::cast(simd.vectorize(|| avx2::load_f16(simd, &bytes, 0)));
            for (&h, g) in chunk.iter().zip(got) {
                let want = f16::from_bits(h).to_f32();
                if want.is_nan() {
                    assert!(g.is_nan(), "{h:#06x}");
                } else {
                    assert_eq!(g.to_bits(), want.to_bits(), "{h:#06x}");
                }
            }
        }
    }

    /// Rows quantised one by one into [`QuantizedRows::zeroed`] equal the
    /// rows quantised together, every field (non-finite and zero blocks
    /// included).
    #[test]
    fn rows_filled_one_by_one_equal_rows_quantised_together() {
        let (rows, inp) = (5, 3 * QK);
        let mut x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 2654435761) % 2001) as f32 / 300.0 - 3.3)
            .collect();
        x[QK + 4] = f32::INFINITY;
        x[2 * inp..2 * inp + QK].fill(0.0);
        let together = QuantizedRows::new(&x, rows, inp);
        let mut one_by_one = QuantizedRows::zeroed(rows, inp);
        for (row, mut part) in one_by_one.rows_mut().enumerate() {
            part.fill(&x[row * inp..(row + 1) * inp]);
        }
        assert_eq!(one_by_one.q, together.q);
        assert_eq!(one_by_one.biased, together.biased);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one_by_one.d), bits(&together.d));
        assert_eq!(bits(&one_by_one.s), bits(&together.s));
        assert!(together.d.iter().any(|d| d.is_nan()));
    }

    /// A Q8_0 weight of −128 (which llama.cpp's quantiser never writes, but
    /// a file may hold) multiplies correctly through the sign trick.
    #[test]
    fn q8_0_minus_128_is_exact() {
        let (w, int8) = weight(true, 16, 64, &[0x80, 0x80, 0x7f, 0x81, 0x00, 0xff]);
        let x: Vec<f32> = (0..64)
            .map(|k| if k % 3 == 0 { -127.0 } else { 127.0 })
            .collect();
        let y = int8.matmul(&x, 1);
        for (o, &got) in y.iter().enumerate() {
            let want: f64 = w
                .row(o)
                .iter()
                .zip(&x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            assert!(
                (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn widths_that_are_not_whole_tiles_are_declined() {
        let raw = gguf_blocks(false, 17, 32, &[1, 2, 3]);
        let w = QuantizedWeight::from_ggml(GgmlType::Q4_1, &raw, 17, 32)
            .unwrap()
            .unwrap();
        assert!(Int8Weight::from_quantized(&w).is_none());
    }
}
