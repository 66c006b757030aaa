//! `x Wᵀ` for a few rows of `x` with `W` kept in its GGUF quantised blocks
//! (Q4_1, Q8_0), dequantised block by block in registers as it is used.
//!
//! Why: a decode step reads every weight of the model once, so its speed is
//! the weights' size over memory bandwidth. SmolLM2's GGUF stores its
//! projections in Q4_1 (0.625 bytes per weight) and its tied embedding/head in
//! Q8_0 (1.06 bytes); the f32 tensors the model computes with otherwise are 4
//! bytes per weight. llama.cpp reads the blocks directly; so does this kernel.
//!
//! Exactness: each block is dequantised with the same f32 expression as
//! [`crate::gguf`]'s dequantiser (`d·q + m` for Q4_1, `d·q` for Q8_0, each
//! rounded as Rust rounds it, without contraction), so the kernel multiplies
//! `x` by *exactly* the f32 weights of the f32 path; only the order of the dot
//! products' sums differs (as in `layers::few_rows`), within the same
//! `γ_k Σ|w_j x_j|` bound, which the tests check.
//!
//! SIMD: `pulp` dispatch; the products use pulp's vectors. A Q4_1 block is
//! dequantised by a 16-entry table lookup on AVX-512 (pulp's safe intrinsics,
//! see `Lut`) and kept in registers; elsewhere, and for Q8_0, by plain loops
//! over 32 entries, which the compiler vectorises inside pulp's
//! `#[target_feature]` frame. No `unsafe`.

use pulp::{Simd, WithSimd};

use crate::ModelError;
use crate::gguf::GgmlType;

/// Weights per block in both formats.
const QK: usize = 32;
/// Tasks cover whole multiples of this many output rows.
const BLOCK: usize = 16;
/// Output columns are computed in runs starting at multiples of this
/// ([`QuantizedWeight::columns_into`]).
pub(crate) const COLUMN_UNIT: usize = BLOCK;
/// Products of at least this many bytes of blocks × rows of `x` are split
/// over rayon's threads.
const PARALLEL_MIN_WORK: usize = 128 << 10;
/// Most rows of `x` per register tile (more are swept in groups).
const ROW_GROUP: usize = 10;
/// How far ahead of a tile's blocks the kernel asks for the next ones.
const PREFETCH_AHEAD: usize = 8 << 10;
/// Weight rows every group of rows sweeps before the next ones.
const OUT_CHUNK: usize = 64;
/// Blocks of the input summed apart before their sums are added in order
/// (the parts of a long input): 24 blocks of 10 rows of `x` are 30 KB.
const PART_BLOCKS: usize = 24;
/// Bytes of a group's rows of `x` above which it sweeps the weights one part
/// at a time, so that its part of `x` stays in L1 (48 KB here) while the
/// weights stream past: SmolLM2's 1536-wide input, whole, is 55 KB for 9
/// rows and came from L2 for every pair of weight rows.
const X_IN_L1: usize = 32 << 10;

/// How a [`QuantizedWeight`] stores its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// 16 bytes of nibbles per block (element j < 16: low nibble of byte j,
    /// element j + 16: its high nibble); `w = d·q + m`.
    Q4_1,
    /// 32 signed bytes per block; `w = d·q`.
    Q8_0,
}

/// A [`QuantizedWeight`]'s blocks, row after row (`[out, in/32]`).
pub(crate) enum QuantizedBlocks<'a> {
    /// 16 bytes of nibbles per block, `d` and `m` per block.
    Q4_1 {
        q: &'a [u8],
        scale: &'a [f32],
        min: &'a [f32],
    },
    /// 32 signed bytes per block, `d` per block.
    Q8_0 { q: &'a [u8], scale: &'a [f32] },
}

/// An `[out, in]` weight kept in GGUF blocks, with each block's scale (and
/// minimum) widened from f16 to f32 once, at load.
#[derive(Clone)]
pub struct QuantizedWeight {
    format: Format,
    out: usize,
    inp: usize,
    /// Quantised values, block after block, row after row.
    q: Vec<u8>,
    /// `d` per block.
    scale: Vec<f32>,
    /// `m` per block (Q4_1 only).
    min: Vec<f32>,
}

