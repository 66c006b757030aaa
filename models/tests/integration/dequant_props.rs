//! Property tests of dequantisation on arbitrary bytes: every supported type
//! turns any whole number of blocks into exactly `blocks × block size` values
//! without panicking, and refuses lengths that are not whole blocks.

use privmix_models::gguf::{GgmlType, GgufError, dequantize};
use proptest::prelude::*;

const SUPPORTED: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

proptest! {
    #[test]
    fn whole_blocks_of_any_bytes_dequantise(
        which in 0usize..SUPPORTED.len(),
        n_blocks in 0usize..4,
        seed in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let ty = SUPPORTED[which];
        let len = n_blocks * ty.type_size();
        let bytes: Vec<u8> = seed.iter().copied().cycle().take(len).collect();
        let n = (n_blocks * ty.block_size()) as u64;
        let values = dequantize(ty, &bytes, n).unwrap();
        prop_assert_eq!(values.len() as u64, n);
    }

    #[test]
    fn partial_blocks_are_refused(
        which in 0usize..SUPPORTED.len(),
        n_blocks in 1usize..4,
        cut in 1usize..300,
    ) {
        let ty = SUPPORTED[which];
        let full = n_blocks * ty.type_size();
        let cut = cut.min(full);
        let bytes = vec![0u8; full - cut];
        let n = (n_blocks * ty.block_size()) as u64;
        let refused = matches!(
            dequantize(ty, &bytes, n),
            Err(GgufError::NotWholeBlocks { .. })
        );
        prop_assert!(refused);
    }
}
