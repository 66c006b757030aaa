//! SmolLM2-135M-Instruct (`models-cache/smollm2.gguf`, Q4_1) checked against
//! llama.cpp itself on the same file. The golden values come from
//! llama-cpp-python 0.3.36, `fixtures/llama_cpp/make_llama_cpp.py`
//! (`smollm2.json`, `hamlet_passage.txt`):
//!
//! 1. for 4 fixed prompts (llama.cpp's own tokenization, which for this file
//!    adds no BOS; plain text, a chat template, code), greedy decoding gives
//!    llama.cpp's 32 tokens, up to the first step where llama.cpp's own top-2
//!    logit gap is a near-tie (< [`GAP_TOL`]) that we break the other way; and
//!    along llama.cpp's greedy path (teacher-forced) our log-probs of its
//!    top-20 tokens, of its greedy token and our logit gap between its top two
//!    tokens are within [`TOP20_TOL`], [`TOP1_TOL`], [`GAP_TOL`] of its own;
//! 2. the teacher-forced perplexity of a fixed 504-token Hamlet passage is
//!    within [`PPL_REL_TOL`] of llama.cpp's, within [`PPL_F32_REL_TOL`] of an
//!    f32 reference's, and inside [`PPL_RANGE`].
//!
//! Why the numbers differ at all: we dequantise the Q4_1 weights to f32 and
//! multiply in f32, while llama.cpp's CPU kernel for a Q4_1 weight first
//! quantises the activation vector to Q8_1 (8-bit, one scale per 32 values)
//! and takes integer dot products, and keeps the KV cache in f16. Those
//! roundings reach the logits through 30 layers; measured against an
//! independent f32 forward they move log-probs by up to 0.86 (not ~1e-2), and
//! the tolerances are set from that measurement (see the constants).
//!
//! Result on the committed prompts: 3 of 4 decode all 32 tokens as llama.cpp;
//! "The history of the printing press began in" agrees for 3 tokens, then at
//! llama.cpp's near-tie between ids 38 and 36 (its gap 0.014, ours 0.106 the
//! other way: "the 16th century" vs "the 14th") takes "14th".
//!
//! The GGUF file is not in the repository (`cargo xtask fetch-models`); when it
//! is absent the tests print `skipped:` and pass.

use crate::runtime_support;

use std::time::Instant;

use privmix_models::gguf::GgufFile;
use privmix_models::runtime::to_vec;
use privmix_models::{
    Batch, DecodeProducts, LanguageModel, LoadOptions, Model, Tokenizer, generate_greedy,
    log_softmax,
};
use runtime_support::B;
use serde_json::Value;

// Tolerances. `make_llama_cpp.py` also runs an independent f32 forward
// (transformers' GGUF loader, weights dequantised to f32) along llama.cpp's
// greedy paths and records how far it lies from llama.cpp
// (`f32_reference` in smollm2.json): 0.862 at worst over the 4 × 32 × 20
// top-20 log-probs, 0.215 on the top-1 log-prob, 0.805 on the top-2 logit
// gap, perplexity 51.751 against llama.cpp's 52.188 (0.84%). That is the size
// of llama.cpp's own rounding, and our forward equals transformers' to 2e-3
// per log-prob (smollm2_forward.rs), so ours must show the same differences;
// each bound is the measured f32-vs-llama.cpp value with a margin (the worst
// values sit after the chat prompt's <|im_end|>, where the model is far out
// of distribution and its logits are flat).

/// Largest allowed |ours − llama.cpp| of a log-probability among llama.cpp's
/// top-20 tokens at a greedy step (f32 reference: 0.862).
const TOP20_TOL: f64 = 1.0;

/// Largest allowed |ours − llama.cpp| of the log-probability of llama.cpp's
/// greedy token (f32 reference: 0.215).
const TOP1_TOL: f64 = 0.3;

