//! The DPS-MOZO experiment (arXiv:2501.19287, §5): in-context learning on a real task
//! built from a real corpus — WordNet 3.1's noun definitions ([`wordnet`]) — scored
//! with ROUGE-L F1 against WordNet's own definition.
//!
//! A seeded shuffle of the nouns gives three disjoint sets: the private
//! demonstrations D (word and definition), the test queries (words; their
//! definitions are the references) and, for DPS-MOZO+Off, public inputs (words
//! only). Methods, each generating up to `max_tokens` tokens per query and
//! stopping at the first line break:
//! - zero-shot (no demonstration, charges 0);
//! - few-shot: the normalised product of `n_shots` one-shot distributions, no
//!   mixing — non-private (+∞);
//! - DPS-MOZO+On at each ε: the radius calibrated so that `n_test × max_tokens`
//!   tokens fit (ε, δ), every token charged before it is released;
//! - DPS-MOZO+Off at each ε: DP outputs for the public inputs within (ε, δ), then
//!   ordinary few-shot decoding with those DP demonstrations (post-processing:
//!   nothing more is charged).
//!
//! - the Wu et al. (2023) embedding-space aggregation at each ε ([`embedding`]),
//!   when a sentence encoder (all-MiniLM-L6-v2, `cargo xtask fetch-models --only
//!   minilm`) is given; otherwise the report says why it is missing.

mod common;
pub mod embedding;
pub mod mia;
pub mod source;
pub mod wordnet;

use std::time::Instant;

use burn::backend::Flex;
use privmix_accountant::{Budget, Orders};
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::{
    Account, DpFewShot, DpsMozo, DpsMozoConfig, FewShotProduct, IclMechanism, MechanismError,
    PrivacyRng, Unbudgeted, ZeroShot, calibrate_radius, generate_dp_demonstrations,
};
use privmix_models::{Model, Tokenizer};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use common::{Decoded, demo_text, query_text, scored, tokens};
pub use common::{HEADER, IclConfig, IclResult};
use source::{DpPromptSource, IclRunner, PromptSource};
use wordnet::{Definition, load_nouns};

/// Everything the ICL experiment measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclResults {
    /// The configuration.
    pub config: IclConfig,
    /// Nouns kept from WordNet.
    pub nouns: usize,
    /// Results, one per method and ε.
    pub results: Vec<IclResult>,
    /// The membership-inference attack, one result per method.
    pub mia: Vec<mia::MiaResult>,
    /// Why the embedding baseline did not run (None: it ran).
    #[serde(default)]
    pub embedding_skipped: Option<String>,
}

/// Generates an answer for every query with `step`, stopping at a line break, at
/// the end-of-sequence token or after `max_tokens`.
fn decode_all(
    tokenizer: &Tokenizer,
    queries: &[Definition],
    max_tokens: usize,
    bar: &indicatif::ProgressBar,
    mut step: impl FnMut(&[u32]) -> Result<privmix_mechanisms::StepOutcome, BenchError>,
) -> Result<Decoded, BenchError> {
    bar.set_length(queries.len() as u64);
    bar.set_position(0);
    let eos = tokenizer.eos_id();
    let mut out = Decoded {
        predictions: Vec::new(),
        tokens: 0,
        lambdas: Vec::new(),
    };
    let mut exhausted = false;
    for q in queries {
        let mut context = tokens(tokenizer, &query_text(&q.word))?;
        let prompt_len = context.len();
        let mut text = String::new();
        for _ in 0..max_tokens {
            if exhausted {
                break;
            }
            let outcome = match step(&context) {
                Ok(outcome) => outcome,
                // The budget cannot pay for another token: nothing more is released,
                // this answer ends here and later queries get none.
                Err(BenchError::Mechanism(MechanismError::ChargeRefused(_))) => {
                    exhausted = true;
                    break;
                }
                Err(e) => return Err(e),
            };
            out.tokens += 1;
            if !outcome.diagnostics.lambdas.is_empty() {
                let l = &outcome.diagnostics.lambdas;
                out.lambdas.push(l.iter().sum::<f64>() / l.len() as f64);
            }
            let token = outcome.token as u32;
            if Some(token) == eos {
                break;
            }
            context.push(token);
            text = tokenizer.decode(&context[prompt_len..])?;
            if text.contains('\n') {
                break;
            }
        }
        out.predictions
            .push(text.split('\n').next().unwrap_or("").trim().to_string());
        bar.inc(1);
    }
    Ok(out)
}

fn finite(e: f64) -> Option<f64> {
    e.is_finite().then_some(e)
}

