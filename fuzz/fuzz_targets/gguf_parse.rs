//! Any bytes given to the GGUF reader give a parsed file or a typed error,
//! never a panic, an out-of-bounds read or an allocation the file cannot back;
//! every tensor of a file that parses dequantises or errs cleanly, and so
//! does building a tokenizer from its metadata.
#![no_main]

use libfuzzer_sys::fuzz_target;
use privmix_models::Tokenizer;
use privmix_models::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::parse(data.to_vec()) {
        for info in &file.tensors {
            let _ = file.tensor_f32(&info.name);
        }
        let _ = Tokenizer::from_gguf(&file);
    }
});
