//! GPT-2 against independent references:
//! - transformers' logits for the tiny random `fixtures/hf/gpt2` checkpoint
//!   (`make_fixtures.py`: learned positions, LayerNorm with biases, gelu_new,
//!   `Conv1D` `[in, out]` weights, tied head, n_inner 128 ≠ 4·n_embd) at every
//!   position and on a left-padded batch, to 1e-4;
//! - the same checkpoint written as GGUF the way llama.cpp's converter does
//!   (`fixtures/gguf_from_hf.py`: gguf-py's gpt2 names, `Conv1D` weights
//!   transposed, each file checked there against transformers' own GGUF
//!   loader): F32 gives the safetensors model's logits exactly, Q8_0 gives
//!   transformers' logits of the dequantised model to 1e-4.

use crate::runtime_support;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, Gpt2Activation, LanguageModel, LoadOptions, Model, ModelConfig};
use runtime_support::{B, check_against_reference, fixture, load_hf, max_abs_diff};
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

#[test]
fn gpt2_matches_transformers() {
    let model = load_hf("gpt2");
    assert!(matches!(model, Model::Gpt2(_)), "{model:?}");
    // Tolerance: f32 forwards of a 2-layer width-64 model whose logits are
    // O(1) differ by accumulated rounding of order 1e-6 between summation
    // orders; 1e-4 leaves room for that, while the nearest wrong convention
    // tried, exact GELU instead of tanh-GELU, is off by 7.4e-4, and positions
    // counted by slot (padding included) by 2.7 on the left-padded batch.
    let (plain, padded) = check_against_reference(&model, "gpt2", 1e-4);
    println!("gpt2: max |Δ| plain {plain:e}, left-padded {padded:e}");
}

#[test]
fn hf_config_is_read() {
    let ModelConfig::Gpt2(c) = ModelConfig::from_hf_file(fixture("hf/gpt2/config.json")).unwrap()
    else {
        panic!("not a GPT-2 config")
    };
    assert_eq!(
        (
            c.vocab_size,
            c.n_positions,
            c.n_embd,
            c.n_layer,
            c.n_head,
            c.n_inner
        ),
        (256, 64, 64, 2, 4, 128)
    );
    assert_eq!(c.head_dim(), 16);
    assert_eq!(c.layer_norm_epsilon, 1e-5);
    assert_eq!(c.activation, Gpt2Activation::GeluTanh);
    assert!(c.tie_word_embeddings);
}

#[test]
fn f32_gguf_gives_the_safetensors_logits_exactly() {
    let (ids, want) = gguf_reference("gpt2_f32");
    let batch = Batch::new(&ids).unwrap();
    let gguf = to_vec(load_gguf("gpt2_f32").logits_all(&batch).unwrap()).unwrap();
    let hf = to_vec(load_hf("gpt2").logits_all(&batch).unwrap()).unwrap();
    // Same f32 values in the same [in, out] layout: the same computation.
    assert_eq!(gguf, hf, "GGUF F32 and safetensors GPT-2 differ");
    let d = max_abs_diff(&gguf, &want);
    println!("gpt2_f32: max |Δ| vs transformers {d:e}");
    assert!(d <= 1e-4, "{d}");
}

#[test]
fn q8_0_gguf_matches_its_dequantised_model() {
    let (ids, want) = gguf_reference("gpt2_q8_0");
    let batch = Batch::new(&ids).unwrap();
    let got = to_vec(load_gguf("gpt2_q8_0").logits_all(&batch).unwrap()).unwrap();
    let d = max_abs_diff(&got, &want);
    // The quantisation itself moves the logits far more than the tolerance,
    // so this checks Q8_0 blocks run along GGUF's transposed rows.
    let f32_logits = gguf_reference("gpt2_f32").1;
    let q_err = max_abs_diff(&want, &f32_logits);
    println!("gpt2_q8_0: max |Δ| vs transformers {d:e} (quantisation moved logits by {q_err:e})");
    assert!(q_err > 1e-3, "{q_err}");
    assert!(d <= 1e-4, "{d}");
}

#[test]
fn gguf_config_equals_the_hf_config() {
    let file = privmix_models::gguf::GgufFile::open(fixture("gguf/gpt2_f32.gguf")).unwrap();
    let ModelConfig::Gpt2(gguf) = ModelConfig::from_gguf(&file).unwrap() else {
        panic!("not a GPT-2 config")
    };
    let ModelConfig::Gpt2(mut hf) =
        ModelConfig::from_hf_file(fixture("hf/gpt2/config.json")).unwrap()
    else {
        panic!("not a GPT-2 config")
    };
    // GGUF stores the epsilon as an f32.
    hf.layer_norm_epsilon = f64::from(hf.layer_norm_epsilon as f32);
    assert_eq!(gguf, hf);
}

#[test]
fn prefixless_openai_names_load_to_the_same_model() {
    // The original OpenAI checkpoints name tensors `h.0.attn.c_attn.weight`,
    // `wte.weight`, ... without the `transformer.` prefix.
    use privmix_models::WeightSource;
    use privmix_models::safetensors::SafetensorsFile;
    use safetensors::{Dtype, tensor::TensorView};
    let file = SafetensorsFile::open(fixture("hf/gpt2/model.safetensors")).unwrap();
    let tensors: Vec<(String, Vec<u8>, Vec<usize>)> = file
        .names()
        .into_iter()
        .map(|n| {
            let (v, s) = file.tensor_f32(&n).unwrap();
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.trim_start_matches("transformer.").to_string(), bytes, s)
        })
        .collect();
    assert!(tensors.iter().any(|(n, _, _)| n == "wte.weight"));
    let views = tensors.iter().map(|(n, b, s)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    let bytes = safetensors::serialize(views, None).unwrap();
    let weights = WeightSource::Safetensors(SafetensorsFile::from_bytes(bytes).unwrap());
    let config = ModelConfig::from_hf_file(fixture("hf/gpt2/config.json")).unwrap();
    let model =
        Model::<B>::load(LoadOptions::weights(&config, &weights, &Default::default())).unwrap();
    let (plain, _) = check_against_reference(&model, "gpt2", 1e-4);
    println!("prefix-less names: max |Δ| {plain:e}");
}