impl std::fmt::Debug for QuantizedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantizedWeight({:?}, [{}, {}])",
            self.format, self.out, self.inp
        )
    }
}

impl QuantizedWeight {
    /// The weight from a GGUF tensor's raw bytes (`[out, in]`, ggml order), or
    /// `None` for a type this kernel does not read (the f32 path serves it).
    pub fn from_ggml(
        ty: GgmlType,
        bytes: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Option<Self>, ModelError> {
        let (format, block_bytes) = match ty {
            GgmlType::Q4_1 => (Format::Q4_1, 20),
            GgmlType::Q8_0 => (Format::Q8_0, 34),
            _ => return Ok(None),
        };
        if inp == 0 || !inp.is_multiple_of(QK) {
            return Ok(None);
        }
        let blocks = out * (inp / QK);
        if bytes.len() != blocks * block_bytes {
            return Err(ModelError::bad_input(format!(
                "{ty:?} weight [{out}, {inp}] needs {} bytes, has {}",
                blocks * block_bytes,
                bytes.len()
            )));
        }
        let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let mut w = QuantizedWeight {
            format,
            out,
            inp,
            q: Vec::with_capacity(
                blocks * (block_bytes - 2 - 2 * usize::from(format == Format::Q4_1)),
            ),
            scale: Vec::with_capacity(blocks),
            min: Vec::new(),
        };
        for b in bytes.chunks_exact(block_bytes) {
            w.scale.push(f16(&b[0..2]));
            match format {
                Format::Q4_1 => {
                    w.min.push(f16(&b[2..4]));
                    w.q.extend_from_slice(&b[4..20]);
                }
                Format::Q8_0 => w.q.extend_from_slice(&b[2..34]),
            }
        }
        Ok(Some(w))
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// The rows reordered: row `r` of the result is row `from[r]` of `self`
    /// (llama.cpp's q/k head permutation, undone at load).
    pub(crate) fn permute_rows(&self, from: &[usize]) -> Self {
        let nb = self.inp / QK;
        let qb = self.q.len() / (self.out * nb);
        let mut w = QuantizedWeight {
            q: Vec::with_capacity(self.q.len()),
            scale: Vec::with_capacity(self.scale.len()),
            min: Vec::with_capacity(self.min.len()),
            ..*self
        };
        for &r in from {
            w.q.extend_from_slice(&self.q[r * nb * qb..(r + 1) * nb * qb]);
            w.scale.extend_from_slice(&self.scale[r * nb..(r + 1) * nb]);
            if !self.min.is_empty() {
                w.min.extend_from_slice(&self.min[r * nb..(r + 1) * nb]);
            }
        }
        w
    }

    /// The blocks as stored (for [`super::int8_activations`]'s layout).
    pub(crate) fn blocks(&self) -> QuantizedBlocks<'_> {
        match self.format {
            Format::Q4_1 => QuantizedBlocks::Q4_1 {
                q: &self.q,
                scale: &self.scale,
                min: &self.min,
            },
            Format::Q8_0 => QuantizedBlocks::Q8_0 {
                q: &self.q,
                scale: &self.scale,
            },
        }
    }

    /// Row `o` dequantised (for tests and checks).
    pub fn row(&self, o: usize) -> Vec<f32> {
        let mut w = vec![0.0; self.inp];
        for (b, chunk) in w.chunks_exact_mut(QK).enumerate() {
            let block: &mut [f32; QK] = chunk.try_into().expect("QK entries");
            self.dequantize(o * (self.inp / QK) + b, block);
        }
        w
    }

    /// Block `index` (row-major over `[out, in/32]`) into `w`.
    fn dequantize(&self, index: usize, w: &mut [f32; QK]) {
        match self.format {
            Format::Q4_1 => dequantize_q4_1(
                self.scale[index],
                self.min[index],
                self.q[index * 16..][..16].try_into().expect("16 bytes"),
                w,
            ),
            Format::Q8_0 => dequantize_q8_0(
                self.scale[index],
                self.q[index * QK..][..QK].try_into().expect("32 bytes"),
                w,
            ),
        }
    }

    /// `x Wᵀ` for row-major `x: [rows, in]`, as row-major `[rows, out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.inp);
        if rows == 0 {
            return Vec::new();
        }
        let mut y = vec![0.0f32; rows * self.out];
        // One task per thread (rounded to whole tiles) where the work is worth
        // a split: small products run on the calling thread (a split costs
        // a `join`, and forward passes run on rayon's pool, see
        // `runtime::on_hot_pool`).
        let threads = if self.q.len() * rows >= PARALLEL_MIN_WORK {
            rayon::current_num_threads().max(1)
        } else {
            1
        };
        let per_task = self.out.div_ceil(threads).div_ceil(BLOCK) * BLOCK;
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
            pulp::Arch::new().dispatch(Task {
                w: self,
                first: index * per_task,
                x,
                y,
            });
        });
        y
    }

    /// Output columns `first..` (`first` a multiple of [`COLUMN_UNIT`]; as
    /// many as `y[r]` has room for) of every row of `x`, written into
    /// `y[r]`: the same values as those columns of
    /// [`QuantizedWeight::matmul`], on the calling thread.
    pub(crate) fn columns_into(&self, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
        debug_assert_eq!(first % BLOCK, 0);
        pulp::Arch::new().dispatch(Task {
            w: self,
            first,
            x,
            y,
        });
    }

    /// Bytes of quantised values per output column.
    pub(crate) fn bytes_per_column(&self) -> usize {
        self.q.len() / self.out.max(1)
    }
}

