//! GGUF files written from tiny HF checkpoints by `fixtures/gguf_from_hf.py`
//! (llama.cpp's conventions: GGUF names, Llama Q/K rows permuted for
//! interleaved RoPE, Gemma norms stored as `1 + w`; each file checked there
//! against transformers' own GGUF loader) load to the same model as the
//! safetensors checkpoint: F32 to identical logits, Q8_0 to transformers'
//! logits of the model with the dequantised weights, to 1e-4.

use crate::runtime_support;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LlamaConfig, LoadOptions, Model, ModelConfig};
use runtime_support::{B, fixture, load_hf, max_abs_diff};
use serde_json::Value;

fn load_gguf(name: &str) -> Model<B> {
    Model::load(LoadOptions::path(
        fixture(&format!("gguf/{name}.gguf")),
        &Default::default(),
    ))
    .expect("load gguf")
}

/// (input ids, flattened logits) of `gguf/<name>.logits.json`.
fn gguf_reference(name: &str) -> (Vec<Vec<u32>>, Vec<f32>) {
    let text = std::fs::read_to_string(fixture(&format!("gguf/{name}.logits.json"))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<Vec<u32>> = serde_json::from_value(doc["input_ids"].clone()).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = serde_json::from_value(doc["logits"].clone()).unwrap();
    (ids, logits.into_iter().flatten().flatten().collect())
}

fn check(name: &str) -> f32 {
    let model = load_gguf(name);
    let (ids, want) = gguf_reference(name);
    let got = to_vec(model.logits_all(&Batch::new(&ids).unwrap()).unwrap()).unwrap();
    let d = max_abs_diff(&got, &want);
    println!("{name}: max |Δ| vs transformers {d:e}");
    assert!(d <= 1e-4, "{name}: {d}");
    d
}

#[test]
fn f32_gguf_and_safetensors_give_identical_logits() {
    check("llama_f32");
    let (ids, _) = gguf_reference("llama_f32");
    let batch = Batch::new(&ids).unwrap();
    let a = to_vec(load_gguf("llama_f32").logits_all(&batch).unwrap()).unwrap();
    let b = to_vec(load_hf("llama").logits_all(&batch).unwrap()).unwrap();
    assert_eq!(
        a, b,
        "un-permuted GGUF weights must equal the safetensors ones"
    );
}

#[test]
fn q8_0_llama_matches_its_dequantised_model() {
    check("llama_q8_0");
}

#[test]
fn q8_0_gemma3_matches_its_dequantised_model() {
    let model = load_gguf("gemma3_q8_0");
    match &model {
        Model::Gemma(g) => {
            assert_eq!(
                g.config.sliding_layers,
                [true, true, true, true, true, false]
            );
            assert_eq!(g.config.rope_local_theta, 10_000.0);
        }
        other => panic!("loaded as {other:?}"),
    }
    check("gemma3_q8_0");
}

#[test]
fn gguf_config_matches_the_hf_config() {
    let file = privmix_models::gguf::GgufFile::open(fixture("gguf/llama_f32.gguf")).unwrap();
    let (ModelConfig::Llama(g), ModelConfig::Llama(h)) = (
        ModelConfig::from_gguf(&file).unwrap(),
        ModelConfig::from_hf_file(fixture("hf/llama/config.json")).unwrap(),
    ) else {
        panic!("not llama")
    };
    // GGUF stores epsilon as f32.
    assert_eq!(g.rms_norm_eps, f64::from(h.rms_norm_eps as f32));
    let g = LlamaConfig {
        rms_norm_eps: h.rms_norm_eps,
        ..g
    };
    assert_eq!(g, h);
}

#[test]
fn permuted_gguf_rows_with_interleaved_rope_are_the_same_network() {
    use privmix_models::WeightSource;
    use privmix_models::layers::RopeStyle;
    let file = privmix_models::gguf::GgufFile::open(fixture("gguf/llama_f32.gguf")).unwrap();
    let ModelConfig::Llama(config) = ModelConfig::from_gguf(&file).unwrap() else {
        panic!("not llama")
    };
    let raw = WeightSource::from_gguf(file)
        .unwrap()
        .keep_gguf_qk_permutation();
    let interleaved = LlamaConfig {
        rope_style: RopeStyle::Interleaved,
        ..config
    };
    let load = |config: LlamaConfig| {
        let config = ModelConfig::Llama(config);
        Model::<B>::load(LoadOptions::weights(&config, &raw, &Default::default())).unwrap()
    };
    let model = load(interleaved.clone());
    let (ids, want) = gguf_reference("llama_f32");
    let got = to_vec(model.logits_all(&Batch::new(&ids).unwrap()).unwrap()).unwrap();
    let d = max_abs_diff(&got, &want);
    println!("interleaved RoPE on llama.cpp-ordered Q/K: max |Δ| vs transformers {d:e}");
    assert!(d <= 1e-4, "{d}");
    // Without the interleaved RoPE the permuted rows give another network.
    let wrong = load(LlamaConfig {
        rope_style: RopeStyle::RotateHalf,
        ..interleaved
    });
    let bad = to_vec(wrong.logits_all(&Batch::new(&ids).unwrap()).unwrap()).unwrap();
    assert!(max_abs_diff(&bad, &want) > 1e-2);
}
