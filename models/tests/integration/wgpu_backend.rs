//! The models on the wgpu backend (in CI: Mesa's lavapipe, Vulkan on the CPU),
//! checked against the same independent references as on flex: transformers'
//! logits for the tiny HF checkpoints, cached decoding against the full
//! forward, and the real SmolLM2 against the flex backend.
//!
//! Run with `cargo test -p privmix-models --features wgpu --test wgpu_backend`
//! (`cargo xtask test` does, with `XDG_RUNTIME_DIR` set and lavapipe selected).
#![cfg(feature = "wgpu")]

use std::path::PathBuf;

use burn::backend::{Flex, Wgpu};
use privmix_models::ModelBackend;
use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model, open_wgpu_device};
use serde_json::Value;

const TOL: f32 = 1e-4;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
}

/// Token ids and transformers' logits (every position) of fixture `name`.
fn reference(name: &str) -> (Vec<Vec<u32>>, Vec<f32>) {
    let path = fixture(&format!("hf/{name}/logits.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids: Vec<Vec<u32>> = serde_json::from_value(doc["input_ids"].clone()).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = serde_json::from_value(doc["logits"].clone()).unwrap();
    (ids, logits.into_iter().flatten().flatten().collect())
}

fn load<B: ModelBackend>(name: &str, device: &B::Device) -> Model<B> {
    Model::load(LoadOptions::path(fixture(&format!("hf/{name}")), device)).expect("load fixture")
}

/// Names of the HF fixtures of the architectures on burn.
fn architectures() -> Vec<&'static str> {
    ["gpt2", "llama", "llama_scaled", "gemma", "gemma2", "gemma3"]
        .into_iter()
        .filter(|n| fixture(&format!("hf/{n}/model.safetensors")).exists())
        .collect()
}

#[test]
fn hf_fixtures_match_transformers_on_wgpu() {
    for name in architectures() {
        let model = match Model::<Wgpu>::load(LoadOptions::path(
            fixture(&format!("hf/{name}")),
            &Default::default(),
        )) {
            Ok(m) => m,
            // An architecture the loader does not know yet is reported, not hidden.
            Err(e) => panic!("{name}: {e}"),
        };
        let (ids, want) = reference(name);
        let got = to_vec(model.logits_all(&Batch::new(&ids).unwrap()).unwrap()).unwrap();
        let diff = max_abs_diff(&got, &want);
        println!("{name} on wgpu: max |Δ| vs transformers {diff:e}");
        assert!(diff <= TOL, "{name}: {diff} > {TOL}");
    }
}

/// On the device opened by `open_wgpu_device` (16 MiB allocator blocks), the
/// one the speed bench and the real-weights test use.
#[test]
fn cached_decode_equals_full_forward_on_wgpu() {
    let device = open_wgpu_device().expect("open the wgpu device");
    for name in ["gpt2", "llama", "gemma3"] {
        let model = load::<Wgpu>(name, &device);
        let tokens = reference(name).0[0].clone();
        let vocab = model.vocab_size();
        let full = to_vec(model.logits_all(&Batch::single(&tokens).unwrap()).unwrap()).unwrap();
        let mut cache = model.new_cache(1);
        model
            .forward(&Batch::single(&tokens[..4]).unwrap(), &mut cache, None)
            .unwrap();
        let mut worst: f32 = 0.0;
        for (i, &t) in tokens.iter().enumerate().skip(4) {
            let step = to_vec(
                model
                    .logits_last(&Batch::single(&[t]).unwrap(), &mut cache, None)
                    .unwrap(),
            )
            .unwrap();
            worst = worst.max(max_abs_diff(&step, &full[i * vocab..(i + 1) * vocab]));
        }
        println!("{name} on wgpu: cached decode max |Δ| {worst:e}");
        assert!(worst <= 1e-5, "{name}: {worst}");
    }
}

#[test]
fn smollm2_on_wgpu_agrees_with_flex() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/smollm2.gguf");
    if !path.exists() {
        println!(
            "skipped: {} absent (run `cargo xtask fetch-models`)",
            path.display()
        );
        return;
    }
    // "The quick brown fox" and a few more ids: any in-vocabulary ids serve.
    let tokens: Vec<u32> = vec![1, 504, 2365, 6354, 16438, 30, 260, 1114];
    let flex = Model::<Flex>::load(LoadOptions::path(&path, &Default::default())).unwrap();
    let want = flex.log_probs_last(&tokens).unwrap();
    drop(flex);
    let device = open_wgpu_device().expect("open the wgpu device");
    let wgpu = Model::<Wgpu>::load(LoadOptions::path(&path, &device)).unwrap();
    let got = wgpu.log_probs_last(&tokens).unwrap();
    assert!(got.iter().all(|x| x.is_finite()));
    let diff = max_abs_diff(&got, &want);
    println!("SmolLM2 last-position log-probs, wgpu vs flex: max |Δ| {diff:e}");
    assert!(diff <= 1e-3, "{diff}");
}

/// Without a Vulkan driver, `open_wgpu_device` reports a typed
/// `ModelError::Device` naming the backend instead of panicking inside wgpu
/// (cubecl's own device opening panics). The driver is hidden from a child
/// process (this same test binary, running only this test) by pointing the
/// Vulkan loader at a driver list that does not exist.
#[test]
fn open_wgpu_device_without_a_driver_is_a_typed_error() {
    const CHILD: &str = "PRIVMIX_WGPU_NO_DRIVER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        match open_wgpu_device() {
            Err(privmix_models::ModelError::Device(message)) => {
                assert!(message.contains("Vulkan"), "{message}");
                println!("typed error: {message}");
            }
            Err(other) => panic!("expected ModelError::Device, got {other}"),
            Ok(_) => panic!("a device opened without a Vulkan driver"),
        }
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "wgpu_backend::open_wgpu_device_without_a_driver_is_a_typed_error",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("VK_ICD_FILENAMES", "/nonexistent/privmix-no-driver.json")
        .env("VK_DRIVER_FILES", "/nonexistent/privmix-no-driver.json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("typed error: "),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
