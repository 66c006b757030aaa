//! Property tests: truncations and byte flips of a safetensors file written
//! by the Python `safetensors` package load to `Ok` or a typed error, never a
//! panic; a file that loads converts every float tensor to as many values as
//! its shape says.

use privmix_models::safetensors::{SafetensorsError, SafetensorsFile};
use proptest::prelude::*;

fn shard() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/safetensors/model-00001-of-00002.safetensors"
    );
    std::fs::read(path).unwrap()
}

fn load_and_convert(bytes: Vec<u8>) -> Result<(), SafetensorsError> {
    let f = SafetensorsFile::from_bytes(bytes)?;
    for name in f.names() {
        match f.tensor_f32(&name) {
            Ok((values, shape)) => assert_eq!(values.len(), shape.iter().product::<usize>()),
            Err(SafetensorsError::UnsupportedDtype { .. }) => {}
            Err(e) => panic!("loaded, but {name:?} failed: {e}"),
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn truncation_is_an_error(cut in 0usize..234) {
        let bytes = shard();
        let cut = cut.min(bytes.len() - 1);
        let refused = matches!(
            load_and_convert(bytes[..cut].to_vec()),
            Err(SafetensorsError::Format { .. })
        );
        prop_assert!(refused);
    }

    #[test]
    fn byte_flips_never_panic(flips in prop::collection::vec((0usize..234, any::<u8>()), 1..6)) {
        let mut bytes = shard();
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        let _ = load_and_convert(bytes);
    }
}
