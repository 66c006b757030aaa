//! Fuzzes the GGUF reader: any byte string must parse to `Ok` or a typed
//! error, never panic or allocate beyond what the input can justify; a file
//! that parses must dequantise every supported tensor without error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use privmix_models::gguf::{GgufError, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::parse(data.to_vec()) else {
        return;
    };
    for t in &file.tensors {
        match file.tensor_f32(&t.name) {
            Ok(values) => assert_eq!(values.len() as u64, t.n_elements),
            Err(GgufError::UnsupportedGgmlType(_)) => {}
            Err(e) => panic!("parsed, but tensor {:?} failed: {e}", t.name),
        }
    }
});
