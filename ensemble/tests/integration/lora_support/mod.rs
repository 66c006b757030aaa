//! Shared helpers of the LoRA / runner tests: fixture paths, the tiny Llama
//! of models/tests/fixtures/hf/llama, logits files, temporary folders.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::Tensor;
use privmix_ensemble::lora::{BaseShapes, LoraAdapter, LoraBase};
use privmix_models::{Batch, LanguageModel, LinearDelta, LoadOptions, Model};
use serde_json::Value;

pub type B = Flex;

pub fn dev() -> burn::tensor::Device<B> {
    Default::default()
}

pub fn peft_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/peft")
        .join(name)
}

pub fn llama_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/llama")
}

pub fn tiny_llama() -> Model<B> {
    Model::load(LoadOptions::path(llama_dir(), &dev())).expect("tiny llama fixture")
}

pub fn base_of(m: &Model<B>) -> BaseShapes {
    m.base_shapes().unwrap()
}

pub fn load_adapter(name: &str, base: &BaseShapes) -> LoraAdapter<B> {
    LoraAdapter::load_peft(peft_dir(name), base, &dev()).expect("adapter fixture")
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `input_ids` rows of a logits file.
pub fn input_ids(doc: &Value) -> Vec<Vec<u32>> {
    doc["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// `[row][pos][vocab]` floats of `doc[key]`, flattened.
pub fn flat3(doc: &Value, key: &str) -> Vec<f32> {
    let mut out = Vec::new();
    for row in doc[key].as_array().unwrap() {
        for pos in row.as_array().unwrap() {
            out.extend(
                pos.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32),
            );
        }
    }
    out
}

/// Logits at every position, `[rows][len][V]` flattened, with an optional adapter.
pub fn logits_with(
    model: &Model<B>,
    rows: &[Vec<u32>],
    delta: Option<&dyn LinearDelta<B>>,
) -> Vec<f32> {
    let batch = Batch::new(rows).unwrap();
    let mut cache = model.new_cache(rows.len());
    let t: Tensor<B, 3> = model.forward(&batch, &mut cache, delta).unwrap();
    t.into_data().to_vec::<f32>().unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A fresh empty temporary folder unique to this process and `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("privmix-ensemble-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
