use crate::cpu::dispatch::Isa;
use crate::cpu::quants::{BlockWeight, Q8Rows, quantize_block};
use crate::cpu::repack::TiledWeight;
use crate::cpu::{QK, TILE, TILE_ROW_GROUP};
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

fn weight(q8: bool, out: usize, inp: usize, bytes: &[u8]) -> (BlockWeight, TiledWeight) {
    let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
    let raw = gguf_blocks(q8, out, inp, bytes);
    let w = BlockWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
    let int8 = TiledWeight::from_blocks(&w).unwrap();
    (w, int8)
}

/// `x Wᵀ` by the portable definition alone.
fn portable(w: &TiledWeight, x: &[f32], rows: usize) -> Vec<f32> {
    let (out, inp) = (w.out_features(), w.in_features());
    let xq = Q8Rows::new(x, rows, inp);
    let nb = inp / QK;
    let record = w.record_bytes();
    let mut y = vec![0.0f32; rows * out];
    for t in 0..out / TILE {
        let tile = &w.tile_bytes(t)[..nb * record];
        for r in 0..rows {
            let mut out_tile = [[0.0f32; TILE]; TILE_ROW_GROUP];
            crate::cpu::reference::tile_rows(w.is_q4_1(), tile, &xq, r..r + 1, &mut out_tile);
            y[r * out + t * TILE..][..TILE].copy_from_slice(&out_tile[0]);
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
        for isa in [Isa::Avx512Vnni, Isa::Avx512, Isa::Avx2, Isa::Fallback] {
            let kernel = int8.q8_kernel_for(isa);
            prop_assert_eq!(&bits(&int8.matmul_with(&x, rows, kernel)), &want, "{}", kernel);
        }
        // Each row alone gives the same bits (the grouping of rows does
        // not reach a row's sums).
        for r in [0, rows - 1] {
            let alone = int8.matmul(&x[r * inp..(r + 1) * inp], 1);
            prop_assert_eq!(&y[r * out..(r + 1) * out], &alone[..]);
        }
        let xq = Q8Rows::new(&x, rows, inp);
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

/// The AMX int8 kernel gives the VNNI kernel's bits (and the portable
/// definition's), for both formats, row counts below, at and past its 16-row
/// groups (ragged last groups), many rows, and block counts odd and even;
/// where the CPU or the process cannot use AMX the table's entry at that level
/// is VNNI's, which the same comparison checks against the definition.
#[test]
fn amx_int8_gives_the_vnni_bits() {
    let amx_used = Isa::detected() == Isa::AmxInt8;
    for (q8, tiles, nb, rows) in [
        (false, 1, 1, 16),
        (true, 2, 3, 17),
        (false, 3, 19, 33),
        (true, 1, 18, 15),
        (false, 2, 5, 72),
        (true, 2, 4, 72),
        (true, 1, 2, 288),
        (false, 1, 3, 290),
    ] {
        let (out, inp) = (tiles * TILE, nb * QK);
        let bytes: Vec<u8> = (0..257u32).map(|i| (i * 97 + 13) as u8).collect();
        let (_, int8) = weight(q8, out, inp, &bytes);
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-2 * (1.0 + (i % 31) as f32))
            .collect();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let amx = int8.q8_kernel_for(Isa::AmxInt8);
        let vnni = int8.q8_kernel_for(Isa::Avx512Vnni);
        assert_eq!(amx.isa == Isa::AmxInt8, amx_used, "{amx}");
        let got = bits(&int8.matmul_with(&x, rows, amx));
        assert_eq!(
            got,
            bits(&int8.matmul_with(&x, rows, vnni)),
            "{q8} {tiles} {nb} {rows}"
        );
        assert_eq!(
            got,
            bits(&portable(&int8, &x, rows)),
            "{q8} {tiles} {nb} {rows}"
        );
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
            let got = simd.vectorize(|| crate::cpu::arch::x86::avx512::quantize_block(simd, &x, &mut b));
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
        simd.vectorize(|| crate::cpu::arch::x86::avx512::quantize_block(simd, &tie, &mut q4));
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
        let got: [f32; 8] = bytemuck::cast(
            simd.vectorize(|| crate::cpu::arch::x86::avx2::load_f16(simd, &bytes, 0)),
        );
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

/// Rows quantised one by one into [`Q8Rows::zeroed`] equal the
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
    let together = Q8Rows::new(&x, rows, inp);
    let mut one_by_one = Q8Rows::zeroed(rows, inp);
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
    let w = BlockWeight::from_ggml(GgmlType::Q4_1, &raw, 17, 32)
        .unwrap()
        .unwrap();
    assert!(TiledWeight::from_blocks(&w).is_none());
}

/// VNNI's kernel for many rows (each tile prepared once for all rows) gives
/// the bits of VNNI's row groups over the streamed tiles, at every row count
/// from 1 to 300 (below, at and past its smallest row count, every group
/// size and ragged last group), for both formats, tile and block counts odd
/// and even, and weights of every byte value (Q8_0's −128 included); and
/// the portable definition's at row counts that give every group size.
#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_many_rows_gives_the_row_groups_bits() {
    use crate::cpu::dispatch::tiles_q8_avx512_vnni_groups;
    if !Isa::Avx512Vnni.available() {
        return;
    }
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for q8 in [false, true] {
        for (tiles, nb, all_rows) in [(3, 5, true), (2, 4, true), (1, 1, true), (2, 48, false)] {
            let (out, inp) = (tiles * TILE, nb * QK);
            let bytes: Vec<u8> = (0..=255u8).map(|i| i.wrapping_mul(167) ^ 0x5a).collect();
            let (_, int8) = weight(q8, out, inp, &bytes);
            let vnni = int8.q8_kernel_for(Isa::Avx512Vnni);
            let counts: Vec<usize> = if all_rows {
                (1..=300).collect()
            } else {
                vec![1, 15, 16, 17, 24, 25, 72, 288, 299]
            };
            for rows in counts {
                let x: Vec<f32> = (0..rows * inp)
                    .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-2 * (1.0 + (i % 29) as f32))
                    .collect();
                let got = bits(&int8.matmul_with(&x, rows, vnni));
                let xq = Q8Rows::new(&x, rows, inp);
                let mut want = vec![0.0f32; rows * out];
                let mut views: Vec<&mut [f32]> = want.chunks_mut(out).collect();
                tiles_q8_avx512_vnni_groups(&int8, &xq, 0, &mut views);
                assert_eq!(
                    got,
                    bits(&want),
                    "q8 {q8}, {tiles} tiles, {nb} blocks, {rows} rows"
                );
                if rows <= 24 || rows == 288 {
                    assert_eq!(
                        got,
                        bits(&portable(&int8, &x, rows)),
                        "q8 {q8}, {tiles} tiles, {nb} blocks, {rows} rows"
                    );
                }
            }
        }
    }
}
