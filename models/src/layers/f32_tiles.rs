//! `x Wᵀ` for many rows of f32 `x` (an ensemble step's N + 1) over the
//! 16-row tiles of an [`Int8Weight`], one output per lane.
//!
//! Why: [`super::quantized`]'s kernel holds 16 inputs of one weight row per
//! register and sums each output across the lanes at the end. With nine rows
//! it reached 82 GFMA/s on one thread of this machine (`examples/qk`),
//! 61% of the AVX-512 peak (measured at 134 GFMA/s: two FMAs of 16 lanes
//! per cycle). Here a register holds one input's weights for 16 outputs,
//! dequantised once (shift, mask, convert, then scale and offset in one
//! FMA: four instructions) and multiplied into every row's accumulator
//! with that row's input broadcast: nine FMAs per four others, no
//! horizontal sums; the records are prefetched 8 KB ahead, as
//! [`super::int8_activations`]'s kernels do. Nine rows on one thread
//! (`cargo run --release -p privmix-models --example qk`): [1536, 576]
//! 97.0 → 78.3 µs (82 → 102 GFMA/s); the Q8_0 head [49152, 576],
//! 4.14 → 2.43 ms. With few rows the dequantisation dominates (one row:
//! 16 GFMA/s against the lane-split kernel's 42), so the decode products
//! take this kernel from `MIN_ROWS` (8) rows only.
//!
//! Exactness: the same weights as the f32 path: the dequantiser's `d·q`,
//! then `+ m` (Q4_1), or `d·q` (Q8_0), from the f16 scales the records keep
//! (the dequantiser widens the same f16 values). `d·q` is exact in f32 (11
//! significant bits times at most 8), so the Q4_1 weight's one FMA rounds
//! once where the dequantiser rounds `d·q` (exactly) and then `+ m`: the
//! same bits (tested with unit rows of `x`). Each output of each row is
//! summed in one f32 lane, block by block, in one fixed order of the
//! block's inputs: a row's result depends neither on the other rows nor on
//! how the rows are grouped, and differs from the lane-split kernel's only
//! in the order of the sums, within the same `γ_{k+1} Σ|w_j x_j|` (tested).
//!
//! AVX-512 only (through `pulp`'s safe intrinsics); elsewhere the caller
//! keeps the lane-split kernel.

use super::int8_activations::Int8Weight;

/// Rows of `x` from which `HostWeight` (the decode products) takes this
/// kernel: below it, the lane-split kernel is faster on this
/// machine (`examples/qk`: 5 rows 74 against 82 GFMA/s; 9 rows 110
/// against 82).
pub(crate) const MIN_ROWS: usize = 8;
/// Most rows per pass over a tile (accumulators in registers).
const GROUP: usize = 12;
/// Values per block.
const QK: usize = 32;
/// Outputs per tile: the 16 lanes of a register.
const TILE: usize = 16;

/// Rows of `x` arranged for the kernel: in groups of at most [`GROUP`]
/// rows (as even as possible), each group block by block, input by input,
/// row by row (`[block][32][rows]`), so that one input of every row of the
/// group is one contiguous run.
pub(crate) struct InputRows {
    inp: usize,
    /// (first row, rows, values) of each group.
    groups: Vec<(usize, usize, Vec<f32>)>,
}

impl InputRows {
    /// `x: [rows, inp]`, row-major (`inp` a multiple of 32).
    pub(crate) fn new(x: &[f32], rows: usize, inp: usize) -> Self {
        debug_assert_eq!(x.len(), rows * inp);
        let count = rows.div_ceil(GROUP);
        let mut groups = Vec::with_capacity(count);
        let mut first = 0;
        for g in 0..count {
            let size = rows / count + usize::from(g < rows % count);
            let mut v = Vec::with_capacity(size * inp);
            for k in 0..inp {
                v.extend((first..first + size).map(|r| x[r * inp + k]));
            }
            groups.push((first, size, v));
            first += size;
        }
        InputRows { inp, groups }
    }

    /// Rows held.
    pub(crate) fn rows(&self) -> usize {
        self.groups
            .last()
            .map_or(0, |(first, size, _)| first + size)
    }
}

