use super::*;
use crate::cpu::quants::tests::{blocks, within_gamma};
use crate::gguf::{GgmlType, dequantize};
use proptest::prelude::*;

/// `x Wᵀ` on one thread at the SIMD level `simd` with Q4_1 blocks
/// dequantised as `lut` says (the dispatch picks the widest level; the tests
/// also run the narrower ones, whose tiles differ).
fn matmul_on<S: Simd>(simd: S, lut: Lut, w: &BlockWeight, x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * w.out];
    let pieces: Vec<&mut [f32]> = y.chunks_mut(w.out).collect();
    simd.vectorize(Task {
        w,
        first: 0,
        x,
        y: pieces,
        lut,
    });
    y
}

/// The kernel's result at every SIMD level this CPU has, beside the dispatched one.
fn every_level(w: &BlockWeight, x: &[f32], rows: usize) -> Vec<Vec<f32>> {
    let mut all = vec![
        w.matmul(x, rows),
        matmul_on(pulp::Scalar::new(), Lut::ENTRY_BY_ENTRY, w, x, rows),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(simd) = pulp::x86::V3::try_new() {
            all.push(matmul_on(simd, Lut::ENTRY_BY_ENTRY, w, x, rows));
        }
        if let Some(simd) = pulp::x86::V4::try_new() {
            all.push(matmul_on(simd, Lut::ENTRY_BY_ENTRY, w, x, rows));
            all.push(matmul_on(simd, Lut::table(simd), w, x, rows));
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
        let w = BlockWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
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
                crate::cpu::quants::dequantize_q4_1(d, m, q, &mut want);
                let got: [[f32; 16]; 2] =
                    crate::cpu::arch::x86::avx512::q4_1_table_vectors(simd, d, m, q)
                        .map(bytemuck::cast);
                let got: Vec<u32> = got.iter().flatten().map(|x| x.to_bits()).collect();
                let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "d {d} m {m} q {q:?}");
            }
        }
    }
}
