//! Bad adapters get typed errors: missing files, unsupported PEFT options,
//! rank mismatch, adapters for another base model (layer count or widths),
//! unknown or unpaired tensors, non-finite values, no factors; and the
//! memory of 100 rank-4 adapters over SmolLM2.

use crate::lora_support;

use std::path::Path;

use lora_support::*;
use privmix_ensemble::lora::{
    BaseShapes, LLAMA_TARGET_MODULES, LoraAdapter, LoraConfig, LoraError,
};
use privmix_ensemble::runner::{EnsembleError, EnsembleRunner};
use privmix_ensemble::stacked::{FactorPrecision, StackedAdapters};
use privmix_models::plan::{ExecutionPlan, Route};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;

fn base() -> BaseShapes {
    base_of(&tiny_llama())
}

fn load(dir: &Path, base: &BaseShapes) -> Result<LoraAdapter<B>, LoraError> {
    LoraAdapter::load_peft(dir, base, &dev())
}

/// A copy of fixture `full` with its config edited by `edit`.
fn with_config(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let dir = temp_dir(name);
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(peft_dir("full").join(f), dir.join(f)).unwrap();
    }
    let mut doc = read_json(&dir.join("adapter_config.json"));
    edit(&mut doc);
    std::fs::write(dir.join("adapter_config.json"), doc.to_string()).unwrap();
    dir
}

