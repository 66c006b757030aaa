//! Gemma 3 270M (GGUF Q4_K_M; 18 layers, 5 local : 1 global, window 512,
//! head_dim 256, vocab 262144) loads from its GGUF file and its
//! log-probabilities at every position equal (to 2e-3) those of transformers'
//! own GGUF loader (`fixtures/gemma3_reference.py` wrote
//! `fixtures/gemma3_reference.json`); cached decoding equals the full
//! forward. The file is not in the repository and CI does not fetch it: when
//! it is absent the test prints `skipped:` and passes.

use crate::runtime_support;

use std::time::Instant;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model};
use runtime_support::B;

#[test]
fn gemma3_270m_gguf_matches_transformers_and_decodes() {
    let Some(path) = runtime_support::real_weights("gemma3.gguf") else {
        return;
    };
    let t0 = Instant::now();
    let model =
        Model::<B>::load(LoadOptions::path(&path, &Default::default())).expect("load Gemma 3 270M");
    println!("load: {:.2?}", t0.elapsed());
    assert_eq!(model.vocab_size(), 262_144);
    assert_eq!(model.num_layers(), 18);

    let t1 = Instant::now();
    let (tokens, worst) =
        runtime_support::check_real_reference(&model, "gemma3_reference.json", 2e-3);
    println!(
        "forward of {} tokens vs transformers: max |Δ log p| {worst:e} in {:.2?}",
        tokens.len(),
        t1.elapsed()
    );

    let full = to_vec(model.logits_all(&Batch::single(&tokens).unwrap()).unwrap()).unwrap();
    let vocab = model.vocab_size();
    let mut cache = model.new_cache(1);
    model
        .forward(&Batch::single(&tokens[..7]).unwrap(), &mut cache, None)
        .unwrap();
    let mut worst_decode = 0.0f32;
    for (i, &t) in tokens.iter().enumerate().skip(7) {
        let step = to_vec(
            model
                .logits_last(&Batch::single(&[t]).unwrap(), &mut cache, None)
                .unwrap(),
        )
        .unwrap();
        let want = &full[i * vocab..(i + 1) * vocab];
        worst_decode = step
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(worst_decode, f32::max);
    }
    println!("cached decode max |Δ logit| {worst_decode:e}");
    assert!(
        worst_decode < 1e-3,
        "cached decode differs by {worst_decode}"
    );
}
