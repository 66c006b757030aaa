use super::*;
use crate::gguf::GgmlType;
use half::f16;
use proptest::prelude::*;

/// A Q4_1 or Q8_0 weight `[out, in]` with block bytes cycled from `bytes`.
fn weight(q8: bool, out: usize, inp: usize, bytes: &[u8], int8: bool) -> CpuWeight {
    let mut raw = Vec::new();
    let mut next = bytes.iter().cycle();
    for i in 0..out * (inp / 32) {
        raw.extend(f16::from_f32(0.01 + (i % 7) as f32 * 0.003).to_le_bytes());
        if !q8 {
            raw.extend(f16::from_f32(-0.05 + (i % 5) as f32 * 0.01).to_le_bytes());
        }
        raw.extend((0..if q8 { 32 } else { 16 }).map(|_| *next.next().unwrap()));
    }
    let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
    let w = BlockWeight::from_ggml(ty, &raw, out, inp).unwrap().unwrap();
    if int8 {
        CpuWeight::Tiles(TiledWeight::from_blocks(&w).unwrap())
    } else {
        CpuWeight::blocks(w)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Several products in one region equal each product alone, bit for
    /// bit, on one thread and split over three (runs cut inside weights
    /// and across them).
    #[test]
    fn products_in_one_region_equal_each_product_alone(
        int8 in any::<bool>(),
        formats in prop::collection::vec(any::<bool>(), 1..4),
        outs in prop::collection::vec(1usize..12, 3),
        nb in 1usize..20,
        rows in 1usize..12,
        bytes in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let inp = 32 * nb;
        let weights: Vec<CpuWeight> = formats
            .iter()
            .zip(&outs)
            .map(|(&q8, &tiles)| weight(q8, 16 * tiles, inp, &bytes, int8))
            .collect();
        let refs: Vec<&CpuWeight> = weights.iter().collect();
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 2654435761) % 2001) as f32 / 500.0 - 2.0)
            .collect();
        let alone: Vec<Vec<f32>> = weights.iter().map(|w| w.matmul(&x, rows)).collect();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let together = pool.install(|| CpuWeight::matmul_many(&refs, &x, rows, None));
            prop_assert_eq!(together.len(), alone.len());
            for (t, a) in together.iter().zip(&alone) {
                prop_assert_eq!(t.len(), a.len());
                prop_assert!(t.iter().zip(a).all(|(t, a)| t.to_bits() == a.to_bits()));
            }
        }
    }
}
