//! The AVX2 tile kernel, through pulp's safe intrinsics: each tile in
//! two halves of 8 outputs (one 256-bit register of lanes), rows in
//! groups of [`ROW_GROUP_AVX2`] (AVX2 has 16 vector registers).

use core::arch::x86_64::{__m128i, __m256, __m256i};

use super::tile_kernel;
use crate::cpu::quants::Q8Rows;
use crate::cpu::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES};
use crate::cpu::{QK, TILE, TILE_ROW_GROUP};

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
pub(crate) fn load_f16(simd: pulp::x86::V3, b: &[u8], at: usize) -> __m256 {
    let (a, a2) = (simd.avx, simd.avx2);
    let h: __m128i = bytemuck::cast::<[u8; 16], _>(b[at..at + 16].try_into().expect("16 bytes"));
    let h = a2._mm256_cvtepu16_epi32(h);
    let sign = a2._mm256_slli_epi32::<16>(a2._mm256_and_si256(h, a._mm256_set1_epi32(0x8000)));
    let shifted = a2._mm256_slli_epi32::<13>(a2._mm256_and_si256(h, a._mm256_set1_epi32(0x7fff)));
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
/// [`crate::cpu::reference::tile_rows`] computes it, 8 outputs at a time.
#[inline(always)]
fn tile_rows<const Q4: bool, const R: usize>(
    simd: pulp::x86::V3,
    tile: &[u8],
    xq: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; TILE_ROW_GROUP],
) {
    let (a, a2, f) = (simd.avx, simd.avx2, simd.fma);
    let nb = xq.inp / QK;
    let record = if Q4 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
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
                let d = load_f16(simd, rec, BlockQ4_1x16::D_AT + 16 * half);
                let m = load_f16(simd, rec, BlockQ4_1x16::M_AT + 16 * half);
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
                let d = load_f16(simd, rec, BlockQ8_0x16::D_AT + 16 * half);
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