/// Outputs `first..first + y[r].len()` of every row: `y[r][o] = w[first + o] · x[r]`.
struct Task<'a> {
    w: &'a QuantizedWeight,
    first: usize,
    x: &'a [f32],
    y: Vec<&'a mut [f32]>,
}

impl WithSimd for Task<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        match self.w.format {
            Format::Q4_1 => run::<S, true>(simd, self),
            Format::Q8_0 => run::<S, false>(simd, self),
        }
    }
}

/// Rows of `x` in groups as even as possible, none above [`ROW_GROUP`]; for
/// each group, chunks of [`OUT_CHUNK`] weight rows, swept in tiles of `O`
/// weight rows × the group's `R` rows: each block of the tile's weight rows is
/// dequantised into registers (an L1 buffer) once and multiplied into all
/// `O × R` accumulators before the next block.
///
/// Why this shape: an ensemble step has N + 1 rows (9 for eight members), and
/// the product is bound by the multiply-adds, not by reading the blocks. With
/// every row of the group in one tile, each weight is dequantised once per
/// step (not once per group of rows) and each vector of `x` is loaded once per
/// `O` weight rows. `O × R ≤ 20` accumulators plus the tile's `2·O` weight
/// vectors fit AVX-512's 32 registers; a tile that does not (3 × 9) spills
/// and runs at half the speed (`examples/qk`). With AVX2's 16 registers the
/// tiles are 4 × R up to 3 rows, 2 × R up to 5 and 1 × R up to 10, whose
/// weight vectors are read from the L1 buffer (on this machine, forcing pulp's
/// AVX2 level, 9 rows × [1536, 576]: 154 µs, against 163 µs for stop 16's
/// kernel and 247 µs for AVX-512's shapes there). Inputs longer than
/// [`PART_BLOCKS`] blocks are swept a part at a time, so that the group's
/// rows of `x` stay in L1 (9 rows × [576, 1536]: 61 → 49 µs on 2 threads,
/// `examples/qk`). Each output is summed over the same lanes in the same
/// order whatever the grouping (part by part, in order; within a part block
/// by block, then across lanes), so a row's result does not depend on the
/// other rows of the batch.
#[inline(always)]
fn run<S: Simd, const Q4: bool>(simd: S, task: Task<'_>) {
    let Task { w, first, x, mut y } = task;
    let rows = y.len();
    let n_out = y[0].len();
    let k = w.inp;
    let lut = Lut::for_simd::<S>();
    // AVX2 and narrower have 16 vector registers: fewer accumulators per
    // tile (a 4 × 4 or 2 × 9 tile spills there).
    let narrow = size_of::<S::f32s>() < 64;
    let groups = rows.div_ceil(ROW_GROUP);
    // Each group's rows of x interleaved block by block (`[block][row][32]`):
    // the tile reads one contiguous run of R·32 entries per block.
    let mut interleaved = Vec::with_capacity(groups);
    let mut r = 0;
    for g in 0..groups {
        let size = rows / groups + usize::from(g < rows % groups);
        let mut xt = Vec::with_capacity(size * k);
        for b in 0..k / QK {
            for j in r..r + size {
                xt.extend_from_slice(&x[j * k + b * QK..][..QK]);
            }
        }
        interleaved.push((r, size, xt));
        r += size;
    }
    let mut chunk = 0;
    while chunk < n_out {
        // Chunks keep a few dozen weight rows in L1/L2 while every group of
        // rows (more than one only past ROW_GROUP rows) sweeps them.
        let end = (chunk + OUT_CHUNK).min(n_out);
        for ((r, size, xt), blocks) in interleaved.iter().flat_map(|g| {
            // A group whose rows of x overflow L1 sweeps the parts one by
            // one; a smaller one sweeps every block at once (which streams
            // the weight rows whole), with the same sums.
            let (_, size, _) = g;
            let step = if size * k * 4 > X_IN_L1 {
                PART_BLOCKS
            } else {
                k / QK
            };
            (0..k / QK)
                .step_by(step.max(1))
                .map(move |b| (g, b..(b + step).min(k / QK)))
        }) {
            macro_rules! sweep {
                ($o:literal, $r:literal) => {
                    sweep::<S, Q4, $o, $r>(
                        simd,
                        lut,
                        w,
                        first,
                        chunk..end,
                        (xt, blocks.clone()),
                        &mut y,
                        *r,
                    )
                };
            }
            match size {
                1 => sweep!(4, 1),
                2 => sweep!(4, 2),
                3 if narrow => sweep!(2, 3),
                3 => sweep!(4, 3),
                4 if narrow => sweep!(2, 4),
                4 => sweep!(4, 4),
                5 if narrow => sweep!(2, 5),
                6 if narrow => sweep!(1, 6),
                7 if narrow => sweep!(1, 7),
                8 if narrow => sweep!(1, 8),
                9 if narrow => sweep!(1, 9),
                _ if narrow => sweep!(1, 10),
                5 => sweep!(2, 5),
                6 => sweep!(2, 6),
                7 => sweep!(2, 7),
                8 => sweep!(2, 8),
                9 => sweep!(2, 9),
                _ => sweep!(2, 10),
            }
        }
        chunk = end;
    }
}