/// Runs every method (see the module docs).
pub fn run_icl(config: &IclConfig, progress: bool) -> Result<IclResults, BenchError> {
    let bar = if progress {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:28} [{bar:30}] {pos}/{len} queries {elapsed_precise}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let device = Default::default();
    let tokenizer = crate::experiment::tokenizer_for(&config.model, config.tokenizer.as_deref())?;
    let model = Model::<Flex>::load(&config.model, &device)?;
    let runner: IclRunner = EnsembleRunner::new(model, &[])?;
    let mut nouns = load_nouns(&config.wordnet)?;
    let total = nouns.len();
    let need = config.private_demos + config.test_queries + config.public_inputs;
    if need > total || config.private_demos < config.n_shots || config.test_queries == 0 {
        return Err(BenchError::Config(format!(
            "{need} nouns asked for ({} private ≥ n_shots {}, {} test, {} public), {total} kept",
            config.private_demos, config.n_shots, config.test_queries, config.public_inputs
        )));
    }
    nouns.shuffle(&mut ChaCha20Rng::seed_from_u64(config.seed));
    let private = &nouns[..config.private_demos];
    let queries = &nouns[config.private_demos..config.private_demos + config.test_queries];
    let public = &nouns[config.private_demos + config.test_queries..need];

    let header = tokens(&tokenizer, HEADER)?;
    let demos = private
        .iter()
        .map(|d| tokens(&tokenizer, &demo_text(d)))
        .collect::<Result<Vec<_>, _>>()?;
    let orders = Orders::dp_accounting_default();
    let stop = tokens(&tokenizer, "\n")?;
    let stop = (stop.len() == 1).then(|| stop[0]);
    let base = DpsMozoConfig::new(config.n_shots, config.top_k, 0.0)?;
    let mut results = Vec::new();
    let mut radii = Vec::new();
    let mut rng = PrivacyRng::from_seed(config.seed);

    // Baselines.
    let run_method = |mechanism: &mut dyn IclMechanism,
                      account: &mut dyn Account,
                      rng: &mut PrivacyRng|
     -> Result<Decoded, BenchError> {
        let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
        bar.set_message(mechanism.name().to_string());
        decode_all(&tokenizer, queries, config.max_tokens, &bar, |context| {
            Ok(mechanism.step(&mut src, context, rng, account)?)
        })
    };
    let t = Instant::now();
    let mut account = Unbudgeted::new(orders.clone());
    let decoded = run_method(&mut ZeroShot::new(config.top_k)?, &mut account, &mut rng)?;
    results.push(scored(
        "zero-shot",
        None,
        queries,
        decoded,
        Some(0.0),
        format!("top-k {}", config.top_k),
        t,
    ));
    let t = Instant::now();
    let mut account = Unbudgeted::new(orders.clone());
    let decoded = run_method(&mut FewShotProduct::new(base), &mut account, &mut rng)?;
    results.push(scored(
        "few-shot",
        None,
        queries,
        decoded,
        None,
        format!(
            "product of {} one-shot distributions of {} private demonstrations, no privacy",
            config.n_shots, config.private_demos
        ),
        t,
    ));

    for &eps in &config.epsilons {
        // The largest radius whose `tokens` charged tokens fit (ε, δ).
        let radius_for = |tokens: u64| {
            calibrate_radius(
                &orders,
                eps,
                config.delta,
                tokens,
                config.n_shots,
                config.private_demos,
            )
        };
        // +On: every generated token of every query is charged.
        let t = Instant::now();
        let on_tokens = (config.test_queries * config.max_tokens) as u64;
        let radius = radius_for(on_tokens)?;
        radii.push((eps, radius));
        let mut budget = Budget::new(orders.clone(), eps, config.delta)?;
        let cfg = DpsMozoConfig::new(config.n_shots, config.top_k, radius)?;
        let decoded = run_method(&mut DpsMozo::new(cfg), &mut budget, &mut rng)?;
        let spent = budget.spent_epsilon(config.delta)?.epsilon;
        results.push(scored(
            "dps-mozo+on",
            Some(eps),
            queries,
            decoded,
            finite(spent),
            format!("radius {radius:.3e} calibrated to {on_tokens} tokens"),
            t,
        ));

        // +Off: DP outputs for the public inputs, then few-shot decoding with them.
        if config.public_inputs > 0 {
            let t = Instant::now();
            let off_tokens = (config.public_inputs * config.max_tokens) as u64;
            let radius = radius_for(off_tokens)?;
            let mut budget = Budget::new(orders.clone(), eps, config.delta)?;
            let mut mechanism =
                DpsMozo::new(DpsMozoConfig::new(config.n_shots, config.top_k, radius)?);
            let inputs = public
                .iter()
                .map(|d| tokens(&tokenizer, &query_text(&d.word)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
            let dp_demos = generate_dp_demonstrations(
                &mut mechanism,
                &mut src,
                &inputs,
                config.max_tokens,
                stop,
                &mut rng,
                &mut budget,
            )?;
            let spent = budget.spent_epsilon(config.delta)?.epsilon;
            let online = DpFewShot::new(&dp_demos, config.top_k)?;
            let mut few = DpPromptSource::new(&runner, &tokenizer, header.clone());
            let mut free = Unbudgeted::new(orders.clone());
            bar.set_message("dps-mozo+off (online)");
            let decoded = decode_all(&tokenizer, queries, config.max_tokens, &bar, |context| {
                Ok(online.step(&mut few, context, &mut rng, &mut free)?)
            })?;
            let zero_after = free.spent().epsilon(config.delta)?.epsilon;
            if zero_after != 0.0 {
                return Err(BenchError::Config(format!(
                    "DPS-MOZO+Off's online phase charged {zero_after}: it must be post-processing"
                )));
            }
            results.push(scored(
                "dps-mozo+off",
                Some(eps),
                queries,
                decoded,
                finite(spent),
                format!(
                    "{} public inputs, radius {radius:.3e} calibrated to {off_tokens} offline tokens",
                    config.public_inputs
                ),
                t,
            ));
        }
    }
    let embedding_skipped = match &config.embedding_model {
        None => Some("no sentence-embedding model was given (--embedding-model)".to_string()),
        Some(dir) if !dir.join("model.safetensors").is_file() => Some(format!(
            "{} holds no model.safetensors (cargo xtask fetch-models --only minilm)",
            dir.display()
        )),
        Some(dir) => {
            results.extend(embedding::run_embedding_baseline(
                config, dir, &runner, &tokenizer, &header, private, queries, &bar,
            )?);
            None
        }
    };
    bar.finish_and_clear();
    let mia = if config.mia_examples >= 2 {
        let examples = &queries[..config.mia_examples.min(queries.len())];
        mia::membership_inference(&runner, &tokenizer, examples, config.top_k, &radii)?
    } else {
        Vec::new()
    };
    Ok(IclResults {
        config: config.clone(),
        nouns: total,
        results,
        mia,
        embedding_skipped,
    })
}
