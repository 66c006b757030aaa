//! The Wu et al. (2023, arXiv:2305.01639) embedding-space-aggregation baseline, as
//! DPS-MOZO (arXiv:2501.19287) App. D, Algorithm 4 restates it, on the WordNet task.
//!
//! The private demonstrations are split once (seeded shuffle) into N disjoint
//! subsets of `shots` each. Per query:
//! - each subset's few-shot prompt (header, its demonstrations, the query) is
//!   decoded greedily — all N prompts in one padded batch — giving N outputs;
//! - C public candidates are sampled from the zero-shot prompt (top-k,
//!   temperature 1; public, so free), also in one batch;
//! - outputs and candidates are embedded with a sentence encoder
//!   (all-MiniLM-L6-v2), and [`EmbeddingSpaceAggregation`] answers with the
//!   candidate closest to the noisy mean of the outputs' embeddings.
//!
//! The generations do not depend on ε, so they run once; each ε then only
//! calibrates σ for `n_test` queries and draws the noise. A noiseless row
//! (the candidate closest to the exact mean; no privacy) shows what the noise
//! costs.

use std::path::Path;
use std::time::Instant;

use crate::Backend;
use privmix_accountant::{Budget, Orders};
use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::{EmbeddingSpaceAggregation, PrivacyRng, clipped_mean};
use privmix_models::{SentenceEncoder, Tokenizer};
use rand::Rng;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;

use super::common::{Decoded, IclConfig, IclResult, demo_text, query_text, scored, tokens};
use super::source::{IclDecoder, IclRunner};
use super::wordnet::Definition;
use crate::error::BenchError;

/// What was generated and embedded for one query.
struct Query {
    outputs: Vec<Vec<f32>>,
    candidates: Vec<String>,
    candidate_embeddings: Vec<Vec<f32>>,
}

