//! The AVX-512 tile kernel with VNNI's `vpdpbusd`, which sums four
//! 8-bit products into each 32-bit lane in one instruction: the
//! `vpmaddubsw` + `vpaddw` + `vpmaddwd` chain of [`super::avx512`] in
//! one. Its unsigned operand is the Q4_1 nibbles, or for Q8_0 `x + 128`
//! (the weights stay signed, so no sign trick per row is needed; `128·Σw`
//! is subtracted once per block). Same integer sums (all exact), same f32
//! steps after them, so the same bits.
//!
//! Why `unsafe` here: pulp 0.22 (through which
//! every other kernel reaches its intrinsics safely) wraps no VNNI
//! instruction. Rust's own intrinsics are safe inside a function
//! compiled for their features, and calling such a function is safe
//! only from one compiled for them too; [`Kernel`] is the bridge. It can
//! only be made by [`Kernel::new`], after the CPU was seen to have every
//! feature [`tile_rows`] is compiled for, so each call through it is
//! sound.

use core::arch::x86_64::{
    __m512i, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_mul_ps,
    _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_slli_epi32, _mm512_sub_epi32,
};

use super::avx512::{load, load_f16, prefetch_ahead, q4_1_weights, splat4};
use crate::cpu::quants::Q8Rows;
use crate::cpu::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES};
use crate::cpu::{QK, TILE, TILE_ROW_GROUP};

/// [`tile_rows`] as a [`crate::cpu::tiles_q8::TileKernel`], for a CPU known to have
/// AVX-512 F/BW and VNNI.
pub(crate) struct Kernel<'a> {
    v4: pulp::x86::V4,
    q4_1: bool,
    xq: &'a Q8Rows,
}

impl<'a> Kernel<'a> {
    /// The kernel, if this CPU has AVX-512 F/BW/VL and VNNI.
    pub(crate) fn new(q4_1: bool, xq: &'a Q8Rows) -> Option<Self> {
        let v4 = pulp::x86::V4::try_new()?;
        std::arch::is_x86_feature_detected!("avx512vnni").then_some(Kernel { v4, q4_1, xq })
    }

    /// The rows of `x` it multiplies.
    pub(crate) fn rows(&self) -> &'a Q8Rows {
        self.xq
    }

    /// The SIMD token whose frame the tile loop runs in.
    pub(crate) fn v4(&self) -> pulp::x86::V4 {
        self.v4
    }
}

impl crate::cpu::tiles_q8::TileKernel for Kernel<'_> {
    const GROUP: usize = TILE_ROW_GROUP;

    #[inline(always)]
    fn run(
        &mut self,
        tile: &[u8],
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; TILE_ROW_GROUP],
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
                    _ => unreachable!("row groups hold 1 to {} rows", TILE_ROW_GROUP),
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
/// [`crate::cpu::reference::tile_rows`] computes it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_rows<const Q4: bool, const R: usize>(
    v4: pulp::x86::V4,
    tile: &[u8],
    xq: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; TILE_ROW_GROUP],
) {
    let nb = xq.inp / QK;
    let record = if Q4 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let rec = &tile[b * record..][..record];
        prefetch_ahead(v4, tile, b * record, record);
        let at = |j: usize| (rows.start + j) * nb + b;
        if Q4 {
            let w = q4_1_weights(v4, rec);
            let d = load_f16(v4, rec, BlockQ4_1x16::D_AT);
            let m = load_f16(v4, rec, BlockQ4_1x16::M_AT);
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
            let d = load_f16(v4, rec, BlockQ8_0x16::D_AT);
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
