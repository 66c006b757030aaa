//! SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1) loads from its GGUF
//! file and runs: log-probabilities at every position equal (to 2e-3) those of
//! transformers' own GGUF loader (`fixtures/smollm2_reference.py` wrote
//! `fixtures/smollm2_reference.json`: top-8 and fixed ids per position), KV-cache
//! decoding equals the full forward, greedy generation continues the argmax. The file is not in the
//! repository (`cargo xtask fetch-models` installs it into `models-cache/`
//! or `$PRIVMIX_MODELS_DIR`); when it is absent the test prints `skipped:`
//! and passes.

mod runtime_support;

use std::path::PathBuf;
use std::time::Instant;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, Model, generate_greedy};
use runtime_support::B;

fn smollm2_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("PRIVMIX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache"),
    };
    let path = dir.join("smollm2.gguf");
    if path.is_file() {
        Some(path)
    } else {
        println!(
            "skipped: {} absent (cargo xtask fetch-models)",
            path.display()
        );
        None
    }
}

#[test]
fn smollm2_gguf_forward_gives_finite_log_probs() {
    let Some(path) = smollm2_path() else { return };
    let t0 = Instant::now();
    let model = Model::<B>::load(&path, &Default::default()).expect("load SmolLM2");
    println!("load: {:.2?}", t0.elapsed());
    assert_eq!(model.vocab_size(), 49152);
    assert_eq!(model.num_layers(), 30);

    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runtime_support::fixture("smollm2_reference.json")).unwrap(),
    )
    .unwrap();
    let tokens: Vec<u32> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let fixed: Vec<usize> = serde_json::from_value(reference["fixed_ids"].clone()).unwrap();
    let t1 = Instant::now();
    let lp = model.log_probs_last(&tokens).expect("forward");
    println!("forward of {} tokens: {:.2?}", tokens.len(), t1.elapsed());
    assert_eq!(lp.len(), 49152);
    assert!(lp.iter().all(|x| x.is_finite()), "non-finite log-prob");
    let total: f64 = lp.iter().map(|&x| f64::from(x).exp()).sum();
    assert!((total - 1.0).abs() < 1e-3, "probabilities sum to {total}");

    // Every position against transformers.
    let all = model.logits_all(&Batch::single(&tokens).unwrap()).unwrap();
    let all = to_vec(privmix_models::log_softmax(all)).unwrap();
    let mut worst = 0.0f32;
    for (i, pos) in reference["positions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let row = &all[i * 49152..(i + 1) * 49152];
        let top_ids: Vec<usize> = serde_json::from_value(pos["top_ids"].clone()).unwrap();
        let top: Vec<f32> = serde_json::from_value(pos["top"].clone()).unwrap();
        let at_fixed: Vec<f32> = serde_json::from_value(pos["fixed"].clone()).unwrap();
        let argmax = row
            .iter()
            .enumerate()
            .fold(0, |b, (j, &x)| if x > row[b] { j } else { b });
        assert_eq!(argmax, top_ids[0], "position {i}: argmax");
        for (&id, &want) in top_ids.iter().zip(&top).chain(fixed.iter().zip(&at_fixed)) {
            worst = worst.max((row[id] - want).abs());
        }
    }
    println!("max |Δ log p| vs transformers' GGUF loader: {worst:e}");
    assert!(
        worst < 2e-3,
        "log-probs differ from transformers by {worst}"
    );

    // Prefill 7 tokens, decode 3 one by one: the same last logits.
    let t2 = Instant::now();
    let mut cache = model.new_cache(1);
    model
        .forward(&Batch::single(&tokens[..7]).unwrap(), &mut cache, None)
        .unwrap();
    let mut last = None;
    for &t in &tokens[7..] {
        last = Some(
            model
                .logits_last(&Batch::single(&[t]).unwrap(), &mut cache, None)
                .unwrap(),
        );
    }
    let decoded = to_vec(privmix_models::log_softmax(last.unwrap())).unwrap();
    let diff = decoded
        .iter()
        .zip(&lp)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "decode 3 tokens: {:.2?}, max |Δ log p| vs full forward {diff:e}",
        t2.elapsed()
    );
    assert!(diff < 1e-3, "cached decode differs by {diff}");

    let t3 = Instant::now();
    let generated = generate_greedy(&model, &tokens, 4, None).unwrap();
    println!("greedy 4 tokens: {generated:?} in {:.2?}", t3.elapsed());
    let argmax = lp
        .iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > lp[b] { i } else { b });
    assert_eq!(generated[0] as usize, argmax);
}