/// Outputs `outs` (task-relative) of rows `r..r + R`, in tiles of `O` weight rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn sweep<S: Simd, const Q4: bool, const O: usize, const R: usize>(
    simd: S,
    lut: Lut,
    w: &QuantizedWeight,
    first: usize,
    outs: std::ops::Range<usize>,
    (xt, blocks): (&[f32], std::ops::Range<usize>),
    y: &mut [&mut [f32]],
    r: usize,
) {
    let xt = &xt[blocks.start * R * QK..blocks.end * R * QK];
    let mut o = outs.start;
    while o < outs.end {
        let width = (outs.end - o).min(O);
        let t = tile_blocks::<S, Q4, O, R>(simd, lut, w, first + o, width, (xt, blocks.clone()));
        for (i, ti) in t.iter().enumerate().take(width) {
            for (j, v) in ti.iter().enumerate() {
                if blocks.start == 0 {
                    y[r + j][o + i] = *v;
                } else {
                    y[r + j][o + i] += *v;
                }
            }
        }
        o += width;
    }
}

/// `[w_{o+i} · x_j]` for `i < width` (≤ `O`) and `j < R` over the weights'
/// `blocks`, from the group's interleaved rows `xt` (`[block][row][32]`, those
/// blocks only), each block of the weight rows dequantised into registers or
/// an `O`-block L1 buffer just before use.
#[inline(always)]
fn tile_blocks<S: Simd, const Q4: bool, const O: usize, const R: usize>(
    simd: S,
    lut: Lut,
    w: &QuantizedWeight,
    o: usize,
    width: usize,
    (xt, blocks): (&[f32], std::ops::Range<usize>),
) -> [[f32; R]; O] {
    let row_blocks = w.inp / QK;
    let nb = blocks.len();
    let qb = if Q4 { 16 } else { QK };
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; R]; O];
    let mut total = None;
    let mut buf = [[0.0f32; QK]; O];
    // Each weight row's blocks, scales and minima as slices (no per-block index
    // arithmetic into the whole weight).
    // Past `width` the tile repeats its first weight row (results unused), so
    // that every loop below has the constant trip count O.
    let empty: (&[u8], &[f32], &[f32]) = (&[], &[], &[]);
    let mut rows_of = [empty; O];
    {
        // The blocks of the tiles after this one, PREFETCH_AHEAD bytes
        // ahead in the quantised values (as many blocks ahead in the scales
        // and minima): a decode step reads every weight from memory once,
        // and the hardware's prefetcher alone left the kernel waiting on
        // its loads (the SmolLM2 single-row step, f32 activations: 3.83 →
        // 2.84 ms with these, alternated with the build without them).
        let prefetch = super::simd::Prefetch::new();
        let first = o * row_blocks + blocks.start;
        let ahead = PREFETCH_AHEAD / qb;
        for blk in (first + ahead..first + ahead + O * nb).step_by((64 / qb).max(1)) {
            prefetch.line(&w.q, blk * qb);
        }
        for blk in (first + ahead..first + ahead + O * nb).step_by(16) {
            prefetch.line(&w.scale, blk);
            if Q4 {
                prefetch.line(&w.min, blk);
            }
        }
    }
    for (i, row) in rows_of.iter_mut().enumerate() {
        let at = (o + if i < width { i } else { 0 }) * row_blocks + blocks.start;
        *row = (
            &w.q[at * qb..(at + nb) * qb],
            &w.scale[at..at + nb],
            if Q4 { &w.min[at..at + nb] } else { &[] },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = lut;
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(v4)) = (Q4, lut.v4) {
        // The table path with each block's weights kept in registers.
        for (b, xb) in xt.chunks_exact(R * QK).enumerate().take(nb) {
            end_part_before(simd, blocks.start + b, b, &mut total, &mut acc, width);
            let mut wv = [[zero; 2]; O];
            for (i, wi) in wv.iter_mut().enumerate() {
                let (q, d, m) = rows_of[i];
                let [low, high] =
                    q4_1_table_vectors(v4, d[b], m[b], q[b * 16..][..16].try_into().expect("16"));
                *wi = [bytemuck::cast(low), bytemuck::cast(high)];
            }
            let xb = S::as_simd_f32s(xb).0;
            for v in 0..2 {
                for j in 0..R {
                    let xv = xb[j * 2 + v];
                    for i in 0..O {
                        acc[i][j] = simd.mul_add_e_f32s(wv[i][v], xv, acc[i][j]);
                    }
                }
            }
        }
        return add_part(total, reduce_tile(simd, &acc, width));
    }
    for (b, xb) in xt.chunks_exact(R * QK).enumerate().take(nb) {
        end_part_before(simd, blocks.start + b, b, &mut total, &mut acc, width);
        for i in 0..O {
            let (q, d, m) = rows_of[i];
            if Q4 {
                dequantize_q4_1(
                    d[b],
                    m[b],
                    q[b * 16..][..16].try_into().expect("16"),
                    &mut buf[i],
                );
            } else {
                dequantize_q8_0(d[b], q[b * QK..][..QK].try_into().expect("32"), &mut buf[i]);
            }
        }
        let empty: &[S::f32s] = &[];
        let mut ws = [empty; O];
        for (i, wi) in ws.iter_mut().enumerate() {
            *wi = S::as_simd_f32s(&buf[i]).0;
        }
        // Vector by vector of the block: each vector of x is loaded once and
        // multiplied into the O weight rows held in registers.
        let xb = S::as_simd_f32s(xb).0;
        let per_block = ws[0].len();
        if R <= 2 {
            // A single-row step is bound by dequantising: weight row by
            // weight row, as the blocks come out of the buffer.
            for i in 0..O {
                for v in 0..per_block {
                    for j in 0..R {
                        let xv = xb[j * per_block + v];
                        acc[i][j] = simd.mul_add_e_f32s(ws[i][v], xv, acc[i][j]);
                    }
                }
            }
        } else {
            for v in 0..per_block {
                for j in 0..R {
                    let xv = xb[j * per_block + v];
                    for i in 0..O {
                        acc[i][j] = simd.mul_add_e_f32s(ws[i][v], xv, acc[i][j]);
                    }
                }
            }
        }
    }
    add_part(total, reduce_tile(simd, &acc, width))
}

