//! SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1) loads from its GGUF
//! file and runs: log-probabilities at every position equal (to 2e-3) those of
//! transformers' own GGUF loader (`fixtures/smollm2_reference.py` wrote
//! `fixtures/smollm2_reference.json`: top-8 and fixed ids per position), KV-cache
//! decoding equals the full forward, greedy generation continues the argmax. The file is not in the
//! repository (`cargo xtask fetch-models` installs it into `models-cache/`
//! or `$PRIVMIX_MODELS_DIR`); when it is absent the test prints `skipped:`
//! and passes.

use crate::runtime_support;

use std::time::Instant;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model, generate_greedy};
use runtime_support::B;

#[test]
fn smollm2_gguf_matches_transformers_and_decodes() {
    let Some(path) = runtime_support::real_weights("smollm2.gguf") else {
        return;
    };
    let t0 = Instant::now();
    let model =
        Model::<B>::load(LoadOptions::path(&path, &Default::default())).expect("load SmolLM2");
    println!("load: {:.2?}", t0.elapsed());
    assert_eq!(model.vocab_size(), 49152);
    assert_eq!(model.num_layers(), 30);

    let t1 = Instant::now();
    let (tokens, worst) =
        runtime_support::check_real_reference(&model, "smollm2_reference.json", 2e-3);
    println!(
        "forward of {} tokens vs transformers: max |Δ log p| {worst:e} in {:.2?}",
        tokens.len(),
        t1.elapsed()
    );

    let t1 = Instant::now();
    let lp = model.log_probs_last(&tokens).expect("forward");
    println!("forward of {} tokens: {:.2?}", tokens.len(), t1.elapsed());
    assert_eq!(lp.len(), 49152);
    assert!(lp.iter().all(|x| x.is_finite()), "non-finite log-prob");
    let total: f64 = lp.iter().map(|&x| f64::from(x).exp()).sum();
    assert!((total - 1.0).abs() < 1e-3, "probabilities sum to {total}");

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
