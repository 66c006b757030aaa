//! The host step against burn autodiff (the existing path, which shares no
//! code with it) on the tiny Llama fixtures of the models crate — f32
//! (HF safetensors), Q8_0 (GGUF), and Llama-3 RoPE scaling — with every
//! projection targeted, random non-zero factors, with and without dropout,
//! batched and per block; and against central finite differences of its
//! own loss.
//!
//! Tolerances: the losses agree to 2e-5 relative; each gradient to 2e-4 of
//! its largest entry (both paths are f32, with sums in different orders over
//! two layers and a 256-word softmax).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use privmix_models::{LoadOptions, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{DropoutPlan, HostLlama};
use crate::lora::{LoraBase, LoraConfig};
use crate::train::params::LoraParams;
use crate::train::trainable::{Dropout, loss_and_gradient};

type AB = Autodiff<Flex>;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures")
        .join(rel)
}

fn models() -> Vec<(&'static str, Model<AB>)> {
    ["hf/llama", "gguf/llama_q8_0.gguf", "hf/llama_scaled"]
        .into_iter()
        .map(|p| {
            (
                p,
                Model::load(LoadOptions::path(fixture(p), &Default::default())).expect(p),
            )
        })
        .collect()
}

/// Every projection targeted, factors drawn at random (B ≠ 0, so that every
/// gradient is non-trivial).
fn params(model: &Model<AB>, seed: u64) -> LoraParams {
    let all = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let mut cfg = LoraConfig::new(4, 8.0, &all).unwrap();
    cfg.lora_dropout = 0.1;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p = LoraParams::init(&cfg, &model.base_shapes().unwrap(), &mut rng).unwrap();
    for v in p.values_mut() {
        *v = rng.random_range(-0.2..0.2);
    }
    p
}

fn blocks(rows: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..rows as u32)
        .map(|r| {
            (0..len as u32)
                .map(|i| (r * 31 + i * 17 + 3) % vocab)
                .collect()
        })
        .collect()
}

fn assert_close(what: &str, (l, g): &(f64, Vec<f32>), (l_ref, g_ref): &(f64, Vec<f32>)) {
    assert!(
        (l - l_ref).abs() <= 2e-5 * l_ref.abs().max(1.0),
        "{what}: loss {l} vs {l_ref}"
    );
    let scale = g_ref.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: zero reference gradient");
    for (i, (a, b)) in g.iter().zip(g_ref).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * scale,
            "{what}: gradient {i}: {a} vs {b} (max {scale})"
        );
    }
}

#[test]
fn host_step_matches_autodiff_batched_with_and_without_dropout() {
    for (name, model) in models() {
        let host = HostLlama::from_model(&model).unwrap().expect("a Llama");
        let p = params(&model, 7);
        let data = blocks(3, 9, 256);
        let refs: Vec<&Vec<u32>> = data.iter().collect();
        for dropout in [
            None,
            Some(Dropout {
                p: 0.25,
                seed: 5,
                pass: 3,
            }),
        ] {
            let want = loss_and_gradient::<AB, _>(&model, &p, &refs, dropout, &Default::default())
                .unwrap();
            let plan = DropoutPlan(dropout.into_iter().collect());
            let got = host.loss_and_gradients(&p, &refs, &plan, false).unwrap();
            assert_eq!(got.len(), 1);
            assert_close(&format!("{name} dropout {dropout:?}"), &got[0], &want);
        }
    }
}

#[test]
fn host_step_per_block_matches_autodiff_one_block_at_a_time() {
    for (name, model) in models().into_iter().take(2) {
        let host = HostLlama::from_model(&model).unwrap().expect("a Llama");
        let p = params(&model, 9);
        let data = blocks(3, 7, 256);
        let refs: Vec<&Vec<u32>> = data.iter().collect();
        let passes: Vec<Dropout> = (0..3)
            .map(|k| Dropout {
                p: 0.2,
                seed: 1,
                pass: 100 + k,
            })
            .collect();
        let got = host
            .loss_and_gradients(&p, &refs, &DropoutPlan(passes.clone()), true)
            .unwrap();
        assert_eq!(got.len(), 3);
        for (k, block) in refs.iter().enumerate() {
            let want = loss_and_gradient::<AB, _>(
                &model,
                &p,
                &[block],
                Some(passes[k]),
                &Default::default(),
            )
            .unwrap();
            assert_close(&format!("{name} block {k}"), &got[k], &want);
        }
    }
}

/// Central differences of the host loss itself at the largest gradient
/// entries of a few sites' A and B: checks the backward pass against the
/// forward pass, independently of burn.
#[test]
fn host_gradient_matches_finite_differences() {
    let (_, model) = models().remove(1);
    let host = HostLlama::from_model(&model).unwrap().expect("a Llama");
    let mut p = params(&model, 3);
    let data = blocks(2, 8, 256);
    let refs: Vec<&Vec<u32>> = data.iter().collect();
    let none = DropoutPlan::default();
    let (_, g) = host
        .loss_and_gradients(&p, &refs, &none, false)
        .unwrap()
        .remove(0);
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
    let h = 1e-2f32;
    for &i in order.iter().take(6) {
        let at = p.values()[i];
        let mut loss_at = |v: f32| {
            p.values_mut()[i] = v;
            host.loss_and_gradients(&p, &refs, &none, false).unwrap()[0].0
        };
        let fd = (loss_at(at + h) - loss_at(at - h)) / (2.0 * f64::from(h));
        p.values_mut()[i] = at;
        let rel = (fd - f64::from(g[i])).abs() / fd.abs();
        assert!(
            rel < 2e-2,
            "entry {i}: analytic {} vs finite difference {fd}",
            g[i]
        );
    }
}

#[test]
fn tokens_outside_the_vocabulary_are_an_error() {
    let (_, model) = models().remove(0);
    let host = HostLlama::from_model(&model).unwrap().expect("a Llama");
    let p = params(&model, 1);
    let bad = [vec![1, 2, 999]];
    let refs: Vec<&Vec<u32>> = bad.iter().collect();
    assert!(
        host.loss_and_gradients(&p, &refs, &DropoutPlan::default(), false)
            .is_err()
    );
}