/// Runs the baseline at every ε of `config`, plus the noiseless row, with the
/// subsets, candidates and noise drawn from `seed` (one seed of the run).
#[allow(clippy::too_many_arguments)]
pub fn run_embedding_baseline(
    config: &IclConfig,
    seed: u64,
    encoder_dir: &Path,
    runner: &IclRunner,
    tokenizer: &Tokenizer,
    header: &[u32],
    private: &[Definition],
    queries: &[Definition],
    bar: &indicatif::ProgressBar,
) -> Result<Vec<IclResult>, BenchError> {
    let started = Instant::now();
    let (n, shots, c) = (config.esa_subsets, config.esa_shots, config.esa_candidates);
    if n == 0 || shots == 0 || c == 0 || n * shots > private.len() {
        return Err(BenchError::Config(format!(
            "embedding baseline: {n} subsets × {shots} shots need {} private demonstrations, \
             {} available; and ≥ 1 candidate ({c})",
            n * shots,
            private.len()
        )));
    }
    let encoder = SentenceEncoder::<Backend>::load(encoder_dir, &Default::default())?;
    let mut order: Vec<usize> = (0..private.len()).collect();
    order.shuffle(&mut ChaCha20Rng::seed_from_u64(seed ^ 0xe5a));
    let subsets: Vec<Vec<u32>> = order
        .chunks(shots)
        .take(n)
        .map(|chunk| {
            let mut ids = header.to_vec();
            for &d in chunk {
                ids.extend(tokens(tokenizer, &demo_text(&private[d]))?);
            }
            Ok(ids)
        })
        .collect::<Result<_, BenchError>>()?;

    bar.set_message("embedding baseline");
    bar.set_length(queries.len() as u64);
    bar.set_position(0);
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0xca7d);
    // The prompts' prefixes are the same for every query: the subsets' few-shot
    // prefixes (one padded batch) and the zero-shot header (C rows) are prefilled
    // once, and each query starts from clones of them.
    let mut few_shot_prefixes = runner.decoder(RowLayout::public_only(n))?;
    few_shot_prefixes.prefill_rows(&subsets)?;
    let mut zero_shot_prefixes = runner.decoder(RowLayout::public_only(c))?;
    zero_shot_prefixes.prefill(header)?;
    let mut generated = 0;
    let mut per_query = Vec::with_capacity(queries.len());
    for q in queries {
        let query = tokens(tokenizer, &query_text(&q.word))?;
        let (outputs, t1) = decode_batch(
            few_shot_prefixes.clone(),
            tokenizer,
            &query,
            config.max_tokens,
            argmax,
        )?;
        let (candidates, t2) = decode_batch(
            zero_shot_prefixes.clone(),
            tokenizer,
            &query,
            config.max_tokens,
            |lp| sample_top_k(lp, config.top_k, &mut rng),
        )?;
        generated += t1 + t2;
        let texts: Vec<&str> = outputs.iter().map(String::as_str).collect();
        let cands: Vec<&str> = candidates.iter().map(String::as_str).collect();
        per_query.push(Query {
            outputs: encoder.embed(&texts)?,
            candidate_embeddings: encoder.embed(&cands)?,
            candidates,
        });
        bar.inc(1);
    }
    let parameters = |sigma: Option<f64>| {
        format!(
            "{n} subsets × {shots} shots (greedy outputs), {c} zero-shot candidates (top-k {}), \
             all-MiniLM-L6-v2 embeddings{}",
            config.top_k,
            sigma.map_or(", no noise, no privacy".into(), |s| format!(", σ {s:.4}"))
        )
    };

    let orders = Orders::dp_accounting_default();
    let mut results = Vec::new();
    // Noiseless: the candidate closest to the exact mean.
    let answers = per_query
        .iter()
        .map(|p| {
            Ok(p.candidates[closest(&clipped_mean(&p.outputs)?, &p.candidate_embeddings)].clone())
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    results.push(scored(
        "embedding-agg (no noise)",
        None,
        queries,
        decoded(answers, generated),
        None,
        parameters(None),
        started,
    ));
    let mut noise = PrivacyRng::from_seed(seed ^ 0x5eed);
    for &eps in &config.epsilons {
        let t = Instant::now();
        // The embeddings' dimension (the charge's grid term grows with it).
        let dim = per_query
            .first()
            .and_then(|p| p.candidate_embeddings.first())
            .map_or(1, Vec::len);
        let esa = EmbeddingSpaceAggregation::calibrated(
            &orders,
            n,
            dim,
            queries.len() as u64,
            eps,
            config.delta,
        )?;
        let mut budget = Budget::new(orders.clone(), eps, config.delta)?;
        let answers = per_query
            .iter()
            .map(|p| {
                let r =
                    esa.release(&p.outputs, &p.candidate_embeddings, &mut noise, &mut budget)?;
                Ok(p.candidates[r.index].clone())
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let spent = budget.spent_epsilon(config.delta)?.epsilon;
        results.push(scored(
            "wu-embedding-agg",
            Some(eps),
            queries,
            decoded(answers, generated),
            spent.is_finite().then_some(spent),
            parameters(Some(esa.sigma())),
            t,
        ));
    }
    Ok(results)
}

/// The chosen answers as [`scored`] takes them (no λ: nothing is mixed).
fn decoded(predictions: Vec<String>, tokens: usize) -> Decoded {
    Decoded {
        predictions,
        tokens,
        lambdas: Vec::new(),
    }
}

/// Index of the embedding of largest cosine similarity to `target`.
fn closest(target: &[f64], embeddings: &[Vec<f32>]) -> usize {
    let cos = |e: &Vec<f32>| {
        let dot: f64 = e.iter().zip(target).map(|(&a, b)| a as f64 * b).sum();
        let norm = e.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
        dot / norm.max(f64::MIN_POSITIVE)
    };
    let mut best = 0;
    for (i, e) in embeddings.iter().enumerate() {
        if cos(e) > cos(&embeddings[best]) {
            best = i;
        }
    }
    best
}

/// Feeds `query` to every row of `decoder` (each row holding its prompt's prefix),
/// then decodes all rows in one batch, choosing each row's next token with `pick`
/// from its log-probabilities, until each row has produced a line break or the
/// end-of-sequence token, or `max_tokens` tokens. Returns each row's first line and
/// the number of tokens generated.
fn decode_batch(
    mut decoder: IclDecoder<'_>,
    tokenizer: &Tokenizer,
    query: &[u32],
    max_tokens: usize,
    mut pick: impl FnMut(&[f32]) -> u32,
) -> Result<(Vec<String>, usize), BenchError> {
    let rows = decoder.layout().len();
    let mut out = decoder.prefill(query)?;
    let eos = tokenizer.eos_id();
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); rows];
    // The original rows still decoding, in the decoder's row order: a finished
    // row is dropped from the batch, so later steps compute only live rows.
    let mut live: Vec<usize> = (0..rows).collect();
    let mut count = 0;
    for step in 0..max_tokens {
        let mut keep = Vec::with_capacity(live.len());
        let mut next = Vec::with_capacity(live.len());
        for (i, &r) in live.iter().enumerate() {
            let token = pick(out.row(i));
            count += 1;
            if Some(token) == eos {
                continue;
            }
            generated[r].push(token);
            if !tokenizer.decode(&generated[r])?.contains('\n') {
                keep.push(i);
                next.push(token);
            }
        }
        if keep.is_empty() || step + 1 == max_tokens {
            break;
        }
        if keep.len() < live.len() {
            decoder.retain_rows(&keep)?;
            live = keep.iter().map(|&i| live[i]).collect();
        }
        out = decoder.next_log_probs_rows(&next)?;
    }
    let texts = generated
        .iter()
        .map(|ids| {
            let text = tokenizer.decode(ids)?;
            Ok(text.split('\n').next().unwrap_or("").trim().to_string())
        })
        .collect::<Result<_, BenchError>>()?;
    Ok((texts, count))
}

fn argmax(log_p: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in log_p.iter().enumerate() {
        if v > log_p[best] {
            best = i;
        }
    }
    best as u32
}

/// A draw from the `k` most likely tokens, renormalised.
fn sample_top_k(log_p: &[f32], k: usize, rng: &mut impl Rng) -> u32 {
    let mut idx: Vec<usize> = (0..log_p.len()).collect();
    let k = k.clamp(1, log_p.len());
    idx.select_nth_unstable_by(k - 1, |&a, &b| log_p[b].total_cmp(&log_p[a]));
    idx.truncate(k);
    let max = idx
        .iter()
        .map(|&i| log_p[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = idx
        .iter()
        .map(|&i| f64::from(log_p[i] - max).exp())
        .collect();
    let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&i, w) in idx.iter().zip(&weights) {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    idx[0] as u32
}
