//! PEFT interoperability: adapters made by the `peft` package load into
//! privmix and give transformers + PEFT's logits; adapters privmix saves load
//! into PEFT and give privmix's logits (fixtures and scripts in
//! tests/fixtures/peft/).

use crate::lora_support;

use lora_support::*;
use privmix_ensemble::lora::{LoraAdapter, LoraConfig};
use privmix_models::LinearDelta;

const TOL: f32 = 1e-4;

fn golden(name: &str) {
    let model = tiny_llama();
    let base = base_of(&model);
    let adapter = load_adapter(name, &base);
    let doc = read_json(&peft_dir(name).join("logits.json"));
    let ids = input_ids(&doc);
    let ours = logits_with(&model, &ids, Some(&adapter as &dyn LinearDelta<B>));
    let theirs = flat3(&doc, "logits");
    let d = max_abs_diff(&ours, &theirs);
    assert!(d < TOL, "{name}: max |Δlogit| {d}");
    // The adapter matters: without it the logits are far from PEFT's.
    let plain = logits_with(&model, &ids, None);
    assert!(max_abs_diff(&plain, &theirs) > 0.05);
}

#[test]
fn peft_adapter_gives_peft_logits() {
    golden("full");
}

#[test]
fn peft_rslora_subset_adapter_gives_peft_logits() {
    let a = load_adapter("rslora", &base_of(&tiny_llama()));
    assert!(a.config().use_rslora);
    assert_eq!(a.scale(), 4.0 / 2f64.sqrt());
    assert_eq!(a.sites().len(), 2 * 3);
    golden("rslora");
}

#[test]
fn peft_config_fields_read() {
    let a = load_adapter("full", &base_of(&tiny_llama()));
    let c = a.config();
    assert_eq!((c.r, c.lora_alpha, c.scale()), (4, 8.0, 2.0));
    assert_eq!(c.target_modules.len(), 7);
    assert_eq!(c.task_type.as_deref(), Some("CAUSAL_LM"));
    assert_eq!(
        c.base_model_name_or_path.as_deref(),
        Some("models/tests/fixtures/hf/llama")
    );
    assert_eq!(a.num_parameters(), 2 * 4 * (128 + 96 + 96 + 128 + 192 * 3));
}

/// The adapter `ours/` holds: what [`ours`] builds.
fn ours(base: &privmix_ensemble::lora::BaseShapes) -> LoraAdapter<B> {
    let mut config = LoraConfig::new(
        3,
        5.0,
        &["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
    )
    .unwrap();
    config.base_model_name_or_path = Some("models/tests/fixtures/hf/llama".into());
    LoraAdapter::random(config, base, 0.1, 20261122, &dev()).unwrap()
}

#[test]
fn save_load_round_trip_is_exact() {
    let model = tiny_llama();
    let base = base_of(&model);
    let a = ours(&base);
    let dir = temp_dir("roundtrip");
    a.save_peft(&dir).unwrap();
    let b = LoraAdapter::<B>::load_peft(&dir, &base, &dev()).unwrap();
    assert_eq!(a.config(), b.config());
    assert_eq!(a.sites(), b.sites());
    for s in a.sites() {
        let (fa, fb) = (a.factors(s).unwrap(), b.factors(s).unwrap());
        assert_eq!(fa.a.to_data(), fb.a.to_data());
        assert_eq!(fa.b.to_data(), fb.b.to_data());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `ours/` is what `save_peft` writes for [`ours`] (regenerate with
/// `PRIVMIX_WRITE_PEFT_FIXTURE=1`), and check_ours.py found that PEFT loads
/// it and computes, in `peft_logits.json`, the logits privmix computes.
#[test]
fn our_saved_adapter_gives_our_logits_in_peft() {
    let model = tiny_llama();
    let base = base_of(&model);
    let a = ours(&base);
    let ids = input_ids(&read_json(&peft_dir("full").join("logits.json")));
    let logits = logits_with(&model, &ids, Some(&a as &dyn LinearDelta<B>));
    let dir = peft_dir("ours");
    if std::env::var_os("PRIVMIX_WRITE_PEFT_FIXTURE").is_some() {
        a.save_peft(&dir).unwrap();
        let doc = serde_json::json!({ "input_ids": ids, "logits": logits, "vocab": 256 });
        std::fs::write(dir.join("privmix_logits.json"), doc.to_string()).unwrap();
    }
    let fresh = temp_dir("ours");
    a.save_peft(&fresh).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        assert_eq!(
            std::fs::read(fresh.join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f} differs from the committed save"
        );
    }
    std::fs::remove_dir_all(&fresh).unwrap();
    let peft = read_json(&dir.join("peft_logits.json"));
    let theirs: Vec<f32> = flat3(&peft, "logits");
    let d = max_abs_diff(&logits, &theirs);
    assert!(d < TOL, "PEFT's logits for our adapter differ by {d}");
}