/// Largest allowed |ours − llama.cpp| of the logit gap between llama.cpp's
/// best and second-best tokens (f32 reference: 0.805). Greedy decoding may
/// therefore pick llama.cpp's second token only where llama.cpp's own gap is
/// below this: a near-tie that the two arithmetics legitimately break
/// differently.
const GAP_TOL: f64 = 1.0;

/// Largest allowed relative difference of the perplexities (f32 reference:
/// 0.84%).
const PPL_REL_TOL: f64 = 0.02;

/// Largest allowed relative difference between our perplexity and the f32
/// reference's: our log-probs equal transformers' to 2e-3 each, so the mean
/// does too and exp of it moves by at most a factor e^{2e-3} ≈ 1 + 2e-3.
const PPL_F32_REL_TOL: f64 = 2e-3;

/// Where SmolLM2's perplexity on the passage must lie (llama.cpp: 52.19).
const PPL_RANGE: (f64, f64) = (45.0, 60.0);

fn golden() -> Value {
    let path = runtime_support::fixture("llama_cpp/smollm2.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read smollm2.json")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("token ids")
}

fn load() -> Option<(Model<B>, Tokenizer)> {
    let path = runtime_support::real_weights("smollm2.gguf")?;
    let model =
        Model::<B>::load(LoadOptions::path(&path, &Default::default())).expect("load SmolLM2");
    let file = GgufFile::open(&path).expect("open gguf");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer from gguf");
    Some((model, tokenizer))
}

/// The two largest values of `row`: (argmax, largest − second largest).
fn top2(row: &[f32]) -> (usize, f64) {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    let second = row
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .fold(f32::NEG_INFINITY, |m, (_, &x)| m.max(x));
    (best, f64::from(row[best] - second))
}

/// One prompt's comparison; returns a line per step for the report.
fn check_prompt(
    model: &Model<B>,
    tokenizer: &Tokenizer,
    run: &Value,
    worst: &mut [f64; 3],
) -> String {
    let prompt = run["prompt"].as_str().expect("prompt");
    let prompt_ids = ids(&run["prompt_ids"]);
    let want = ids(&run["generated"]);
    assert_eq!(
        tokenizer.encode(prompt, true).expect("encode"),
        prompt_ids,
        "our tokenization of {prompt:?} differs from llama.cpp's"
    );

    // Teacher-forced along llama.cpp's path: the distribution at the last
    // prompt position and after each generated token but the last.
    let path: Vec<u32> = prompt_ids
        .iter()
        .chain(&want[..want.len() - 1])
        .copied()
        .collect();
    let all = model.logits_all(&Batch::single(&path).unwrap()).unwrap();
    let lp = to_vec(log_softmax(all)).unwrap();
    let vocab = model.vocab_size();
    let mut lines = vec![format!("{prompt:?}")];
    let mut first_tie = None;
    for (k, step) in run["steps"].as_array().expect("steps").iter().enumerate() {
        let pos = prompt_ids.len() - 1 + k;
        let row = &lp[pos * vocab..(pos + 1) * vocab];
        let (argmax, our_gap) = top2(row);
        let top_ids = ids(&step["top_ids"]);
        let top: Vec<f64> = serde_json::from_value(step["top_log_probs"].clone()).unwrap();
        let their_gap = step["top2_logit_gap"].as_f64().unwrap();
        // Log-prob differences equal logit differences: same normaliser.
        let gap_for_their_pair =
            f64::from(row[top_ids[0] as usize]) - f64::from(row[top_ids[1] as usize]);
        for (&id, &w) in top_ids.iter().zip(&top) {
            worst[0] = worst[0].max((f64::from(row[id as usize]) - w).abs());
        }
        worst[1] = worst[1].max((f64::from(row[top_ids[0] as usize]) - top[0]).abs());
        worst[2] = worst[2].max((gap_for_their_pair - their_gap).abs());
        lines.push(format!(
            "  step {k:2}: llama.cpp {:6} (top-2 gap {their_gap:.3}), ours {argmax:6} (top-2 gap {our_gap:.3})",
            want[k]
        ));
        if argmax != want[k] as usize {
            assert!(
                argmax == top_ids[1] as usize && their_gap < GAP_TOL,
                "{prompt:?} step {k}: our argmax {argmax} is not llama.cpp's {} nor a near-tie second\n{}",
                want[k],
                lines.join("\n")
            );
            first_tie.get_or_insert(k);
        }
    }

    // Free-running greedy decoding: llama.cpp's tokens up to the first
    // near-tie that we break the other way (none: all of them).
    let ours = generate_greedy(model, &prompt_ids, want.len(), None).expect("generate");
    let agree = first_tie.unwrap_or(want.len());
    assert_eq!(
        ours[..agree],
        want[..agree],
        "{prompt:?}: greedy tokens differ from llama.cpp before any near-tie\n{}",
        lines.join("\n")
    );
    if agree < want.len() {
        assert_ne!(
            ours[agree], want[agree],
            "{prompt:?}: teacher-forced and free-running argmax differ"
        );
        lines.push(format!(
            "  => greedy equals llama.cpp for {agree} tokens, then takes llama.cpp's second token at a near-tie"
        ));
    } else {
        lines.push(format!(
            "  => greedy equals llama.cpp for all {agree} tokens"
        ));
    }
    lines.join("\n")
}