/// Where block `block` (the sweep's `b`-th) starts a part of the input, adds the
/// part just finished to `total` and restarts the accumulators.
#[inline(always)]
fn end_part_before<S: Simd, const O: usize, const R: usize>(
    simd: S,
    block: usize,
    b: usize,
    total: &mut Option<[[f32; R]; O]>,
    acc: &mut [[S::f32s; R]; O],
    width: usize,
) {
    if b > 0 && block.is_multiple_of(PART_BLOCKS) {
        *total = Some(add_part(total.take(), reduce_tile(simd, acc, width)));
        *acc = [[simd.splat_f32s(0.0); R]; O];
    }
}

/// `total += part` (`total = part` for the first part): the parts of a
/// long input summed in order, as a sweep part by part adds them to the
/// outputs.
#[inline(always)]
fn add_part<const O: usize, const R: usize>(
    total: Option<[[f32; R]; O]>,
    part: [[f32; R]; O],
) -> [[f32; R]; O] {
    match total {
        None => part,
        Some(mut t) => {
            for (ti, pi) in t.iter_mut().zip(&part) {
                for (a, b) in ti.iter_mut().zip(pi) {
                    *a += *b;
                }
            }
            t
        }
    }
}

/// Each accumulator of a tile's first `width` weight rows summed across its lanes.
#[inline(always)]
fn reduce_tile<S: Simd, const O: usize, const R: usize>(
    simd: S,
    acc: &[[S::f32s; R]; O],
    width: usize,
) -> [[f32; R]; O] {
    let mut out = [[0.0f32; R]; O];
    for i in 0..width {
        for j in 0..R {
            out[i][j] = simd.reduce_sum_f32s(acc[i][j]);
        }
    }
    out
}