/// Whether this CPU runs the kernel (AVX-512).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        pulp::x86::V4::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Int8Weight {
    /// `x Wᵀ` with f32 activations for row-major `x: [rows, in]`, as
    /// row-major `[rows, out]`, on the calling thread, by this module's
    /// kernel; `None` where the CPU lacks AVX-512.
    pub fn matmul_f32(&self, x: &[f32], rows: usize) -> Option<Vec<f32>> {
        let out = self.out_features();
        let mut y = vec![0.0f32; rows * out];
        if rows == 0 {
            return available().then_some(y);
        }
        let mut views: Vec<&mut [f32]> = y.chunks_mut(out).collect();
        let xs = InputRows::new(x, rows, self.in_features());
        self.f32_columns_into(&xs, 0, &mut views).then_some(y)
    }

    /// Output columns `first..` (`first` a multiple of 16; as many as
    /// `y[r]` has room for, a multiple of 16 too) of every row of `x`, on
    /// the calling thread, by this module's kernel. `false`, leaving `y`
    /// untouched, where the CPU lacks AVX-512.
    pub(crate) fn f32_columns_into(
        &self,
        x: &InputRows,
        first: usize,
        y: &mut [&mut [f32]],
    ) -> bool {
        debug_assert_eq!(first % TILE, 0);
        debug_assert_eq!(x.inp, self.in_features());
        debug_assert_eq!(x.rows(), y.len());
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            let tiles = Tiles {
                w: self,
                first: first / TILE,
                x,
                y,
            };
            <pulp::x86::V4 as pulp::Simd>::vectorize(simd, tiles);
            return true;
        }
        let _ = (x, y);
        false
    }
}

/// [`Int8Weight::f32_columns_into`] inside the AVX-512 frame.
#[cfg(target_arch = "x86_64")]
struct Tiles<'a, 'y> {
    w: &'a Int8Weight,
    first: usize,
    x: &'a InputRows,
    y: &'a mut [&'y mut [f32]],
}

