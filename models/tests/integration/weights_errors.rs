//! Corrupt or mismatched checkpoints give typed errors, never a panic: a
//! missing tensor, a tensor of the wrong shape, a non-finite weight, a config
//! that does not match the weights, bad config fields, unknown architectures
//! (HF and GGUF), a GGUF tensor renamed away, a truncated GGUF file.

use crate::runtime_support;

use privmix_models::gguf::{GgufError, GgufFile};
use privmix_models::safetensors::SafetensorsFile;
use privmix_models::{LlamaConfig, LoadOptions, Model, ModelConfig, ModelError, WeightSource};
use runtime_support::{B, fixture};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::Value;

fn llama_config_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("hf/llama/config.json")).unwrap())
        .unwrap()
}

fn llama_config(doc: &Value) -> Result<LlamaConfig, ModelError> {
    match ModelConfig::from_hf_json(doc)? {
        ModelConfig::Llama(c) => Ok(c),
        other => panic!("{other:?}"),
    }
}

/// The tiny llama checkpoint's tensors, edited by `edit`, as a weight source.
fn edited_weights(edit: impl Fn(&mut Vec<(String, Vec<f32>, Vec<usize>)>)) -> WeightSource {
    let file = SafetensorsFile::open(fixture("hf/llama/model.safetensors")).unwrap();
    let mut tensors: Vec<(String, Vec<f32>, Vec<usize>)> = file
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
    let config = ModelConfig::Llama(llama_config(doc)?);
    Model::load(LoadOptions::weights(&config, weights, &Default::default()))
}

#[test]
fn unedited_weights_load() {
    assert!(load(&llama_config_json(), &edited_weights(|_| {})).is_ok());
}

#[test]
fn missing_tensor_is_named() {
    let name = "model.layers.1.mlp.up_proj.weight";
    let w = edited_weights(|t| t.retain(|(n, _, _)| n != name));
    assert_eq!(
        load(&llama_config_json(), &w).unwrap_err(),
        ModelError::MissingTensor(name.into())
    );
}

#[test]
fn wrong_shape_is_reported_with_both_shapes() {
    let name = "model.layers.0.self_attn.k_proj.weight";
    let w = edited_weights(|t| {
        for (n, v, s) in t.iter_mut() {
            if n == name {
                v.truncate(16 * 64);
                *s = vec![16, 64];
            }
        }
    });
    assert_eq!(
        load(&llama_config_json(), &w).unwrap_err(),
        ModelError::ShapeMismatch {
            name: name.into(),
            expected: vec![32, 64],
            found: vec![16, 64]
        }
    );
}

#[test]
fn non_finite_weight_is_rejected() {
    let w = edited_weights(|t| t[0].1[3] = f32::NAN);
    assert!(matches!(
        load(&llama_config_json(), &w),
        Err(ModelError::NonFiniteWeight(_))
    ));
}

#[test]
fn config_that_does_not_match_the_weights() {
    let mut doc = llama_config_json();
    doc["intermediate_size"] = 96.into();
    let err = load(&doc, &edited_weights(|_| {})).unwrap_err();
    assert!(
        matches!(err, ModelError::ShapeMismatch { ref name, .. } if name == "model.layers.0.mlp.gate_proj.weight"),
        "{err:?}"
    );
}

#[test]
fn bad_config_fields() {
    let cases: [(&str, Value); 6] = [
        ("head_dim", (1u64 << 62).into()),
        ("num_key_value_heads", 3.into()),
        ("hidden_size", Value::Null),
        ("vocab_size", (-5).into()),
        ("head_dim", 15.into()),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
        ),
    ];
    for (field, value) in cases {
        let mut doc = llama_config_json();
        doc[field] = value;
        assert!(
            matches!(llama_config(&doc), Err(ModelError::BadConfig { .. })),
            "{field}"
        );
    }
    let mut doc = llama_config_json();
    doc["hidden_act"] = "relu".into();
    assert!(matches!(
        llama_config(&doc),
        Err(ModelError::BadConfig { .. })
    ));
}

#[test]
fn unknown_architecture_in_config_json_and_gguf() {
    let mut doc = llama_config_json();
    doc["model_type"] = "mamba".into();
    assert_eq!(
        ModelConfig::from_hf_json(&doc).unwrap_err(),
        ModelError::UnknownArchitecture("mamba".into())
    );

    let mut bytes = std::fs::read(fixture("gguf/llama_q8_0.gguf")).unwrap();
    let key = find(&bytes, b"general.architecture").unwrap();
    let value = key + find(&bytes[key..], b"llama").unwrap();
    bytes[value..value + 5].copy_from_slice(b"mamba");
    let file = GgufFile::parse(bytes).unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&file).unwrap_err(),
        ModelError::UnknownArchitecture("mamba".into())
    );
}

#[test]
fn gguf_tensor_renamed_away_is_missing() {
    let mut bytes = std::fs::read(fixture("gguf/llama_q8_0.gguf")).unwrap();
    let at = find(&bytes, b"blk.1.ffn_up.weight").unwrap();
    bytes[at + 6..at + 12].copy_from_slice(b"ffn_xx");
    let path = std::env::temp_dir().join(format!("privmix_renamed_{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let err = Model::<B>::load(LoadOptions::path(&path, &Default::default())).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        err,
        ModelError::MissingTensor("model.layers.1.mlp.up_proj.weight".into())
    );
}

#[test]
fn truncated_gguf_and_missing_files() {
    let bytes = std::fs::read(fixture("gguf/llama_q8_0.gguf")).unwrap();
    let path = std::env::temp_dir().join(format!("privmix_truncated_{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = Model::<B>::load(LoadOptions::path(&path, &Default::default())).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(
        matches!(
            err,
            ModelError::Gguf(GgufError::OffsetOutOfRange { .. } | GgufError::Truncated { .. })
        ),
        "{err:?}"
    );
    let missing = Model::<B>::load(LoadOptions::path(
        fixture("hf/does_not_exist.gguf"),
        &Default::default(),
    ));
    assert!(matches!(
        missing,
        Err(ModelError::Gguf(GgufError::Io { .. }))
    ));
    let empty_dir = std::env::temp_dir().join(format!("privmix_empty_{}", std::process::id()));
    std::fs::create_dir_all(&empty_dir).unwrap();
    let err = Model::<B>::load(LoadOptions::path(&empty_dir, &Default::default())).unwrap_err();
    std::fs::remove_dir(&empty_dir).unwrap();
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