#[test]
fn greedy_decoding_and_top20_log_probs_match_llama_cpp() {
    let Some((model, tokenizer)) = load() else {
        return;
    };
    let doc = golden();
    let t0 = Instant::now();
    // Largest |Δ| of top-20 log-probs, top-1 log-prob, top-2 gap.
    let mut worst = [0.0f64; 3];
    for run in doc["greedy"].as_array().expect("greedy runs") {
        println!("{}", check_prompt(&model, &tokenizer, run, &mut worst));
    }
    println!(
        "vs llama.cpp: max |Δ| top-20 log-prob {:.4}, top-1 log-prob {:.4}, top-2 gap {:.4} ({:.2?})",
        worst[0],
        worst[1],
        worst[2],
        t0.elapsed()
    );
    assert_within_tolerances(worst);
}

/// The worst |Δ|s (top-20 log-probs, top-1 log-prob, top-2 gap) within
/// [`TOP20_TOL`], [`TOP1_TOL`], [`GAP_TOL`].
fn assert_within_tolerances(worst: [f64; 3]) {
    assert!(
        worst[0] <= TOP20_TOL,
        "top-20 log-probs differ by {} > {TOP20_TOL}",
        worst[0]
    );
    assert!(
        worst[1] <= TOP1_TOL,
        "top-1 log-probs differ by {} > {TOP1_TOL}",
        worst[1]
    );
    assert!(
        worst[2] <= GAP_TOL,
        "top-2 gaps differ by {} > {GAP_TOL}",
        worst[2]
    );
}

#[test]
fn hamlet_perplexity_matches_llama_cpp() {
    let Some((model, tokenizer)) = load() else {
        return;
    };
    let doc = golden();
    let p = &doc["perplexity"];
    let passage = std::fs::read_to_string(runtime_support::fixture("llama_cpp/hamlet_passage.txt"))
        .expect("read passage");
    let want_ids = ids(&p["ids"]);
    assert_eq!(
        tokenizer.encode(&passage, true).expect("encode"),
        want_ids,
        "our tokenization of the passage differs from llama.cpp's"
    );
    let t0 = Instant::now();
    let lp = model.next_token_log_probs(&want_ids).expect("score");
    let elapsed = t0.elapsed();
    let nll: f64 = lp.iter().map(|&x| -f64::from(x)).sum();
    let ours = (nll / lp.len() as f64).exp();
    let theirs = p["perplexity"].as_f64().unwrap();
    let rel = (ours - theirs).abs() / theirs;
    println!(
        "perplexity over {} predictions: ours {ours:.4}, llama.cpp {theirs:.4}, relative difference {rel:.2e} ({elapsed:.2?})",
        lp.len()
    );
    assert!(
        rel <= PPL_REL_TOL,
        "perplexity {ours} vs llama.cpp {theirs}: relative {rel}"
    );
    let f32_ppl = doc["f32_reference"]["perplexity"].as_f64().unwrap();
    let rel_f32 = (ours - f32_ppl).abs() / f32_ppl;
    println!(
        "f32 reference (transformers) perplexity {f32_ppl:.4}, relative difference {rel_f32:.2e}"
    );
    assert!(
        rel_f32 <= PPL_F32_REL_TOL,
        "perplexity {ours} vs transformers' f32 {f32_ppl}: relative {rel_f32}"
    );
    assert!(
        (PPL_RANGE.0..=PPL_RANGE.1).contains(&ours),
        "perplexity {ours} outside {PPL_RANGE:?}"
    );
}

