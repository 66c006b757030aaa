//! Property tests: random truncations and byte flips of a real GGUF file
//! (written by the Python `gguf` package) never panic; the parser returns
//! `Ok` or a typed error. Allocation is bounded by construction (every count
//! is checked against the remaining bytes before `Vec::with_capacity`), so a
//! run that allocated absurd sizes would abort this test binary.

use privmix_models::gguf::{GgufError, GgufFile};
use proptest::prelude::*;

fn tiny() -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny.gguf");
    std::fs::read(path).unwrap()
}

/// Parses, and if that succeeds dequantises every tensor (which must then
/// succeed: parse guarantees in-range, whole-block data).
fn parse_and_read(bytes: Vec<u8>) -> Result<(), GgufError> {
    let f = GgufFile::parse(bytes)?;
    for t in &f.tensors {
        match f.tensor_f32(&t.name) {
            Ok(v) => assert_eq!(v.len() as u64, t.n_elements),
            Err(GgufError::UnsupportedGgmlType(_)) => {}
            Err(e) => panic!("parsed file, but tensor {:?} failed: {e}", t.name),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn truncation_never_panics(cut in 0usize..1440) {
        let bytes = tiny();
        let cut = cut.min(bytes.len() - 1);
        prop_assert!(parse_and_read(bytes[..cut].to_vec()).is_err());
    }

    #[test]
    fn header_byte_flips_never_panic(
        flips in prop::collection::vec((0usize..832, any::<u8>()), 1..8)
    ) {
        let mut bytes = tiny();
        for (at, value) in flips {
            bytes[at] = value;
        }
        let _ = parse_and_read(bytes);
    }

    #[test]
    fn large_counts_and_lengths_in_the_header_never_panic(
        at in 0usize..832,
        value in prop_oneof![Just(u64::MAX), Just(u64::MAX / 2), Just(1u64 << 40), any::<u64>()]
    ) {
        let mut bytes = tiny();
        let at = at.min(bytes.len() - 8);
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let _ = parse_and_read(bytes);
    }
}
