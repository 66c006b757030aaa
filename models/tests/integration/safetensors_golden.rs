//! Golden tests of safetensors loading against files made by
//! `fixtures/make_safetensors_fixtures.py` (shard 1 by the Python
//! `safetensors` package, shard 2 written by hand in the format; expected f32
//! values converted by numpy).

use std::path::{Path, PathBuf};

use privmix_models::safetensors::{
    SafetensorsDtype, SafetensorsError, SafetensorsFile, ShardedSafetensors,
};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/safetensors")
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
}

fn bits(values: &[f32]) -> Vec<u64> {
    values.iter().map(|v| u64::from(v.to_bits())).collect()
}

fn as_u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn sharded_checkpoint_matches_numpy_values() {
    let model = ShardedSafetensors::open(dir().join("model.safetensors.index.json")).unwrap();
    assert_eq!(
        model.names(),
        [
            "h.0.attn.weight",
            "ln_f.weight",
            "position_ids",
            "wte.weight"
        ]
    );
    assert_eq!(model.index_metadata().unwrap()["total_size"], 78);
    let want = expected();
    let tensors = want["tensors"].as_object().unwrap();
    assert_eq!(tensors.len(), 3);
    for (name, w) in tensors {
        let (values, shape) = model.tensor_f32(name).unwrap();
        let want_shape: Vec<usize> = as_u64s(&w["shape"]).iter().map(|&d| d as usize).collect();
        assert_eq!(shape, want_shape, "{name}");
        assert_eq!(bits(&values), as_u64s(&w["f32_bits"]), "{name}");
        let dtype = match w["dtype"].as_str().unwrap() {
            "F32" => SafetensorsDtype::F32,
            "F16" => SafetensorsDtype::F16,
            "BF16" => SafetensorsDtype::BF16,
            other => panic!("{other}"),
        };
        model
            .shard_of(name)
            .unwrap()
            .expect_dtype(name, dtype)
            .unwrap();
        assert!(model.tensor_f32_with_shape(name, &want_shape).is_ok());
    }
    assert!(matches!(
        model.tensor_f32("position_ids"),
        Err(SafetensorsError::UnsupportedDtype { .. })
    ));
    assert!(matches!(
        model.tensor_f32_with_shape("wte.weight", &[3, 4]),
        Err(SafetensorsError::ShapeMismatch { .. })
    ));
    assert_eq!(
        model.tensor_f32("lm_head.weight"),
        Err(SafetensorsError::MissingTensor("lm_head.weight".into()))
    );
}

#[test]
fn single_file_written_by_the_python_package() {
    let f = SafetensorsFile::open(dir().join("model-00001-of-00002.safetensors")).unwrap();
    assert_eq!(f.names(), ["ln_f.weight", "wte.weight"]);
    assert_eq!(
        f.user_metadata().unwrap().get("format").map(String::as_str),
        Some("np")
    );
    // ln_f.weight[..3] were set to the f16 subnormal 2^-24, -0.0 and 65504.
    let (ln, _) = f.tensor_f32("ln_f.weight").unwrap();
    assert_eq!(bits(&ln[..3]), bits(&[2f32.powi(-24), -0.0, 65504.0]));
}

fn scratch_dir(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("privmix-models-{test}-{}", std::process::id()))
}

/// A scratch copy of the fixture folder, with the index replaced.
fn scratch_with_index(test: &str, index: &str) -> PathBuf {
    let d = scratch_dir(test);
    std::fs::create_dir_all(&d).unwrap();
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        std::fs::copy(dir().join(shard), d.join(shard)).unwrap();
    }
    std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
    d
}

fn open_in(d: &Path) -> Result<ShardedSafetensors, SafetensorsError> {
    ShardedSafetensors::open(d.join("model.safetensors.index.json"))
}

#[test]
fn index_errors_are_typed() {
    let missing = r#"{"weight_map": {"a": "model-00003-of-00003.safetensors"}}"#;
    let d = scratch_with_index("missing-shard", missing);
    assert!(matches!(
        open_in(&d),
        Err(SafetensorsError::MissingShard { .. })
    ));

    let wrong = r#"{"weight_map": {"wte.weight": "model-00002-of-00002.safetensors"}}"#;
    let d = scratch_with_index("wrong-shard", wrong);
    assert_eq!(
        open_in(&d).unwrap_err(),
        SafetensorsError::TensorNotInShard {
            tensor: "wte.weight".into(),
            shard: "model-00002-of-00002.safetensors".into()
        }
    );

    let escape = r#"{"weight_map": {"a": "../model-00001-of-00002.safetensors"}}"#;
    let d = scratch_with_index("escape", escape);
    assert!(matches!(
        open_in(&d),
        Err(SafetensorsError::BadShardName(_))
    ));

    let d = scratch_with_index("bad-json", r#"{"weight_map": [1, 2]}"#);
    assert!(matches!(open_in(&d), Err(SafetensorsError::Index { .. })));

    let d = scratch_with_index(
        "corrupt-shard",
        r#"{"weight_map": {"wte.weight": "model-00001-of-00002.safetensors"}}"#,
    );
    let shard = d.join("model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(open_in(&d), Err(SafetensorsError::Format { .. })));

    assert!(matches!(
        ShardedSafetensors::open(dir().join("no-such-index.json")),
        Err(SafetensorsError::Io { .. })
    ));

    for test in [
        "missing-shard",
        "wrong-shard",
        "escape",
        "bad-json",
        "corrupt-shard",
    ] {
        let _ = std::fs::remove_dir_all(scratch_dir(test));
    }
}
