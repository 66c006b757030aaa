//! The VNNI tile × 8-bit product of [`super::avx512_vnni`] for many rows
//! of `x` at once (from [`MIN_ROWS`] on): the same integer sums and the
//! same f32 steps per output, block after block, so the same bits.
//!
//! Where the time goes with many rows: every output's block costs eight
//! `vpdpbusd` and, after them, its f32 steps (a conversion, the scale
//! product `d · dₓ` and one FMA; a second FMA for a Q4_1 minimum), all on
//! the same two vector ports. Anything else per row and block is on top of
//! that floor, and so is waiting: the eight `vpdpbusd` of one sum depend on
//! each other. So this kernel:
//!
//! - prepares each tile once for all rows, not once per group of rows: the
//!   Q4_1 nibbles unpacked to bytes, the f16 scales (and minima) widened,
//!   and for Q8_0 the start of each sum, `−128·Σw` ([`Prepared`], a few KiB
//!   that stay in L1 while every group of rows passes over them);
//! - lays the rows out once per product group by group, block by block
//!   ([`Packed`]): a block's bytes of the group's rows side by side, so that
//!   each four are read by a broadcast load (a load, not a vector
//!   instruction; folded into the `vpdpbusd` where `x` is its signed
//!   operand, Q4_1) at a fixed offset from one pointer;
//! - Q8_0 takes `x + 128` as the unsigned operand times the signed weights,
//!   as [`super::avx512_vnni`] does, but starts each sum at `−128·Σw`
//!   instead of subtracting it after: `Σ(x + 128)·w − 128·Σw = Σx·w`,
//!   the same exact integer;
//! - runs the group's sums side by side, four bytes of every row after
//!   another (up to `GROUP` independent chains in flight), and only then
//!   each row's f32 steps.
//!
//! The arithmetic per output `o`, row `r`, block `b` in order is
//! [`crate::cpu::tiles_q8`]'s: `acc = fma(m_ob, s_rb, acc)` (Q4_1), then
//! `acc = fma(I_orb as f32, d_ob · dₓ,rb, acc)` with `I_orb` the exact
//! integer sum.
//!
//! Soundness: as [`super::avx512_vnni`]: [`tiles`] takes that module's
//! `Kernel`, which exists only where the CPU has every feature the
//! functions here are compiled for; the reads by pointer stay inside
//! slices whose lengths are checked once per group of rows.

use core::arch::x86_64::{
    __m512, __m512i, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_mul_ps,
    _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_slli_epi32, _mm512_sub_epi32,
};

use bytemuck::Zeroable;

use super::avx512::{load, load_f16, q4_1_weights};
use super::avx512_vnni::Kernel;
use crate::cpu::quants::Q8Rows;
use crate::cpu::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES, TiledWeight};
use crate::cpu::{QK, TILE};

/// Fewest rows of `x` the products take this kernel for; fewer go to
/// [`super::avx512_vnni`]'s row groups, which read the weights as they
/// stream in (a product with few rows is bound by reading them).
pub(crate) const MIN_ROWS: usize = 16;

/// Most rows per pass over a prepared tile: as many sums in flight as fit
/// the 32 vector registers beside their f32 accumulators.
const GROUP: usize = 14;

/// One block of a tile, prepared for every row.
#[derive(Clone, Copy, Zeroable)]
#[repr(C)]
struct Prepared {
    /// The weights: Q4_1 nibbles as bytes, `vpdpbusd`'s unsigned operand
    /// (registers 0–3 the low nibbles, 4–7 the high ones, as
    /// [`q4_1_weights`] returns them); Q8_0 the record's signed bytes.
    w: [__m512i; 8],
    /// The scales `d`, widened.
    d: __m512,
    /// Q4_1: the minima `m`, widened; Q8_0: `−128·Σw` per output as 32-bit
    /// integers, the start of each sum.
    extra: __m512,
}