/// Worst |Δ| against llama.cpp (top-20 log-probs, top-1 log-prob, top-2
/// gap), and the mean |Δ| of the top-20 log-probs, along its greedy paths, teacher-forced one token at a time from an
/// empty cache, so that every product is a decode product, with the model
/// loaded with `products`.
fn decode_worst(path: &std::path::Path, products: DecodeProducts) -> ([f64; 3], f64) {
    let model =
        Model::<B>::load(LoadOptions::path(path, &Default::default()).decode_products(products))
            .expect("load");
    let vocab = model.vocab_size();
    let mut worst = [0.0f64; 3];
    let (mut sum, mut count) = (0.0f64, 0usize);
    for run in golden()["greedy"].as_array().expect("greedy runs") {
        let prompt_ids = ids(&run["prompt_ids"]);
        let want = ids(&run["generated"]);
        let mut cache = model.new_cache(1);
        let mut rows = Vec::new();
        for &t in prompt_ids.iter().chain(&want[..want.len() - 1]) {
            let logits = model
                .logits_last(&Batch::single(&[t]).unwrap(), &mut cache, None)
                .unwrap();
            rows.push(to_vec(log_softmax(logits)).unwrap());
        }
        for (k, step) in run["steps"].as_array().expect("steps").iter().enumerate() {
            let row = &rows[prompt_ids.len() - 1 + k];
            assert_eq!(row.len(), vocab);
            let top_ids = ids(&step["top_ids"]);
            let top: Vec<f64> = serde_json::from_value(step["top_log_probs"].clone()).unwrap();
            let their_gap = step["top2_logit_gap"].as_f64().unwrap();
            let gap = f64::from(row[top_ids[0] as usize]) - f64::from(row[top_ids[1] as usize]);
            for (&id, &w) in top_ids.iter().zip(&top) {
                let d = (f64::from(row[id as usize]) - w).abs();
                worst[0] = worst[0].max(d);
                sum += d;
                count += 1;
            }
            worst[1] = worst[1].max((f64::from(row[top_ids[0] as usize]) - top[0]).abs());
            worst[2] = worst[2].max((gap - their_gap).abs());
        }
    }
    (worst, sum / count as f64)
}

/// Decoding with 8-bit activations ([`DecodeProducts::Int8Activations`],
/// llama.cpp's own scheme for these weights) stays within the tolerances
/// above of llama.cpp, as the default f32 activations do; both are printed,
/// for the comparison.
#[test]
fn decoding_with_int8_activations_matches_llama_cpp() {
    let Some(path) = runtime_support::real_weights("smollm2.gguf") else {
        return;
    };
    let t0 = Instant::now();
    let f32_worst = decode_worst(&path, DecodeProducts::F32Activations);
    let int8_worst = decode_worst(&path, DecodeProducts::Int8Activations);
    for (name, (w, mean)) in [
        ("f32 activations", f32_worst),
        ("int8 activations", int8_worst),
    ] {
        println!(
            "decode with {name} vs llama.cpp: max |Δ| top-20 log-prob {:.4} (mean {mean:.4}), top-1 log-prob {:.4}, top-2 gap {:.4}",
            w[0], w[1], w[2]
        );
    }
    println!("({:.2?})", t0.elapsed());
    assert_within_tolerances(f32_worst.0);
    assert_within_tolerances(int8_worst.0);
}
