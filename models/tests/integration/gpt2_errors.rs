//! A GPT-2 config with a mismatched or corrupt checkpoint gives typed errors,
//! never a panic: missing tensors (named in HF form, also for GGUF), tensors
//! of the wrong shape (shapes reported in HF `Conv1D` layout, also for GGUF,
//! whose matrices are stored transposed), non-finite weights, an untied head
//! without `lm_head.weight`, and config fields this forward does not support.

use crate::runtime_support;

use privmix_models::gguf::GgufFile;
use privmix_models::safetensors::SafetensorsFile;
use privmix_models::{Gpt2Config, LoadOptions, Model, ModelConfig, ModelError, WeightSource};
use runtime_support::{B, fixture};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::Value;

type Tensors = Vec<(String, Vec<f32>, Vec<usize>)>;

fn config_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("hf/gpt2/config.json")).unwrap()).unwrap()
}

fn config(doc: &Value) -> Result<Gpt2Config, ModelError> {
    match ModelConfig::from_hf_json(doc)? {
        ModelConfig::Gpt2(c) => Ok(c),
        other => panic!("{other:?}"),
    }
}

/// The tiny GPT-2 checkpoint's tensors, edited by `edit`, as a weight source.
fn edited_weights(edit: impl Fn(&mut Tensors)) -> WeightSource {
    let file = SafetensorsFile::open(fixture("hf/gpt2/model.safetensors")).unwrap();
    let mut tensors: Tensors = file
        .names()
        .into_iter()
        .map(|n| {
            let (v, s) = file.tensor_f32(&n).unwrap();
            (n, v, s)
        })
        .collect();
    edit(&mut tensors);
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .into_iter()
        .map(|(n, v, s)| (n, v.iter().flat_map(|x| x.to_le_bytes()).collect(), s))
        .collect();
    let views = bytes.iter().map(|(n, b, s)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    let data = safetensors::serialize(views, None).unwrap();
    WeightSource::Safetensors(SafetensorsFile::from_bytes(data).unwrap())
}

fn load(doc: &Value, weights: &WeightSource) -> Result<Model<B>, ModelError> {
    let config = ModelConfig::Gpt2(config(doc)?);
    Model::load(LoadOptions::weights(&config, weights, &Default::default()))
}

#[test]
fn unedited_weights_load() {
    assert!(load(&config_json(), &edited_weights(|_| {})).is_ok());
}

#[test]
fn missing_tensors_are_named() {
    for name in [
        "transformer.h.1.ln_2.bias",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.wpe.weight",
        "transformer.ln_f.weight",
    ] {
        let w = edited_weights(|t| t.retain(|(n, _, _)| n != name));
        assert_eq!(
            load(&config_json(), &w).unwrap_err(),
            ModelError::MissingTensor(name.into())
        );
    }
}

#[test]
fn untied_head_needs_lm_head() {
    let mut doc = config_json();
    doc["tie_word_embeddings"] = false.into();
    assert_eq!(
        load(&doc, &edited_weights(|_| {})).unwrap_err(),
        ModelError::MissingTensor("lm_head.weight".into())
    );
}

#[test]
fn linear_layout_instead_of_conv1d_is_a_shape_mismatch() {
    // c_attn stored `[out, in]` as an nn.Linear would be: HF's Conv1D wants `[in, out]`.
    let name = "transformer.h.1.attn.c_attn.weight";
    let w = edited_weights(|t| {
        for (n, _, s) in t.iter_mut() {
            if n == name {
                s.reverse();
            }
        }
    });
    assert_eq!(
        load(&config_json(), &w).unwrap_err(),
        ModelError::ShapeMismatch {
            name: name.into(),
            expected: vec![64, 192],
            found: vec![192, 64],
        }
    );
}

#[test]
fn fewer_positions_than_the_config_is_a_shape_mismatch() {
    let name = "transformer.wpe.weight";
    let w = edited_weights(|t| {
        for (n, v, s) in t.iter_mut() {
            if n == name {
                v.truncate(32 * 64);
                *s = vec![32, 64];
            }
        }
    });
    assert_eq!(
        load(&config_json(), &w).unwrap_err(),
        ModelError::ShapeMismatch {
            name: name.into(),
            expected: vec![64, 64],
            found: vec![32, 64],
        }
    );
}

#[test]
fn config_that_does_not_match_the_weights() {
    let mut doc = config_json();
    doc["n_inner"] = Value::Null; // 4 · 64 = 256, but the checkpoint has 128
    let err = load(&doc, &edited_weights(|_| {})).unwrap_err();
    assert_eq!(
        err,
        ModelError::ShapeMismatch {
            name: "transformer.h.0.mlp.c_fc.weight".into(),
            expected: vec![64, 256],
            found: vec![64, 128],
        }
    );
}

#[test]
fn non_finite_weight_is_rejected() {
    let w = edited_weights(|t| {
        for (n, v, _) in t.iter_mut() {
            if n == "transformer.h.0.ln_1.bias" {
                v[5] = f32::INFINITY;
            }
        }
    });
    assert_eq!(
        load(&config_json(), &w).unwrap_err(),
        ModelError::NonFiniteWeight("transformer.h.0.ln_1.bias".into())
    );
}

#[test]
fn bad_config_fields() {
    let cases: [(&str, Value); 9] = [
        ("n_head", 3.into()),
        ("n_head", 0.into()),
        ("n_embd", Value::Null),
        ("n_positions", (-1).into()),
        ("vocab_size", (1u64 << 62).into()),
        ("layer_norm_epsilon", 0.0.into()),
        ("activation_function", "relu".into()),
        ("scale_attn_by_inverse_layer_idx", true.into()),
        ("add_cross_attention", true.into()),
    ];
    for (field, value) in cases {
        let mut doc = config_json();
        doc[field] = value.clone();
        let err = config(&doc).unwrap_err();
        assert!(
            matches!(err, ModelError::BadConfig { .. }),
            "{field} = {value}: {err:?}"
        );
    }
    let mut doc = config_json();
    doc["scale_attn_weights"] = false.into();
    assert!(matches!(config(&doc), Err(ModelError::BadConfig { .. })));
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn load_gguf_bytes(bytes: Vec<u8>) -> Result<Model<B>, ModelError> {
    let file = GgufFile::parse(bytes).unwrap();
    let config = ModelConfig::from_gguf(&file)?;
    let weights = WeightSource::from_gguf(file)?;
    Model::load(LoadOptions::weights(&config, &weights, &Default::default()))
}

#[test]
fn gguf_tensor_renamed_away_is_missing_by_its_hf_name() {
    let mut bytes = std::fs::read(fixture("gguf/gpt2_f32.gguf")).unwrap();
    let at = find(&bytes, b"blk.1.attn_qkv.weight").unwrap();
    bytes[at + 6..at + 14].copy_from_slice(b"attn_xxx");
    assert_eq!(
        load_gguf_bytes(bytes).unwrap_err(),
        ModelError::MissingTensor("transformer.h.1.attn.c_attn.weight".into())
    );
}

#[test]
fn gguf_shape_mismatch_is_reported_in_hf_layout() {
    // gpt2.feed_forward_length (a u32 after its key and a u32 type tag) set
    // to 96: the stored ffn_up, `[128, 64]` in GGUF, is HF `[64, 128]`.
    let mut bytes = std::fs::read(fixture("gguf/gpt2_f32.gguf")).unwrap();
    let key = b"gpt2.feed_forward_length";
    let at = find(&bytes, key).unwrap() + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "u32 type tag");
    assert_eq!(bytes[at + 4..at + 8], 128u32.to_le_bytes());
    bytes[at + 4..at + 8].copy_from_slice(&96u32.to_le_bytes());
    assert_eq!(
        load_gguf_bytes(bytes).unwrap_err(),
        ModelError::ShapeMismatch {
            name: "transformer.h.0.mlp.c_fc.weight".into(),
            expected: vec![64, 96],
            found: vec![64, 128],
        }
    );
}