/// How Q4_1 blocks are dequantised: through a 16-entry table where the CPU
/// permutes across AVX-512 lanes, else entry by entry.
///
/// Why a table: a Q4_1 weight takes one of 16 values per block, `d·q + m`
/// for `q = 0..15`. Forming the 16 values (one multiply and one add of a
/// vector) and looking each weight up (`vpermps`, which reads the low 4 bits
/// of each index, so the low nibbles need no mask) costs 6 vector
/// instructions per block, against 14 to widen, convert, scale and offset
/// every weight — which with many rows of `x` is a third of the product's
/// instructions. The values are the dequantiser's (`d·q` rounded, then `+ m`
/// rounded), so the weights are bit for bit the same either way.
#[derive(Clone, Copy)]
struct Lut {
    #[cfg(target_arch = "x86_64")]
    v4: Option<pulp::x86::V4>,
}

impl Lut {
    /// The table path when `S` is pulp's AVX-512 level (the only one with
    /// 16 f32 lanes on x86-64), else the plain one.
    #[inline(always)]
    fn for_simd<S: Simd>() -> Self {
        Lut {
            #[cfg(target_arch = "x86_64")]
            v4: if size_of::<S::f32s>() == 64 {
                pulp::x86::V4::try_new()
            } else {
                None
            },
        }
    }
}

