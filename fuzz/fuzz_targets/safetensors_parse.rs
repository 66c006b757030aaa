//! Any bytes given to the safetensors reader give a validated file or a typed
//! error, never a panic; every tensor of a file that validates converts to
//! f32 or errs cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use privmix_models::safetensors::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = SafetensorsFile::from_bytes(data.to_vec()) {
        for name in file.names() {
            let _ = file.tensor_f32(&name);
        }
    }
});
