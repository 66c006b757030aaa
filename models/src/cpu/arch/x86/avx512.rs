//! The AVX-512 kernels, through pulp's safe intrinsics: tiles × 8-bit
//! rows, tiles × f32 rows, the 8-bit quantiser of `x`, and the Q4_1
//! table lookup of the block × f32 kernel.

use core::arch::x86_64::{__m256i, __m512, __m512i};

use pulp::Simd;

use super::tile_kernel;
use crate::cpu::quants::Q8Rows;
use crate::cpu::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES, TiledWeight};
use crate::cpu::tiles_f32::InterleavedRows;
use crate::cpu::{PREFETCH_AHEAD, QK, TILE, TILE_ROW_GROUP};

tile_kernel!(pulp::x86::V4, TILE_ROW_GROUP, 1 2 3 4 5 6 7 8 9 10 11 12);

/// [`crate::cpu::quants::quantize_block`], with the same roundings: the largest
/// magnitude, `x/d` divided and rounded to nearest even (the default
/// rounding of `vcvtps2dq`), the integer sum.
#[inline(always)]
pub(crate) fn quantize_block(simd: pulp::x86::V4, x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    let f = simd.avx512f;
    let [x0, x1]: [__m512; 2] = bytemuck::cast(*x);
    let zero = f._mm512_setzero_ps();
    // x·0 is NaN exactly where x is NaN or infinite.
    let probe = f._mm512_add_ps(f._mm512_mul_ps(x0, zero), f._mm512_mul_ps(x1, zero));
    if f._mm512_cmp_ps_mask::<{ core::arch::x86_64::_CMP_UNORD_Q }>(probe, probe) != 0 {
        q.fill(0);
        return (f32::NAN, f32::NAN);
    }
    let amax = f._mm512_reduce_max_ps(f._mm512_max_ps(f._mm512_abs_ps(x0), f._mm512_abs_ps(x1)));
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
pub(crate) fn load(b: &[u8], at: usize) -> __m512i {
    bytemuck::cast::<[u8; 64], __m512i>(b[at..at + 64].try_into().expect("64 bytes"))
}

/// 16 f16 values of `b` from `at`, widened.
#[inline(always)]
pub(crate) fn load_f16(simd: pulp::x86::V4, b: &[u8], at: usize) -> __m512 {
    let h = bytemuck::cast::<[u8; 32], __m256i>(b[at..at + 32].try_into().expect("32 bytes"));
    simd.avx512f._mm512_cvtph_ps(h)
}

/// Four bytes of a quantised row broadcast to every 32-bit lane.
#[inline(always)]
pub(crate) fn splat4(simd: pulp::x86::V4, q: &[i8], at: usize) -> __m512i {
    let b: [i8; 4] = q[at..at + 4].try_into().expect("4 bytes");
    simd.avx512f
        ._mm512_set1_epi32(i32::from_le_bytes(b.map(|v| v as u8)))
}

/// Prefetches the `record` bytes [`PREFETCH_AHEAD`] on from `at` in
/// `tile` (nothing past its end), so that memory latency overlaps with
/// this block's products.
#[inline(always)]
pub(crate) fn prefetch_ahead(simd: pulp::x86::V4, tile: &[u8], at: usize, record: usize) {
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
pub(crate) fn q4_1_weights(simd: pulp::x86::V4, rec: &[u8]) -> [__m512i; 8] {
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
/// [`crate::cpu::reference::tile_rows`] computes it.
#[inline(always)]
fn tile_rows<const Q4: bool, const R: usize>(
    simd: pulp::x86::V4,
    tile: &[u8],
    xq: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; TILE_ROW_GROUP],
) {
    let (f, bw) = (simd.avx512f, simd.avx512bw);
    let nb = xq.inp / QK;
    let record = if Q4 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
    let ones = f._mm512_set1_epi16(1);
    let zero = f._mm512_setzero_si512();
    let mut acc = [f._mm512_setzero_ps(); R];
    for b in 0..nb {
        let rec = &tile[b * record..][..record];
        prefetch_ahead(simd, tile, b * record, record);
        let at = |j: usize| (rows.start + j) * nb + b;
        if Q4 {
            let w = q4_1_weights(simd, rec);
            let d = load_f16(simd, rec, BlockQ4_1x16::D_AT);
            let m = load_f16(simd, rec, BlockQ4_1x16::M_AT);
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
            let d = load_f16(simd, rec, BlockQ8_0x16::D_AT);
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

/// Output tiles `first..` (as many as `y[r]` has room for) of `x Wᵀ` for
/// f32 rows arranged for the tiles: `gemm_q4_1x16_f32` and
/// `gemm_q8_0x16_f32` of [`crate::cpu::dispatch`].
///
/// A register holds one input's weights for 16 outputs, dequantised once
/// (shift, mask, convert, then scale and offset in one FMA: four
/// instructions) and multiplied into every row's accumulator with that
/// row's input broadcast: `R` FMAs per four others, no horizontal sums.
pub(crate) fn tiles_f32(w: &TiledWeight, x: &InterleavedRows, first: usize, y: &mut [&mut [f32]]) {
    let simd = pulp::x86::V4::try_new().expect("dispatched for AVX-512");
    let tiles = TilesF32 { w, first, x, y };
    <pulp::x86::V4 as pulp::Simd>::vectorize(simd, tiles);
}

/// The tile × f32 kernel's loop over tiles and groups of rows, inside the
/// AVX-512 frame.
struct TilesF32<'a, 'y> {
    w: &'a TiledWeight,
    first: usize,
    x: &'a InterleavedRows,
    y: &'a mut [&'y mut [f32]],
}

impl pulp::WithSimd for TilesF32<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let TilesF32 { w, first, x, y } = self;
        let simd = pulp::x86::V4::try_new().expect("dispatched for AVX-512");
        let nb = w.in_features() / QK;
        let record = w.record_bytes();
        for t in 0..y[0].len() / TILE {
            // The tile's records and all after them (prefetched ahead).
            let tile = w.tile_bytes(first + t);
            for (row, size, xs) in &x.groups {
                let mut out = [[0.0f32; TILE]; TILE_ROW_GROUP];
                macro_rules! run {
                    ($($r:literal)*) => {
                        match (*size, w.is_q4_1()) {
                            $(($r, true) => tile_rows_f32::<true, $r>(simd, (tile, record), nb, xs, &mut out),
                              ($r, false) => tile_rows_f32::<false, $r>(simd, (tile, record), nb, xs, &mut out),)*
                            _ => unreachable!("groups hold 1 to {TILE_ROW_GROUP} rows"),
                        }
                    };
                }
                run!(1 2 3 4 5 6 7 8 9 10 11 12);
                for (j, o) in out.iter().take(*size).enumerate() {
                    y[*row + j][t * TILE..][..TILE].copy_from_slice(o);
                }
            }
        }
    }
}

/// `out[j][i] = w_i · x_j` over one tile's records (`tile`: the tile's
/// and all after them; `record`: bytes per block) for a group of `R` rows
/// (`xs`: `[block][32][R]`). The records are prefetched ahead as the 8-bit
/// kernels prefetch them: a step reads every weight from memory once, and
/// the hardware's prefetcher alone left this kernel waiting on the loads
/// (`perf` on the Q8_0 head).
#[inline(always)]
fn tile_rows_f32<const Q4: bool, const R: usize>(
    simd: pulp::x86::V4,
    (tile, record): (&[u8], usize),
    nb: usize,
    xs: &[f32],
    out: &mut [[f32; TILE]; TILE_ROW_GROUP],
) {
    let f = simd.avx512f;
    let mask = f._mm512_set1_epi32(0x0f);
    let mut acc = [f._mm512_setzero_ps(); R];
    let xs = &xs[..nb * QK * R];
    for b in 0..nb {
        let at = b * record;
        prefetch_ahead(simd, tile, at, record);
        let xb: &[[f32; R]] = bytemuck::cast_slice(&xs[b * QK * R..(b + 1) * QK * R]);
        let xb: &[[f32; R]; QK] = xb.try_into().expect("32 inputs");
        if Q4 {
            let (d, m) = (
                load_f16(simd, tile, at + BlockQ4_1x16::D_AT),
                load_f16(simd, tile, at + BlockQ4_1x16::M_AT),
            );
            // Register p, lane i: bytes 4p..4p+3 of output i's block; byte
            // t's low nibble is input 4p + t, its high nibble 16 + 4p + t.
            for p in 0..4 {
                let v = load(tile, at + 64 * p);
                for half in 0..2 {
                    for t in 0..4 {
                        let shift = f._mm512_set1_epi32((8 * t + 4 * half) as i32);
                        let q = f._mm512_and_si512(f._mm512_srlv_epi32(v, shift), mask);
                        // `d·q` is exact in f32 (an f16 scale's 11
                        // significant bits times 4), so one FMA rounds
                        // `d·q + m` exactly as the dequantiser's `d·q`
                        // then `+ m` does.
                        let w = f._mm512_fmadd_ps(f._mm512_cvtepi32_ps(q), d, m);
                        fma_rows(simd, w, &xb[16 * half + 4 * p + t], &mut acc);
                    }
                }
            }
        } else {
            let d = load_f16(simd, tile, at + BlockQ8_0x16::D_AT);
            // Register j, lane i: bytes 4j..4j+3 (inputs) of output i's block.
            for reg in 0..8 {
                let v = load(tile, at + 64 * reg);
                for t in 0..4 {
                    let up = f._mm512_set1_epi32((24 - 8 * t) as i32);
                    let q = f._mm512_srai_epi32::<24>(f._mm512_sllv_epi32(v, up));
                    let w = f._mm512_mul_ps(f._mm512_cvtepi32_ps(q), d);
                    fma_rows(simd, w, &xb[4 * reg + t], &mut acc);
                }
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = bytemuck::cast(a);
    }
}

/// The weights of one input for the tile's 16 outputs, times every row's
/// value of that input, into the rows' accumulators. (A function, not a
/// closure: a closure's body need not be inlined into the SIMD frame, and
/// the intrinsics must be.)
#[inline(always)]
fn fma_rows<const R: usize>(
    simd: pulp::x86::V4,
    w: core::arch::x86_64::__m512,
    x: &[f32; R],
    acc: &mut [core::arch::x86_64::__m512; R],
) {
    let f = simd.avx512f;
    for (a, &xj) in acc.iter_mut().zip(x) {
        *a = f._mm512_fmadd_ps(w, f._mm512_set1_ps(xj), *a);
    }
}

/// One Q4_1 block's 32 weights as two vectors (entries 0–15, 16–31), by
/// table lookup (see `Lut` in [`crate::cpu::blocks_f32`]).
#[inline(always)]
pub(crate) fn q4_1_table_vectors(
    simd: pulp::x86::V4,
    d: f32,
    m: f32,
    qs: &[u8; 16],
) -> [pulp::f32x16; 2] {
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