/// One Q4_1 block's 32 weights as two vectors (entries 0–15, 16–31), by
/// table lookup (see [`Lut`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn q4_1_table_vectors(simd: pulp::x86::V4, d: f32, m: f32, qs: &[u8; 16]) -> [pulp::f32x16; 2] {
    use core::arch::x86_64::{__m128i, __m512, __m512i};
    const Q: [f32; 16] = [
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    ];
    let q: pulp::f32x16 = bytemuck::cast(Q);
    // Multiply, then add: the dequantiser's two roundings, not one FMA.
    let table = simd.add_f32s(simd.mul_f32s(q, simd.splat_f32s(d)), simd.splat_f32s(m));
    let table: __m512 = bytemuck::cast(table);
    let index: __m512i = simd
        .avx512f
        ._mm512_cvtepu8_epi32(bytemuck::cast::<[u8; 16], __m128i>(*qs));
    let low = simd.avx512f._mm512_permutexvar_ps(index, table);
    let high = simd
        .avx512f
        ._mm512_permutexvar_ps(simd.avx512f._mm512_srli_epi32::<4>(index), table);
    [bytemuck::cast(low), bytemuck::cast(high)]
}

/// One Q4_1 block, with the dequantiser's expression `d·q + m`.
#[inline(always)]
fn dequantize_q4_1(d: f32, m: f32, qs: &[u8; 16], w: &mut [f32; QK]) {
    for j in 0..16 {
        w[j] = d * f32::from(qs[j] & 0x0f) + m;
        w[j + 16] = d * f32::from(qs[j] >> 4) + m;
    }
}