/// The rows of `x` group by group: a group of `R` rows from row `r0` holds
/// row `r0 + j`'s block `b` at `x[r0·nb·32 + (b·R + j)·32..][..32]`, and its
/// per-block values at `[r0·nb + b·R + j]`.
struct Packed {
    /// Q4_1: `q` (signed); Q8_0: `q + 128` (unsigned).
    x: Vec<u8>,
    /// `dₓ`.
    d: Vec<f32>,
    /// Q4_1: `dₓ · Σq` over the block (empty for Q8_0).
    s: Vec<f32>,
}

/// The sizes of the groups `rows` rows are split into: nearly equal, as
/// the row groups of `TiledWeight::for_each_tile` (a row's result does not
/// depend on its group).
fn group_sizes(rows: usize) -> impl Iterator<Item = usize> {
    let groups = rows.div_ceil(GROUP);
    (0..groups).map(move |g| rows / groups + usize::from(g < rows % groups))
}

impl Packed {
    /// The first `nb` blocks of `rows` rows of `xq`, for Q4_1 (`q4`) or Q8_0.
    fn new(xq: &Q8Rows, rows: usize, nb: usize, q4: bool) -> Self {
        let blocks = rows * nb;
        let mut p = Packed {
            x: Vec::with_capacity(blocks * QK),
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(if q4 { blocks } else { 0 }),
        };
        let bytes: &[u8] = if q4 {
            bytemuck::cast_slice(&xq.q)
        } else {
            &xq.biased
        };
        let row_blocks = xq.inp / QK;
        let mut r0 = 0;
        for size in group_sizes(rows) {
            for b in 0..nb {
                for r in r0..r0 + size {
                    p.x.extend_from_slice(&bytes[r * xq.inp + b * QK..][..QK]);
                    p.d.push(xq.d[r * row_blocks + b]);
                    if q4 {
                        p.s.push(xq.s[r * row_blocks + b]);
                    }
                }
            }
            r0 += size;
        }
        p
    }
}

/// Output tiles `first..` (as many as `y[r]` has room for) of every row
/// of the kernel's rows times `w`, into `y`, on the calling thread: the
/// values of [`super::avx512_vnni`]'s row groups, bit for bit.
pub(crate) fn tiles(kernel: &Kernel<'_>, w: &TiledWeight, first: usize, y: &mut [&mut [f32]]) {
    let xq = kernel.rows();
    // SAFETY: a `Kernel` exists only where `Kernel::new` found AVX-512
    // F/BW/VL and VNNI on this CPU, every feature `tiles_on` is compiled for.
    unsafe { tiles_on(w, xq, first, y) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn tiles_on(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    let rows = y.len();
    if rows == 0 {
        return;
    }
    let nb = xq.inp / QK;
    let q4 = w.is_q4_1();
    let record = w.record_bytes();
    let v4 = pulp::x86::V4::try_new().expect("AVX-512, as the kernel's features say");
    let packed = Packed::new(xq, rows, nb, q4);
    let mut prepared = vec![Prepared::zeroed(); nb];
    for t in 0..y[0].len() / TILE {
        let tile = w.tile_bytes(first + t);
        for (b, p) in prepared.iter_mut().enumerate() {
            let rec = &tile[b * record..][..record];
            *p = if q4 {
                prepare_q4_1(v4, rec)
            } else {
                prepare_q8_0(v4, rec)
            };
        }
        // The first group asks for the next tile's records as it goes, so
        // that preparing that tile does not wait on memory.
        let next = tile.get(nb * record..).unwrap_or_default();
        let mut r0 = 0;
        for size in group_sizes(rows) {
            let ys = &mut y[r0..r0 + size];
            let next = if r0 == 0 { next } else { &[] };
            let g = Group {
                v4,
                prepared: &prepared,
                packed: &packed,
                next,
                r0,
                t,
            };
            macro_rules! dispatch {
                ($($r:literal)*) => {
                    match (q4, size) {
                        $((true, $r) => group::<true, $r>(g, ys),
                          (false, $r) => group::<false, $r>(g, ys),)*
                        _ => unreachable!("groups hold 1 to {GROUP} rows"),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14);
            r0 += size;
        }
    }
}

/// A Q4_1 record prepared: nibbles unpacked, scales and minima widened.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn prepare_q4_1(v4: pulp::x86::V4, rec: &[u8]) -> Prepared {
    Prepared {
        w: q4_1_weights(v4, rec),
        d: load_f16(v4, rec, BlockQ4_1x16::D_AT),
        extra: load_f16(v4, rec, BlockQ4_1x16::M_AT),
    }
}

/// A Q8_0 record prepared: its weights, its scales widened, and `−128·Σw`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn prepare_q8_0(v4: pulp::x86::V4, rec: &[u8]) -> Prepared {
    let ones = _mm512_set1_epi8(1);
    let w: [__m512i; 8] = std::array::from_fn(|p| load(rec, 64 * p));
    let sum_w = w.iter().fold(_mm512_setzero_si512(), |s, wp| {
        _mm512_dpbusd_epi32(s, ones, *wp)
    });
    let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum_w));
    Prepared {
        w,
        d: load_f16(v4, rec, BlockQ8_0x16::D_AT),
        extra: bytemuck::cast(start),
    }
}

