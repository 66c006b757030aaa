use super::*;
use crate::cpu::QK;
use crate::cpu::quants::BlockWeight;
use crate::cpu::quants::tests::{blocks, within_gamma};
use crate::cpu::repack::TiledWeight;
use crate::gguf::{GgmlType, dequantize};
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
        let q = BlockWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
        let w = TiledWeight::from_blocks(&q).unwrap();
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
        let q = BlockWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
        let w = TiledWeight::from_blocks(&q).unwrap();
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
    let q = BlockWeight::from_ggml(GgmlType::Q4_1, &raw, out, inp)
        .unwrap()
        .unwrap();
    let w = TiledWeight::from_blocks(&q).unwrap();
    let x: Vec<f32> = (0..rows * inp)
        .map(|i| (i % 13) as f32 / 4.0 - 1.5)
        .collect();
    let Some(whole) = w.matmul_f32(&x, rows) else {
        return;
    };
    let xs = InterleavedRows::new(&x, rows, inp);
    let mut part = vec![0.0f32; rows * 32];
    let mut views: Vec<&mut [f32]> = part.chunks_mut(32).collect();
    assert!(w.f32_columns_into(&xs, 32, &mut views));
    for r in 0..rows {
        assert_eq!(&part[r * 32..][..32], &whole[r * out + 32..][..32]);
    }
}
