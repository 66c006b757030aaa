//! Llama forward against Hugging Face transformers' logits (tiny random
//! checkpoints from `fixtures/hf/make_fixtures.py`: GQA 4/2 heads with a tied
//! head, and one with Llama 3 RoPE scaling and an untied head), to 1e-4.

use crate::runtime_support;

use privmix_models::ModelConfig;
use runtime_support::{check_against_reference, fixture, load_hf};

#[test]
fn llama_matches_transformers() {
    let (plain, padded) = check_against_reference(&load_hf("llama"), "llama", 1e-4);
    println!("llama: max |Δ| plain {plain:e}, padded {padded:e}");
}

#[test]
fn llama3_rope_scaling_untied_head_matches_transformers() {
    let (plain, padded) = check_against_reference(&load_hf("llama_scaled"), "llama_scaled", 1e-4);
    println!("llama_scaled: max |Δ| plain {plain:e}, padded {padded:e}");
}

#[test]
fn legacy_config_layout_parses_to_the_same_config() {
    for name in ["llama", "llama_scaled"] {
        let v5 = ModelConfig::from_hf_file(fixture(&format!("hf/{name}/config.json"))).unwrap();
        let legacy = fixture(&format!("hf/{name}/config_v4.json"));
        if !legacy.exists() {
            println!("skipped: {} absent", legacy.display());
            continue;
        }
        assert_eq!(ModelConfig::from_hf_file(legacy).unwrap(), v5, "{name}");
    }
}