/// One group of rows over one prepared tile.
#[derive(Clone, Copy)]
struct Group<'a> {
    v4: pulp::x86::V4,
    prepared: &'a [Prepared],
    packed: &'a Packed,
    /// Records to prefetch, one per block (the next tile's; or none).
    next: &'a [u8],
    /// The group's first row.
    r0: usize,
    /// The tile.
    t: usize,
}

/// `y[j][t·16..][..16] = w_i · x_{r0 + j}` for the `R` rows of the group
/// at `r0` over one prepared tile `t`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const Q4: bool, const R: usize>(g: Group<'_>, y: &mut [&mut [f32]]) {
    let Group {
        v4,
        prepared,
        packed,
        next,
        r0,
        t,
    } = g;
    let record = if Q4 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
    let nb = prepared.len();
    assert_eq!(y.len(), R);
    // Every read below lies in these slices: the group's rows and values.
    let x = packed.x[r0 * nb * QK..][..R * nb * QK].as_ptr();
    let dx = packed.d[r0 * nb..][..R * nb].as_ptr();
    let sx = if Q4 {
        packed.s[r0 * nb..][..R * nb].as_ptr()
    } else {
        std::ptr::null()
    };
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, p) in prepared.iter().enumerate() {
        for line in (0..record).step_by(64) {
            if let Some(ahead) = next.get(b * record + line) {
                let at: *const u8 = ahead;
                v4.sse
                    ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
            }
        }
        // SAFETY (each read): b < nb and j < R, so `b·R + j < R·nb`, and the
        // four bytes at `(b·R + j)·32 + k` (k + 4 ≤ 32) lie in `R·nb·32`;
        // `sx` is read for Q4_1 only.
        let value = |v: *const f32, j: usize| unsafe { v.add(b * R + j).read() };
        let four = |j: usize, k: usize| {
            _mm512_set1_epi32(unsafe {
                x.add((b * R + j) * QK + 4 * k)
                    .cast::<i32>()
                    .read_unaligned()
            })
        };
        let start = if Q4 {
            _mm512_setzero_si512()
        } else {
            bytemuck::cast(p.extra)
        };
        let mut s = [start; R];
        // Register k holds inputs 4k..4k + 4 of the block (for Q4_1 the
        // low nibbles' for k < 4, then the high nibbles', inputs 16 + 4(k − 4)..).
        for (k, wk) in p.w.iter().enumerate() {
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = if Q4 {
                    _mm512_dpbusd_epi32(*sj, *wk, four(j, k))
                } else {
                    _mm512_dpbusd_epi32(*sj, four(j, k), *wk)
                };
            }
        }
        for (j, a) in acc.iter_mut().enumerate() {
            let i = _mm512_cvtepi32_ps(s[j]);
            if Q4 {
                *a = _mm512_fmadd_ps(p.extra, _mm512_set1_ps(value(sx, j)), *a);
            }
            let scale = _mm512_mul_ps(p.d, _mm512_set1_ps(value(dx, j)));
            *a = _mm512_fmadd_ps(i, scale, *a);
        }
    }
    for (yj, a) in y.iter_mut().zip(acc) {
        let out: [f32; TILE] = bytemuck::cast(a);
        yj[t * TILE..][..TILE].copy_from_slice(&out);
    }
}
