//! Shared helpers of the model tests: HF fixtures written by
//! `fixtures/hf/make_fixtures.py` (transformers, f32, eager attention).
#![allow(dead_code)]

use std::path::PathBuf;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model};
use serde_json::Value;

/// The CPU backend of the tests.
pub type B = burn::backend::Flex;

/// `models/tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// One architecture's reference logits.
pub struct Reference {
    /// Token ids, two rows of equal length, no padding.
    pub input_ids: Vec<Vec<u32>>,
    /// Logits `[row][position][vocab]`.
    pub logits: Vec<Vec<Vec<f32>>>,
    /// The left-padded batch's ids.
    pub padded_ids: Vec<Vec<u32>>,
    /// Its attention mask.
    pub padded_mask: Vec<Vec<bool>>,
    /// Its logits at real positions only, `[row][real position][vocab]`.
    pub padded_logits_real: Vec<Vec<Vec<f32>>>,
}

fn ids(v: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).expect("token ids")
}

/// Reads `fixtures/hf/<name>/logits.json`.
pub fn reference(name: &str) -> Reference {
    let path = fixture(&format!("hf/{name}/logits.json"));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read logits.json")).unwrap();
    let p = &doc["padded"];
    let mask: Vec<Vec<u8>> = serde_json::from_value(p["attention_mask"].clone()).unwrap();
    Reference {
        input_ids: ids(&doc["input_ids"]),
        logits: serde_json::from_value(doc["logits"].clone()).unwrap(),
        padded_ids: ids(&p["input_ids"]),
        padded_mask: mask
            .iter()
            .map(|r| r.iter().map(|&m| m == 1).collect())
            .collect(),
        padded_logits_real: serde_json::from_value(p["logits_real"].clone()).unwrap(),
    }
}

/// Largest absolute difference.
pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
}

/// Loads the HF fixture `name` on the CPU.
pub fn load_hf(name: &str) -> Model<B> {
    Model::load(LoadOptions::path(
        fixture(&format!("hf/{name}")),
        &Default::default(),
    ))
    .expect("load fixture")
}

/// Checks `model` against fixture `name`: all positions of the plain batch,
/// and the real positions of the left-padded batch, to `tol`. Returns the
/// two largest differences.
pub fn check_against_reference(model: &Model<B>, name: &str, tol: f32) -> (f32, f32) {
    let r = reference(name);
    let got = to_vec(
        model
            .logits_all(&Batch::new(&r.input_ids).unwrap())
            .unwrap(),
    )
    .unwrap();
    let want: Vec<f32> = r.logits.iter().flatten().flatten().copied().collect();
    let plain = max_abs_diff(&got, &want);
    assert!(plain <= tol, "{name}: plain batch max |Δ| {plain} > {tol}");

    let batch = Batch::from_parts(&r.padded_ids, &r.padded_mask).unwrap();
    let got = to_vec(model.logits_all(&batch).unwrap()).unwrap();
    let vocab = model.vocab_size();
    let mut padded: f32 = 0.0;
    for (row, real_logits) in r.padded_logits_real.iter().enumerate() {
        let real: Vec<usize> = (0..batch.len())
            .filter(|&i| batch.is_real(row, i))
            .collect();
        assert_eq!(real.len(), real_logits.len());
        for (&i, want) in real.iter().zip(real_logits) {
            let start = (row * batch.len() + i) * vocab;
            padded = padded.max(max_abs_diff(&got[start..start + vocab], want));
        }
    }
    assert!(
        padded <= tol,
        "{name}: padded batch max |Δ| {padded} > {tol}"
    );
    (plain, padded)
}

/// `models-cache/<file>` (or `$PRIVMIX_MODELS_DIR/<file>`) if present; prints
/// `skipped: ...` and returns `None` otherwise.
pub fn real_weights(file: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("PRIVMIX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache"),
    };
    let path = dir.join(file);
    if path.is_file() {
        Some(path)
    } else {
        println!(
            "skipped: {} absent (cargo xtask fetch-models)",
            path.display()
        );
        None
    }
}

/// Compares `model`'s log-probabilities at every position of the reference
/// tokens with `fixtures/<json>` (written by `smollm2_reference.py` /
/// `gemma3_reference.py` from transformers' GGUF loader): same argmax, and
/// values at the reference's top-8 and fixed ids within `tol`. Returns the
/// tokens and the largest difference.
pub fn check_real_reference(model: &Model<B>, json: &str, tol: f32) -> (Vec<u32>, f32) {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(json)).unwrap()).unwrap();
    let tokens: Vec<u32> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let fixed: Vec<usize> = serde_json::from_value(reference["fixed_ids"].clone()).unwrap();
    let vocab = model.vocab_size();
    let all = model.logits_all(&Batch::single(&tokens).unwrap()).unwrap();
    let all = to_vec(privmix_models::log_softmax(all)).unwrap();
    let mut worst = 0.0f32;
    for (i, pos) in reference["positions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let row = &all[i * vocab..(i + 1) * vocab];
        let top_ids: Vec<usize> = serde_json::from_value(pos["top_ids"].clone()).unwrap();
        let top: Vec<f32> = serde_json::from_value(pos["top"].clone()).unwrap();
        let at_fixed: Vec<f32> = serde_json::from_value(pos["fixed"].clone()).unwrap();
        let argmax = row
            .iter()
            .enumerate()
            .fold(0, |b, (j, &x)| if x > row[b] { j } else { b });
        assert_eq!(argmax, top_ids[0], "position {i}: argmax");
        for (&id, &want) in top_ids.iter().zip(&top).chain(fixed.iter().zip(&at_fixed)) {
            worst = worst.max((row[id] - want).abs());
        }
    }
    assert!(
        worst < tol,
        "{json}: log-probs differ from transformers by {worst}"
    );
    (tokens, worst)
}

/// Logits of a left-padded prefill of `count` rows (≤ 8 tokens: a host
/// step too), then of four decode steps.
pub fn prefill_and_decode_steps<B: privmix_models::ModelBackend>(
    model: &Model<B>,
    count: u32,
) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<u32>> = (0..count)
        .map(|r| {
            (0..2 + 3 * r % 4)
                .map(|i| (3 + 11 * r + 7 * i) % 256)
                .collect()
        })
        .collect();
    let mut cache = model.new_cache(rows.len());
    let prefill = Batch::left_padded(&rows, 0).unwrap();
    let mut out = vec![to_vec(model.forward(&prefill, &mut cache, None).unwrap()).unwrap()];
    for step in 0..4u32 {
        let next: Vec<Vec<u32>> = (0..count).map(|r| vec![5 + 7 * r + step]).collect();
        let batch = Batch::new(&next).unwrap();
        out.push(to_vec(model.logits_last(&batch, &mut cache, None).unwrap()).unwrap());
    }
    out
}