/// One Q8_0 block, with the dequantiser's expression `d·q`.
#[inline(always)]
fn dequantize_q8_0(d: f32, qs: &[u8; QK], w: &mut [f32; QK]) {
    for j in 0..QK {
        w[j] = d * f32::from(qs[j] as i8);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::dequantize;
    use half::f16;
    use proptest::prelude::*;

    /// GGUF bytes of `out × in/32` blocks from a seed (scales in f16).
    pub(crate) fn blocks(ty: GgmlType, out: usize, inp: usize, bytes: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let mut next = bytes.iter().cycle();
        for i in 0..out * (inp / QK) {
            let d = f16::from_f32(0.01 + (i % 7) as f32 * 0.003);
            v.extend(d.to_le_bytes());
            if ty == GgmlType::Q4_1 {
                v.extend(f16::from_f32(-0.05 + (i % 5) as f32 * 0.01).to_le_bytes());
                v.extend((0..16).map(|_| *next.next().unwrap()));
            } else {
                v.extend((0..32).map(|_| *next.next().unwrap()));
            }
        }
        v
    }

    /// `x Wᵀ` on one thread at the SIMD level `simd` (the dispatch picks the
    /// widest; the tests also run the narrower ones, whose tiles differ).
    fn matmul_on<S: Simd>(simd: S, w: &QuantizedWeight, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; rows * w.out];
        let pieces: Vec<&mut [f32]> = y.chunks_mut(w.out).collect();
        simd.vectorize(Task {
            w,
            first: 0,
            x,
            y: pieces,
        });
        y
    }

    /// The kernel's result at every SIMD level this CPU has, beside the dispatched one.
    fn every_level(w: &QuantizedWeight, x: &[f32], rows: usize) -> Vec<Vec<f32>> {
        let mut all = vec![
            w.matmul(x, rows),
            matmul_on(pulp::Scalar::new(), w, x, rows),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = pulp::x86::V3::try_new() {
                all.push(matmul_on(simd, w, x, rows));
            }
            if let Some(simd) = pulp::x86::V4::try_new() {
                all.push(matmul_on(simd, w, x, rows));
            }
        }
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The kernel multiplies by exactly the dequantiser's f32 weights:
        /// every output within `γ_{k+1} Σ|w_j x_j|` of the exact f64 dot
        /// product with those weights.
        #[test]
        fn matches_the_dequantised_weights(
            q8 in any::<bool>(),
            out in 1usize..140,
            nb in prop_oneof![1usize..5, 23usize..51],
            rows in 1usize..24,
            bytes in prop::collection::vec(any::<u8>(), 1..97),
            xs in prop::collection::vec(-2.0f32..2.0, 1..97),
        ) {
            let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
            let inp = nb * QK;
            let raw = blocks(ty, out, inp, &bytes);
            let w = QuantizedWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
            let dense = dequantize(ty, &raw, (out * inp) as u64).unwrap();
            for o in 0..out {
                prop_assert_eq!(w.row(o), dense[o * inp..(o + 1) * inp].to_vec());
            }
            let x: Vec<f32> = (0..rows * inp).map(|i| xs[i % xs.len()] * (1.0 + i as f32 * 1e-3)).collect();
            let alone: Vec<Vec<Vec<f32>>> = (0..rows)
                .map(|r| every_level(&w, &x[r * inp..(r + 1) * inp], 1))
                .collect();
            for (level, y) in every_level(&w, &x, rows).iter().enumerate() {
            // A row's result does not depend on the other rows (the row
            // groups sum each output in the same order), at every level.
            for r in 0..rows {
                prop_assert_eq!(&y[r * out..(r + 1) * out], &alone[r][level][..]);
            }
            within_gamma(&x, rows, &dense, out, y).map_err(|e| {
                TestCaseError::fail(format!("level {level}: {e}"))
            })?;
            }
        }
    }

    /// Whether every output of `y: [rows, out]` is within `γ_{k+1}
    /// Σ|w_j x_j|` of the exact f64 dot product of its row of `x: [rows,
    /// k]` with its row of the dequantised weights `dense: [out, k]`: the
    /// bound of any order of f32 sums of the products of exactly those
    /// weights.
    pub(crate) fn within_gamma(
        x: &[f32],
        rows: usize,
        dense: &[f32],
        out: usize,
        y: &[f32],
    ) -> Result<(), String> {
        let inp = x.len() / rows.max(1);
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = (inp + 1) as f64 * u / (1.0 - (inp + 1) as f64 * u);
        for r in 0..rows {
            for o in 0..out {
                let (mut s, mut a) = (0.0f64, 0.0f64);
                for j in 0..inp {
                    let p = f64::from(x[r * inp + j]) * f64::from(dense[o * inp + j]);
                    s += p;
                    a += p.abs();
                }
                let got = f64::from(y[r * out + o]);
                if (got - s).abs() > gamma * a + f64::from(f32::MIN_POSITIVE) {
                    return Err(format!("row {r} out {o}: {got} vs {s}"));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn other_types_and_widths_are_declined_and_short_data_is_an_error() {
        assert!(
            QuantizedWeight::from_ggml(GgmlType::F32, &[0; 128], 1, 32)
                .unwrap()
                .is_none()
        );
        assert!(
            QuantizedWeight::from_ggml(GgmlType::Q8_0, &[0; 34], 1, 16)
                .unwrap()
                .is_none()
        );
        assert!(QuantizedWeight::from_ggml(GgmlType::Q8_0, &[0; 33], 1, 32).is_err());
    }

    /// The table path forms exactly the dequantiser's weights (every nibble
    /// pair, scales of every magnitude, including subnormal and negative).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn table_dequantisation_is_bitwise_the_dequantiser() {
        let Some(simd) = pulp::x86::V4::try_new() else {
            eprintln!("no AVX-512 here: the table path is not used");
            return;
        };
        let qs: Vec<[u8; 16]> = (0..16u8)
            .map(|a| std::array::from_fn(|j| a.wrapping_mul(16).wrapping_add(j as u8 * 17)))
            .collect();
        for d in [0.0f32, 1e-40, -3.7e-5, 0.011, 1.5, -65504.0] {
            for m in [0.0f32, -0.05, 2.5e-39, 7.25, -1e30] {
                for q in &qs {
                    let mut want = [0.0f32; QK];
                    dequantize_q4_1(d, m, q, &mut want);
                    let got: [[f32; 16]; 2] = q4_1_table_vectors(simd, d, m, q).map(bytemuck::cast);
                    let got: Vec<u32> = got.iter().flatten().map(|x| x.to_bits()).collect();
                    let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "d {d} m {m} q {q:?}");
                }
            }
        }
    }

    #[test]
    fn permuted_rows_follow_the_map() {
        let raw = blocks(GgmlType::Q4_1, 3, 64, &[1, 2, 3, 250, 17]);
        let w = QuantizedWeight::from_ggml(GgmlType::Q4_1, &raw, 3, 64)
            .unwrap()
            .unwrap();
        let p = w.permute_rows(&[2, 0, 1]);
        assert_eq!(p.row(0), w.row(2));
        assert_eq!(p.row(1), w.row(0));
        assert_eq!(p.row(2), w.row(1));
    }
}