/// A copy of fixture `full`'s config with the given tensors as weights.
fn with_tensors(name: &str, tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> std::path::PathBuf {
    let dir = with_config(name, |_| {});
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            (
                n.to_string(),
                s.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views = bytes.iter().map(|(n, s, b)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, &dir.join("adapter_model.safetensors")).unwrap();
    dir
}

const Q_A: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const Q_B: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

#[test]
fn missing_files() {
    let b = base();
    let dir = temp_dir("missing");
    assert!(
        matches!(load(&dir, &b), Err(LoraError::MissingFile(f)) if f.ends_with("adapter_config.json"))
    );
    std::fs::copy(
        peft_dir("full").join("adapter_config.json"),
        dir.join("adapter_config.json"),
    )
    .unwrap();
    assert!(
        matches!(load(&dir, &b), Err(LoraError::MissingFile(f)) if f.ends_with("adapter_model.safetensors"))
    );
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        b"\x08\0\0\0\0\0\0\0{}",
    )
    .unwrap();
    assert!(matches!(load(&dir, &b), Err(LoraError::Safetensors(_))));
}

#[test]
fn unsupported_and_malformed_configs() {
    let b = base();
    let cases: [(&str, serde_json::Value); 4] = [
        ("peft_type", json!("IA3")),
        ("bias", json!("lora_only")),
        ("use_dora", json!(true)),
        ("rank_pattern", json!({"q_proj": 8})),
    ];
    for (i, (field, value)) in cases.into_iter().enumerate() {
        let dir = with_config(&format!("unsup{i}"), |d| d[field] = value);
        assert!(
            matches!(load(&dir, &b), Err(LoraError::Unsupported { field: f, .. }) if f == field),
            "{field}"
        );
    }
    let dir = with_config("notjson", |_| {});
    std::fs::write(dir.join("adapter_config.json"), "{ r: 4").unwrap();
    assert!(matches!(load(&dir, &b), Err(LoraError::ConfigJson { .. })));
}

#[test]
fn rank_mismatch() {
    let dir = with_config("rank", |d| d["r"] = json!(8));
    let e = load(&dir, &base()).unwrap_err();
    assert!(
        matches!(
            e,
            LoraError::RankMismatch {
                expected: 8,
                found: 4,
                ..
            }
        ),
        "{e}"
    );
    // A lora_B of another rank than its lora_A.
    let dir = with_tensors(
        "rank_b",
        &[
            (Q_A, vec![4, 64], vec![0.1; 256]),
            (Q_B, vec![64, 3], vec![0.1; 192]),
        ],
    );
    let e = load(&dir, &base()).unwrap_err();
    assert!(
        matches!(
            e,
            LoraError::RankMismatch {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn adapter_for_another_base_model() {
    // The tiny Llama's adapter against a one-layer base: layer 1 is absent.
    let one_layer = BaseShapes::llama_style(1, 64, 128, 64, 32);
    let e = load(&peft_dir("full"), &one_layer).unwrap_err();
    assert!(
        matches!(&e, LoraError::SiteNotInBase(s) if s.contains("layers.1.")),
        "{e}"
    );
    // ... against a base of other widths.
    let wider = BaseShapes::llama_style(2, 64, 256, 64, 32);
    let e = load(&peft_dir("full"), &wider).unwrap_err();
    assert!(matches!(e, LoraError::ShapeMismatch { .. }), "{e}");
    // An adapter built for another base handed to the runner.
    let other = BaseShapes::llama_style(2, 32, 128, 32, 16);
    let c = LoraConfig::new(2, 2.0, &["q_proj"]).unwrap();
    let a = LoraAdapter::<B>::random(c, &other, 0.1, 1, &dev()).unwrap();
    let e = EnsembleRunner::new(tiny_llama(), &[a]).unwrap_err();
    assert!(
        matches!(e, EnsembleError::Lora(LoraError::ShapeMismatch { .. })),
        "{e}"
    );
}

#[test]
fn bad_tensors() {
    let b = base();
    let dir = with_tensors(
        "unknown",
        &[(
            "base_model.model.lm_head.lora_A.weight",
            vec![4, 64],
            vec![0.0; 256],
        )],
    );
    assert!(matches!(load(&dir, &b), Err(LoraError::UnknownTensor(_))));
    let dir = with_tensors("unpaired", &[(Q_A, vec![4, 64], vec![0.1; 256])]);
    assert!(matches!(
        load(&dir, &b),
        Err(LoraError::MissingFactor {
            factor: "lora_B",
            ..
        })
    ));
    let dir = with_tensors("empty", &[]);
    assert!(matches!(load(&dir, &b), Err(LoraError::EmptyAdapter)));
    let mut nan = vec![0.1; 256];
    nan[17] = f32::NAN;
    let dir = with_tensors(
        "nan",
        &[(Q_A, vec![4, 64], nan), (Q_B, vec![64, 4], vec![0.1; 256])],
    );
    assert!(matches!(load(&dir, &b), Err(LoraError::NonFinite(n)) if n == Q_A));
    let dir = with_config("untargeted", |d| d["target_modules"] = json!(["v_proj"]));
    assert!(matches!(
        load(&dir, &b),
        Err(LoraError::UntargetedModule { .. })
    ));
    let dir = with_tensors(
        "shape",
        &[
            (Q_A, vec![4, 64], vec![0.1; 256]),
            (Q_B, vec![32, 4], vec![0.1; 128]),
        ],
    );
    assert!(matches!(
        load(&dir, &b),
        Err(LoraError::ShapeMismatch { .. })
    ));
}

/// Issue #5: 100 rank-4 adapters over SmolLM2 take under 2 GB beyond the base.
/// SmolLM2-135M: 30 layers, hidden 576, MLP 1536, 9 query heads and 3 KV
/// heads of width 64; all seven projections targeted.
#[test]
fn memory_of_100_rank4_adapters_over_smollm2() {
    let c = LoraConfig::new(4, 8.0, &LLAMA_TARGET_MODULES).unwrap();
    // The formula agrees with the stacked tensors actually built (tiny model, 5 members).
    let tiny = base();
    let members: Vec<LoraAdapter<B>> = (0..5)
        .map(|s| LoraAdapter::random(c.clone(), &tiny, 0.1, s, &dev()).unwrap())
        .collect();
    // On plain flex (the tests' backend) the plan holds the factors in host memory.
    let host = &ExecutionPlan::for_backend::<B>(Route::Fastest);
    assert!(host.lora_factors_in_host_memory());
    let stacked = StackedAdapters::new(&members, &tiny, host, &dev()).unwrap();
    assert_eq!(
        stacked.bytes(),
        StackedAdapters::<B>::bytes_for(&tiny, &c, 5, FactorPrecision::F32, host)
    );
    // There the factors are host-held, without the tensors' zero slot.
    assert_eq!(stacked.bytes(), 4 * 5 * members[0].num_parameters());
    // Held in f16 there, half of it.
    let half = StackedAdapters::with_precision(&members, &tiny, FactorPrecision::F16, host, &dev())
        .unwrap();
    assert_eq!(half.bytes(), 2 * 5 * members[0].num_parameters());
    assert_eq!(
        half.bytes(),
        StackedAdapters::<B>::bytes_for(&tiny, &c, 5, FactorPrecision::F16, host)
    );
    // As tensors (burn's ops only, as on a device backend): the zero slot
    // too, f32 whatever was asked.
    let device = &ExecutionPlan::for_backend::<B>(Route::BurnOpsOnly);
    assert!(!device.lora_factors_in_host_memory());
    let tensors = StackedAdapters::new(&members, &tiny, device, &dev()).unwrap();
    assert_eq!(tensors.bytes(), 4 * 6 * members[0].num_parameters());
    assert_eq!(
        tensors.bytes(),
        StackedAdapters::<B>::bytes_for(&tiny, &c, 5, FactorPrecision::F16, device)
    );

    let smollm2 = BaseShapes::llama_style(30, 576, 1536, 576, 192);
    let stacked = StackedAdapters::<B>::bytes_for(&smollm2, &c, 100, FactorPrecision::F32, host);
    // Per layer r · Σ(in + out) = 4 · 10176 floats; 30 layers; 100 members.
    assert_eq!(stacked, 4 * 100 * 4 * 10_176 * 30);
    // With tensors (other backends): a zero slot, and a decoder over all 101
    // rows gathers one more copy of the same size; host-held factors are
    // shared by decoders, so this bounds both forms.
    let with_rows = 2 * 4 * 101 * 4 * 10_176 * 30;
    println!(
        "100 rank-4 SmolLM2 adapters: stacked {stacked} B (flex), at most {with_rows} B with a 101-row decoder (tensors)"
    );
    assert!(with_rows < 2_000_000_000);
}
