//! Fuzzes safetensors header parsing and conversion to f32: any byte string
//! must load to `Ok` or a typed error, never panic; every F32/F16/BF16 tensor
//! of a file that loads converts to exactly as many values as its shape says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use privmix_models::safetensors::{SafetensorsError, SafetensorsFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = SafetensorsFile::from_bytes(data.to_vec()) else {
        return;
    };
    for name in file.names() {
        match file.tensor_f32(&name) {
            Ok((values, shape)) => assert_eq!(values.len(), shape.iter().product::<usize>()),
            Err(SafetensorsError::UnsupportedDtype { .. }) => {}
            Err(e) => panic!("loaded, but tensor {name:?} failed: {e}"),
        }
    }
});