#[cfg(target_arch = "x86_64")]
impl pulp::WithSimd for Tiles<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Tiles { w, first, x, y } = self;
        let simd = pulp::x86::V4::try_new().expect("dispatched for AVX-512");
        let nb = w.in_features() / QK;
        let record = w.record_bytes();
        for t in 0..y[0].len() / TILE {
            // The tile's records and all after them (prefetched ahead).
            let tile = w.tile_records(first + t);
            for (row, size, xs) in &x.groups {
                let mut out = [[0.0f32; TILE]; GROUP];
                macro_rules! run {
                    ($($r:literal)*) => {
                        match (*size, w.is_q4_1()) {
                            $(($r, true) => tile_rows::<true, $r>(simd, (tile, record), nb, xs, &mut out),
                              ($r, false) => tile_rows::<false, $r>(simd, (tile, record), nb, xs, &mut out),)*
                            _ => unreachable!("groups hold 1 to {GROUP} rows"),
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
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile_rows<const Q4: bool, const R: usize>(
    simd: pulp::x86::V4,
    (tile, record): (&[u8], usize),
    nb: usize,
    xs: &[f32],
    out: &mut [[f32; TILE]; GROUP],
) {
    use super::int8_activations::avx512::{load, load_f16, prefetch_ahead};
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
                load_f16(simd, tile, at + 256),
                load_f16(simd, tile, at + 288),
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
            let d = load_f16(simd, tile, at + 512);
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
#[cfg(target_arch = "x86_64")]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgmlType, dequantize};
    use crate::layers::quantized::QuantizedWeight;
    use crate::layers::quantized::tests::{blocks, within_gamma};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every output within `γ_{k+1} Σ|w_j x_j|` of the exact f64 dot
        /// product with the dequantiser's f32 weights, and each row's
        /// result the same bits alone as in the batch (groups of up to 12
        /// rows, so batches past 12 are cut in two).
        #[test]
        fn matches_the_dequantised_weights_row_by_row(
            q8 in any::<bool>(),
            tiles in 1usize..5,
            nb in prop_oneof![1usize..4, 17usize..20],
            rows in 1usize..27,
            bytes in prop::collection::vec(any::<u8>(), 1..97),
            xs in prop::collection::vec(-2.0f32..2.0, 1..97),
        ) {
            let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
            let (out, inp) = (16 * tiles, nb * QK);
            let raw = blocks(ty, out, inp, &bytes);
            let q = QuantizedWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
            let w = Int8Weight::from_quantized(&q).unwrap();
            let dense = dequantize(ty, &raw, (out * inp) as u64).unwrap();
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| xs[i % xs.len()] * (1.0 + i as f32 * 1e-3))
                .collect();
            let Some(y) = w.matmul_f32(&x, rows) else {
                return Ok(()); // no AVX-512 here
            };
            for r in 0..rows {
                let alone = w.matmul_f32(&x[r * inp..(r + 1) * inp], 1).unwrap();
                prop_assert_eq!(&y[r * out..(r + 1) * out], &alone[..]);
            }
            within_gamma(&x, rows, &dense, out, &y).map_err(TestCaseError::fail)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The kernel multiplies by exactly the dequantiser's weights: with
        /// the rows of `x` the unit vectors, every output is one weight, bit
        /// for bit, for any finite f16 scales and minima (the Q4_1 weights'
        /// one FMA included).
        #[test]
        fn unit_rows_give_the_dequantised_weights_bit_for_bit(
            q8 in any::<bool>(),
            scales in prop::collection::vec(any::<u16>(), 2..9),
            bytes in prop::collection::vec(any::<u8>(), 1..97),
        ) {
            let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
            let (out, inp) = (32, 2 * QK);
            let finite: Vec<[u8; 2]> = scales
                .iter()
                .map(|&h| half::f16::from_bits(h))
                .map(|h| if h.is_finite() { h } else { half::f16::from_f32(0.5) })
                .map(half::f16::to_le_bytes)
                .collect();
            let mut raw = Vec::new();
            let mut next = bytes.iter().cycle();
            for i in 0..out * (inp / QK) {
                raw.extend(finite[i % finite.len()]);
                if !q8 {
                    raw.extend(finite[(i + 1) % finite.len()]);
                }
                raw.extend((0..if q8 { 32 } else { 16 }).map(|_| *next.next().unwrap()));
            }
            let q = QuantizedWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
            let w = Int8Weight::from_quantized(&q).unwrap();
            let dense = dequantize(ty, &raw, (out * inp) as u64).unwrap();
            let unit: Vec<f32> = (0..inp * inp).map(|i| f32::from(u8::from(i % (inp + 1) == 0))).collect();
            let Some(y) = w.matmul_f32(&unit, inp) else {
                return Ok(()); // no AVX-512 here
            };
            // (A zero weight's sign is lost to the +0 the sums start from.)
            for k in 0..inp {
                for o in 0..out {
                    let (got, want) = (y[k * out + o], dense[o * inp + k]);
                    prop_assert!(got.to_bits() == want.to_bits() || (got == 0.0 && want == 0.0),
                        "input {} output {}: {} vs {}", k, o, got, want);
                }
            }
        }
    }

    /// Columns computed from a later tile land in the right places: the
    /// second half of the outputs alone equals that half of the whole.
    #[test]
    fn columns_from_a_later_tile_equal_those_of_the_whole() {
        let (out, inp, rows) = (64, 96, 9);
        let raw = blocks(GgmlType::Q4_1, out, inp, &[3, 200, 17, 99, 250]);
        let q = QuantizedWeight::from_ggml(GgmlType::Q4_1, &raw, out, inp)
            .unwrap()
            .unwrap();
        let w = Int8Weight::from_quantized(&q).unwrap();
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| (i % 13) as f32 / 4.0 - 1.5)
            .collect();
        let Some(whole) = w.matmul_f32(&x, rows) else {
            return;
        };
        let xs = InputRows::new(&x, rows, inp);
        let mut part = vec![0.0f32; rows * 32];
        let mut views: Vec<&mut [f32]> = part.chunks_mut(32).collect();
        assert!(w.f32_columns_into(&xs, 32, &mut views));
        for r in 0..rows {
            assert_eq!(&part[r * 32..][..32], &whole[r * out + 32..][..32]);
        }
    }
}
