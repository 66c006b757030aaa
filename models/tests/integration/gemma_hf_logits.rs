//! Gemma 1/2/3 forwards against Hugging Face transformers' logits (tiny random
//! checkpoints from `fixtures/hf/make_fixtures.py`), to 1e-4: Gemma's
//! `(1 + w)` norms and √d embedding scale; Gemma 2's query scalar, attention
//! and final soft-caps (small enough to matter) and sliding window 4 on layer
//! 0; Gemma 3's q/k norms, sliding window 4 with a local RoPE base. The
//! sequences are 12 tokens long, so the windows cut attention.

use crate::runtime_support;

use privmix_models::{GemmaVersion, Model, ModelConfig};
use runtime_support::{check_against_reference, fixture, load_hf};

fn check(name: &str, version: GemmaVersion) {
    let model = load_hf(name);
    match &model {
        Model::Gemma(g) => assert_eq!(g.config.version, version),
        other => panic!("{name} loaded as {other:?}"),
    }
    let (plain, padded) = check_against_reference(&model, name, 1e-4);
    println!("{name}: max |Δ| plain {plain:e}, padded {padded:e}");
}

#[test]
fn gemma_matches_transformers() {
    check("gemma", GemmaVersion::V1);
}

#[test]
fn gemma2_matches_transformers() {
    check("gemma2", GemmaVersion::V2);
}

#[test]
fn gemma3_matches_transformers() {
    check("gemma3", GemmaVersion::V3);
}

#[test]
fn legacy_config_layout_parses_to_the_same_config() {
    for name in ["gemma", "gemma2", "gemma3"] {
        let v5 = ModelConfig::from_hf_file(fixture(&format!("hf/{name}/config.json"))).unwrap();
        let legacy = fixture(&format!("hf/{name}/config_v4.json"));
        if !legacy.exists() {
            println!("skipped: {} absent", legacy.display());
            continue;
        }
        assert_eq!(ModelConfig::from_hf_file(legacy).unwrap(), v5, "{name}");
    }
}
