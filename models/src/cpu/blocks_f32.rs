//! `x Wᵀ` for a few rows of `x` with `W` kept in its GGUF quantised blocks
//! (Q4_1, Q8_0: [`super::BlockWeight`]), dequantised block by block in
//! registers as it is used: `gemm_q4_1_f32` and `gemm_q8_0_f32` of
//! [`super::dispatch`], one generic kernel on pulp's vectors run at each
//! instruction set's width.
//!
//! Why: a decode step reads every weight of the model once, so its speed is
//! the weights' size over memory bandwidth. SmolLM2's GGUF stores its
//! projections in Q4_1 (0.625 bytes per weight) and its tied embedding/head in
//! Q8_0 (1.06 bytes); the f32 tensors the model computes with otherwise are 4
//! bytes per weight. llama.cpp reads the blocks directly; so does this kernel.
//!
//! Exactness: each block is dequantised with the dequantiser's expression
//! (see [`super::quants`]), so the kernel multiplies `x` by *exactly* the
//! f32 weights of the f32 path; only the order of the dot products' sums
//! differs (as in [`super::dense`]), within the same `γ_k Σ|w_j x_j|`
//! bound, which the tests check.
//!
//! SIMD: the products use pulp's vectors. A Q4_1 block is dequantised by a
//! 16-entry table lookup on AVX-512 (pulp's safe intrinsics, see `Lut`) and
//! kept in registers; elsewhere, and for Q8_0, by plain loops over 32
//! entries, which the compiler vectorises inside pulp's `#[target_feature]`
//! frame. No `unsafe`.

use pulp::{Simd, WithSimd};

use super::quants::{BlockWeight, Format, dequantize_q4_1, dequantize_q8_0};
use super::simd::Prefetch;
use super::{PREFETCH_AHEAD, QK};

/// Most rows of `x` per register tile (more are swept in groups).
const ROW_GROUP: usize = 10;
/// Weight rows every group of rows sweeps before the next ones.
const OUT_CHUNK: usize = 64;
/// Blocks of the input summed apart before their sums are added in order
/// (the parts of a long input): 24 blocks of 10 rows of `x` are 30 KB.
const PART_BLOCKS: usize = 24;
/// Bytes of a group's rows of `x` above which it sweeps the weights one part
/// at a time, so that its part of `x` stays in L1 (48 KB on the machine
/// it was tuned on) while the weights stream past.
const X_IN_L1: usize = 32 << 10;

/// Outputs `first..first + y[r].len()` of every row: `y[r][o] = w[first + o] · x[r]`.
pub(crate) struct Task<'a> {
    pub w: &'a BlockWeight,
    pub first: usize,
    pub x: &'a [f32],
    pub y: Vec<&'a mut [f32]>,
    /// How Q4_1 blocks are dequantised (the table entry's choice).
    pub lut: Lut,
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
/// weight vectors are read from the L1 buffer. Inputs longer than
/// [`PART_BLOCKS`] blocks are swept a part at a time, so that the group's
/// rows of `x` stay in L1. Each output is summed over the same lanes in the same
/// order whatever the grouping (part by part, in order; within a part block
/// by block, then across lanes), so a row's result does not depend on the
/// other rows of the batch.
#[inline(always)]
fn run<S: Simd, const Q4: bool>(simd: S, task: Task<'_>) {
    let Task {
        w,
        first,
        x,
        mut y,
        lut,
    } = task;
    let rows = y.len();
    let n_out = y[0].len();
    let k = w.inp;
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
    w: &BlockWeight,
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
    w: &BlockWeight,
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
        // and the hardware's prefetcher alone leaves the kernel waiting on
        // its loads.
        let prefetch = Prefetch::new();
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
                let [low, high] = super::arch::x86::avx512::q4_1_table_vectors(
                    v4,
                    d[b],
                    m[b],
                    q[b * 16..][..16].try_into().expect("16"),
                );
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

/// How Q4_1 blocks are dequantised: through a 16-entry table where the
/// kernel runs at AVX-512's width (which permutes across its lanes), else
/// entry by entry. Chosen by the dispatch table's entry
/// ([`crate::cpu::dispatch`]), which knows the instruction set it runs at.
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
pub(crate) struct Lut {
    #[cfg(target_arch = "x86_64")]
    v4: Option<pulp::x86::V4>,
}

impl Lut {
    /// Every weight dequantised entry by entry.
    pub(crate) const ENTRY_BY_ENTRY: Self = Lut {
        #[cfg(target_arch = "x86_64")]
        v4: None,
    };

    /// Q4_1 weights looked up in a 16-entry table with AVX-512's lane
    /// permutes (for the kernel run at `v4`'s width).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn table(v4: pulp::x86::V4) -> Self {
        Lut { v4: Some(v4) }
    }
}

#[cfg(test)]
pub(crate) mod tests;
