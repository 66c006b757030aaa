//! The DPS-MOZO experiment (arXiv:2501.19287, §5): in-context learning on a real task
//! built from a real corpus — WordNet 3.1's noun definitions ([`wordnet`]) — scored
//! with ROUGE-L F1 against WordNet's own definition.
//!
//! The run has `seeds` seeds, each an independent deployment ([`split`]): its own
//! private demonstrations D (word and definition), its own test queries (words;
//! their definitions are the references; no two seeds share one), its own public
//! inputs for DPS-MOZO+Off (words only), its own mechanism randomness and its own
//! privacy budget per method, calibrated to its queries. Each figure is reported as
//! the mean over seeds with a 95% interval ([`summary`], as the paper reports the
//! mean and standard deviation over five seeds). Methods, each generating up to
//! `max_tokens` tokens per query and stopping at the first line break:
//! - zero-shot (no demonstration, charges 0);
//! - the sharpened zero-shot control ([`SharpenedZeroShot`]): zero-shot at
//!   temperature 1/n_shots, what DPS-MOZO+On releases at λ = 0 (charges 0);
//! - few-shot: the normalised product of `n_shots` one-shot distributions, no
//!   mixing — non-private (+∞);
//! - DPS-MOZO+On at each ε: the radius calibrated so that `n_test × max_tokens`
//!   tokens fit (ε, δ), every token charged before it is released;
//! - DPS-MOZO+Off at each ε: DP outputs for the public inputs within (ε, δ), then
//!   ordinary few-shot decoding with those DP demonstrations (post-processing:
//!   nothing more is charged);
//! - the Wu et al. (2023) embedding-space aggregation at each ε ([`embedding`]),
//!   when a sentence encoder (all-MiniLM-L6-v2, `cargo xtask fetch-models --only
//!   minilm`) is given; otherwise the report says why it is missing.
//!
//! Zero-shot, few-shot and +On answer a seed's queries together, one token of
//! each unfinished query per round, each query with its own random stream
//! (`lockstep.rs`): a round's one-shot prompts run as a few batched forwards.
//!
//! The membership-inference attack ([`mia`]) runs once, over `mia_repetitions`
//! disjoint example sets of `mia_examples` each, with DPS-MOZO+On's per-token radius
//! at each ε.

mod cache;
mod common;
pub mod embedding;
mod lockstep;
pub mod mia;
mod sharpened;
pub mod source;
pub mod split;
pub mod summary;
pub mod wordnet;

use std::time::Instant;

use crate::Backend;
use privmix_accountant::{Budget, Orders};
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::step_loop::settle_charged;
use privmix_mechanisms::{
    Account, DpFewShot, DpsMozo, DpsMozoConfig, FewShotProduct, IclMechanism, PrivacyRng,
    Unbudgeted, ZeroShot, calibrate_radius, generate_dp_demonstrations,
};
use privmix_models::{LoadOptions, Model, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::stats::Interval;
use common::{Answer, Decoded, demo_text, query_text, scored, tokens};
pub use common::{HEADER, IclConfig, IclResult};
pub use sharpened::SharpenedZeroShot;

/// The method name of the sharpened zero-shot control ([`SharpenedZeroShot`]).
pub const SHARPENED_ZERO_SHOT: &str = "sharpened zero-shot";
use source::{DpPromptSource, IclRunner, PromptSource};
use split::{SeedSplit, SplitSizes, seed_of};
pub use summary::{IclSeed, IclSummary};
use summary::{same_epsilon, summarise};
use wordnet::{Definition, load_nouns};

/// Everything the ICL experiment measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclResults {
    /// The configuration.
    pub config: IclConfig,
    /// Nouns kept from WordNet.
    pub nouns: usize,
    /// One row per method and ε: the mean over seeds with its interval.
    pub summary: Vec<IclSummary>,
    /// Each seed's own results.
    pub seeds: Vec<IclSeed>,
    /// The membership-inference attack (None: not run).
    pub mia: Option<mia::MiaRun>,
    /// Why the embedding baseline did not run (None: it ran).
    #[serde(default)]
    pub embedding_skipped: Option<String>,
    /// Wall seconds of the whole ICL run (model loading included).
    pub seconds: f64,
    /// Seconds the seeds and the attack read from the cache took when an
    /// earlier run of the same configuration and commit made them.
    #[serde(default)]
    pub reused_seconds: f64,
    /// What `--verify-cache` found (None: not asked, or seed 0 was not cached).
    #[serde(default)]
    pub cache_check: Option<String>,
}

impl IclResults {
    fn row(&self, method: &str, epsilon: Option<f64>) -> Option<&IclSummary> {
        self.summary
            .iter()
            .find(|r| r.method == method && same_epsilon(r.target_epsilon, epsilon))
    }

    /// ROUGE-L F1 of `method` (`zero-shot`, `few-shot`, `dps-mozo+on`,
    /// `dps-mozo+off`, `wu-embedding-agg`, `embedding-agg (no noise)`) at target
    /// `epsilon` (None for the baselines): mean and 95% interval over seeds.
    pub fn rouge(&self, method: &str, epsilon: Option<f64>) -> Option<Interval> {
        self.row(method, epsilon).map(|r| r.rouge_l_f1)
    }

    /// Each seed's mean ROUGE-L F1 of `method` at `epsilon`, in seed order (for
    /// paired comparisons: [`Interval::of_differences`]).
    pub fn rouge_per_seed(&self, method: &str, epsilon: Option<f64>) -> Option<Vec<f64>> {
        self.row(method, epsilon).map(|r| r.per_seed.clone())
    }

    /// The membership-inference AUC-ROC (a fraction in [0, 1]) of `method`
    /// (`few-shot` with None: one shot without privacy; `dps-mozo+on` with
    /// Some(ε); `zero-shot` with None): mean and 95% interval over repetitions.
    pub fn mia_auc(&self, method: &str, epsilon: Option<f64>) -> Option<Interval> {
        self.mia
            .as_ref()?
            .results
            .iter()
            .find(|r| r.method == method && same_epsilon(r.target_epsilon, epsilon))
            .map(|r| r.auc)
    }
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
    let mut out = Decoded::new();
    let mut exhausted = false;
    for q in queries {
        let mut answer = Answer::new(tokenizer, &q.word)?;
        for _ in 0..max_tokens {
            if exhausted {
                break;
            }
            let stepped = match step(&answer.context) {
                Ok(outcome) => Ok(outcome),
                Err(BenchError::Mechanism(e)) => Err(e),
                Err(e) => return Err(e),
            };
            let Some(outcome) = settle_charged(stepped)? else {
                // The budget cannot pay for another token: nothing more is released,
                // this answer ends here and later queries get none.
                exhausted = true;
                break;
            };
            out.count(&outcome);
            answer.push(tokenizer, outcome.token as u32)?;
            if answer.done {
                break;
            }
        }
        out.predictions.push(answer.prediction());
        bar.inc(1);
    }
    Ok(out)
}

fn finite(e: f64) -> Option<f64> {
    e.is_finite().then_some(e)
}

/// What every seed shares: the model, the prompt pieces, the radii.
struct Shared<'a> {
    config: &'a IclConfig,
    runner: &'a IclRunner,
    tokenizer: &'a Tokenizer,
    header: Vec<u32>,
    stop: Option<u32>,
    orders: Orders,
    bar: &'a indicatif::ProgressBar,
}

/// DPS-MOZO+On's per-token radius at each ε: the largest whose
/// `test_queries × max_tokens` charged tokens fit (ε, δ) with `n_shots` of
/// `private_demos` demonstrations drawn per token.
fn on_radii(config: &IclConfig, orders: &Orders) -> Result<Vec<(f64, f64)>, BenchError> {
    let tokens = (config.test_queries * config.max_tokens) as u64;
    config
        .epsilons
        .iter()
        .map(|&eps| {
            let r = calibrate_radius(
                orders,
                eps,
                config.delta,
                tokens,
                config.n_shots,
                config.private_demos,
            )?;
            Ok((eps, r))
        })
        .collect()
}

/// Runs every method (see the module docs).
pub fn run_icl(config: &IclConfig, progress: bool) -> Result<IclResults, BenchError> {
    run_icl_verified(config, progress, false)
}

/// [`run_icl`], and with `verify_cache` seed 0 is recomputed even when it is
/// cached and compared with its entry (`--verify-cache`): each query's answer
/// and score must be the same (the decoding is seeded and discrete), or the
/// cache holds results its key no longer describes and the run stops with an
/// error. What was found is in [`IclResults::cache_check`].
pub fn run_icl_verified(
    config: &IclConfig,
    progress: bool,
    verify_cache: bool,
) -> Result<IclResults, BenchError> {
    let started = Instant::now();
    let bar = if progress {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:36} [{bar:30}] {pos}/{len} queries {elapsed_precise}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let device = Default::default();
    let tokenizer = crate::experiment::tokenizer_for(&config.model, config.tokenizer.as_deref())?;
    let model = Model::<Backend>::load(LoadOptions::path(&config.model, &device))?;
    let runner: IclRunner = EnsembleRunner::new(model, &[])?;
    let nouns = load_nouns(&config.wordnet)?;
    let sizes = SplitSizes {
        seeds: config.seeds,
        test_queries: config.test_queries,
        private_demos: config.private_demos,
        public_inputs: config.public_inputs,
        mia_repetitions: if config.mia_examples >= 2 {
            config.mia_repetitions
        } else {
            0
        },
        mia_examples: config.mia_examples,
    };
    let split = split::split(nouns.len(), &sizes, config.n_shots, config.seed)?;
    let pick =
        |idx: &[usize]| -> Vec<Definition> { idx.iter().map(|&i| nouns[i].clone()).collect() };
    let stop = tokens(&tokenizer, "\n")?;
    let shared = Shared {
        config,
        runner: &runner,
        tokenizer: &tokenizer,
        header: tokens(&tokenizer, HEADER)?,
        stop: (stop.len() == 1).then(|| stop[0]),
        orders: Orders::dp_accounting_default(),
        bar: &bar,
    };
    let radii = on_radii(config, &shared.orders)?;
    let cache = cache::PartCache::new(config)?;
    let mut reused_seconds = 0.0;
    let mut cache_check = None;
    let mut seeds = Vec::with_capacity(split.seeds.len());
    let mut embedding_skipped = None;
    for (s, part) in split.seeds.iter().enumerate() {
        let seed = seed_of(config.seed, s);
        let name = format!("seed-{s}");
        let cached = cache.get_with_machine::<(Vec<IclResult>, Option<String>)>(&name)?;
        let (results, skipped) = match cached {
            Some((done, seconds, machine)) if verify_cache && s == 0 => {
                let label = format!("verify seed 1/{}", split.seeds.len());
                let again = run_seed(&shared, &pick, part, seed, &radii, &label)?;
                let same = |a: &[IclResult], b: &[IclResult]| {
                    a.len() == b.len()
                        && a.iter().zip(b).all(|(x, y)| {
                            x.method == y.method
                                && x.per_query == y.per_query
                                && x.examples == y.examples
                        })
                };
                cache_check = Some(if same(&done.0, &again.0) {
                    format!(
                        "ICL seed 0 recomputed ({} methods): every answer and score equal to \
                         its cache entry",
                        again.0.len()
                    )
                } else {
                    let first = first_difference(&done.0, &again.0);
                    match crate::run_info::machine_difference(machine.as_deref(), "ICL seed 0") {
                        Some(elsewhere) => format!("{elsewhere} ({first})"),
                        None => {
                            return Err(BenchError::Config(format!(
                                "--verify-cache: ICL seed 0 recomputed differs from its cache \
                                 entry ({first}): the cache holds results its key no longer \
                                 describes (bump ICL_VERSION in bench/src/icl/cache.rs)"
                            )));
                        }
                    }
                });
                reused_seconds += seconds;
                done
            }
            Some((done, seconds, _)) => {
                reused_seconds += seconds;
                done
            }
            None => {
                let t = Instant::now();
                let label = format!("seed {}/{}", s + 1, split.seeds.len());
                let done: (Vec<IclResult>, Option<String>) =
                    run_seed(&shared, &pick, part, seed, &radii, &label)?;
                cache.put(&name, &done, t.elapsed().as_secs_f64())?;
                done
            }
        };
        embedding_skipped = skipped;
        seeds.push(IclSeed { seed, results });
    }
    let mia = if split.mia.is_empty() {
        None
    } else if let Some((done, seconds)) = cache.get::<mia::MiaRun>("mia")? {
        reused_seconds += seconds;
        Some(done)
    } else {
        let t = Instant::now();
        let sets: Vec<Vec<Definition>> = split.mia.iter().map(|set| pick(set)).collect();
        bar.set_message("membership inference");
        bar.set_length((sets.len() * config.mia_examples) as u64);
        bar.set_position(0);
        let done =
            mia::membership_inference(&runner, &tokenizer, &sets, config.top_k, &radii, || {
                bar.inc(1)
            })?;
        cache.put("mia", &done, t.elapsed().as_secs_f64())?;
        Some(done)
    };
    bar.finish_and_clear();
    Ok(IclResults {
        config: config.clone(),
        nouns: nouns.len(),
        summary: summarise(&seeds)?,
        seeds,
        mia,
        embedding_skipped,
        seconds: started.elapsed().as_secs_f64(),
        reused_seconds,
        cache_check,
    })
}

/// Keys the sharpened zero-shot control's randomness apart from the seed's stream.
const SHARPENED_KEY: u64 = 0x5348_4152_5045_4e44;

/// Every method on one seed's split, with randomness from `seed`; also why the
/// embedding baseline did not run (None: it ran).
fn run_seed(
    sh: &Shared<'_>,
    pick: &dyn Fn(&[usize]) -> Vec<Definition>,
    part: &SeedSplit,
    seed: u64,
    radii: &[(f64, f64)],
    label: &str,
) -> Result<(Vec<IclResult>, Option<String>), BenchError> {
    let config = sh.config;
    let (private, queries, public) = (pick(&part.private), pick(&part.queries), pick(&part.public));
    let demos = private
        .iter()
        .map(|d| tokens(sh.tokenizer, &demo_text(d)))
        .collect::<Result<Vec<_>, _>>()?;
    let base = DpsMozoConfig::new(config.n_shots, config.top_k, 0.0)?;
    let mut results = Vec::new();
    let mut rng = PrivacyRng::from_seed(seed);

    // Baselines.
    let run_method = |mechanism: &mut dyn IclMechanism,
                      account: &mut dyn Account,
                      rng: &mut PrivacyRng|
     -> Result<Decoded, BenchError> {
        let mut src = PromptSource::new(sh.runner, sh.header.clone(), demos.clone());
        sh.bar.set_message(format!("{label} {}", mechanism.name()));
        lockstep::decode_lockstep(
            mechanism,
            &mut src,
            sh.tokenizer,
            &queries,
            config.max_tokens,
            rng,
            account,
            sh.bar,
        )
    };
    let t = Instant::now();
    let mut account = Unbudgeted::new(sh.orders.clone());
    let decoded = run_method(&mut ZeroShot::new(config.top_k)?, &mut account, &mut rng)?;
    results.push(scored(
        "zero-shot",
        None,
        &queries,
        decoded,
        Some(0.0),
        format!("top-k {}", config.top_k),
        t,
    ));
    let t = Instant::now();
    let mut account = Unbudgeted::new(sh.orders.clone());
    // Its own stream, so the other methods draw what they drew without it.
    let mut control_rng = PrivacyRng::from_seed(seed ^ SHARPENED_KEY);
    let decoded = run_method(
        &mut SharpenedZeroShot::new(config.top_k, config.n_shots)?,
        &mut account,
        &mut control_rng,
    )?;
    results.push(scored(
        SHARPENED_ZERO_SHOT,
        None,
        &queries,
        decoded,
        Some(0.0),
        format!(
            "top-k {}, temperature 1/{}: DPS-MOZO+On at λ = 0",
            config.top_k, config.n_shots
        ),
        t,
    ));
    let t = Instant::now();
    let mut account = Unbudgeted::new(sh.orders.clone());
    let decoded = run_method(&mut FewShotProduct::new(base), &mut account, &mut rng)?;
    results.push(scored(
        "few-shot",
        None,
        &queries,
        decoded,
        None,
        format!(
            "product of {} one-shot distributions of {} private demonstrations, no privacy",
            config.n_shots, config.private_demos
        ),
        t,
    ));

    for &(eps, radius) in radii {
        // +On: every generated token of every query is charged.
        let t = Instant::now();
        let on_tokens = (config.test_queries * config.max_tokens) as u64;
        let mut budget = Budget::new(sh.orders.clone(), eps, config.delta)?;
        let cfg = DpsMozoConfig::new(config.n_shots, config.top_k, radius)?;
        let decoded = run_method(&mut DpsMozo::new(cfg), &mut budget, &mut rng)?;
        let spent = budget.spent_epsilon(config.delta)?.epsilon;
        results.push(scored(
            "dps-mozo+on",
            Some(eps),
            &queries,
            decoded,
            finite(spent),
            format!("radius {radius:.3e} calibrated to {on_tokens} tokens"),
            t,
        ));

        // +Off: DP outputs for the public inputs, then few-shot decoding with them.
        if config.public_inputs > 0 {
            let t = Instant::now();
            let off_tokens = (config.public_inputs * config.max_tokens) as u64;
            let radius = calibrate_radius(
                &sh.orders,
                eps,
                config.delta,
                off_tokens,
                config.n_shots,
                config.private_demos,
            )?;
            let mut budget = Budget::new(sh.orders.clone(), eps, config.delta)?;
            let mut mechanism =
                DpsMozo::new(DpsMozoConfig::new(config.n_shots, config.top_k, radius)?);
            let inputs = public
                .iter()
                .map(|d| tokens(sh.tokenizer, &query_text(&d.word)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut src = PromptSource::new(sh.runner, sh.header.clone(), demos.clone());
            sh.bar
                .set_message(format!("{label} dps-mozo+off (offline)"));
            let dp_demos = generate_dp_demonstrations(
                &mut mechanism,
                &mut src,
                &inputs,
                config.max_tokens,
                sh.stop,
                &mut rng,
                &mut budget,
            )?;
            let spent = budget.spent_epsilon(config.delta)?.epsilon;
            let online = DpFewShot::new(&dp_demos, config.top_k)?;
            let mut few = DpPromptSource::new(sh.runner, sh.tokenizer, sh.header.clone());
            let mut free = Unbudgeted::new(sh.orders.clone());
            sh.bar.set_message(format!("{label} dps-mozo+off (online)"));
            let decoded = decode_all(
                sh.tokenizer,
                &queries,
                config.max_tokens,
                sh.bar,
                |context| Ok(online.step(&mut few, context, &mut rng, &mut free)?),
            )?;
            let zero_after = free.spent().epsilon(config.delta)?.epsilon;
            if zero_after != 0.0 {
                return Err(BenchError::Config(format!(
                    "DPS-MOZO+Off's online phase charged {zero_after}: it must be post-processing"
                )));
            }
            results.push(scored(
                "dps-mozo+off",
                Some(eps),
                &queries,
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
            sh.bar.set_message(format!("{label} embedding baseline"));
            results.extend(embedding::run_embedding_baseline(
                config,
                seed,
                dir,
                sh.runner,
                sh.tokenizer,
                &sh.header,
                &private,
                &queries,
                sh.bar,
            )?);
            None
        }
    };
    Ok((results, embedding_skipped))
}

/// Where two runs of one ICL seed first differ: the method and ε, then the query
/// (its index and both scores) or the example, for `--verify-cache`'s error.
fn first_difference(cached: &[IclResult], again: &[IclResult]) -> String {
    if cached.len() != again.len() {
        return format!(
            "{} methods cached, {} recomputed",
            cached.len(),
            again.len()
        );
    }
    for (x, y) in cached.iter().zip(again) {
        let what = format!("{} at ε {:?}", y.method, y.target_epsilon);
        if x.method != y.method {
            return format!("method {} cached where {what} was recomputed", x.method);
        }
        if let Some(q) = (0..x.per_query.len().max(y.per_query.len()))
            .find(|&q| x.per_query.get(q) != y.per_query.get(q))
        {
            return format!(
                "{what}: query {q} scored {:?} cached, {:?} recomputed ({} of {} queries differ)",
                x.per_query.get(q),
                y.per_query.get(q),
                x.per_query
                    .iter()
                    .zip(&y.per_query)
                    .filter(|(a, b)| a != b)
                    .count(),
                x.per_query.len()
            );
        }
        if let Some((a, b)) = x.examples.iter().zip(&y.examples).find(|(a, b)| a != b) {
            return format!("{what}: example {a:?} cached, {b:?} recomputed");
        }
    }
    "the examples' counts differ".into()
}

#[cfg(test)]
mod tests {
    use super::summary::test_result as result;
    use super::*;

    #[test]
    fn the_first_difference_names_the_method_the_query_and_both_scores() {
        let cached = vec![
            result("zero-shot", None, 0.2, Some(0.0)),
            result("dps-mozo+on", Some(1.0), 0.3, Some(0.9)),
        ];
        let mut again = cached.clone();
        again[1].per_query = vec![0.25];
        let d = first_difference(&cached, &again);
        assert!(d.contains("dps-mozo+on at ε Some(1.0): query 0"), "{d}");
        assert!(
            d.contains("Some(0.3) cached, Some(0.25) recomputed (1 of 1"),
            "{d}"
        );
        assert_eq!(
            first_difference(&cached, &again[..1]),
            "2 methods cached, 1 recomputed"
        );
    }

    fn results() -> IclResults {
        let seeds: Vec<IclSeed> = [0.2, 0.3, 0.25, 0.22, 0.28]
            .iter()
            .enumerate()
            .map(|(s, &f1)| IclSeed {
                seed: s as u64,
                results: vec![
                    result("zero-shot", None, f1 - 0.1, Some(0.0)),
                    result("few-shot", None, f1 + 0.1, None),
                    result("dps-mozo+on", Some(1.0), f1, Some(0.9)),
                    result("dps-mozo+on", Some(8.0), f1 + 0.05, Some(7.9)),
                ],
            })
            .collect();
        let mia = mia::MiaRun {
            repetitions: 2,
            examples: 3,
            results: vec![
                mia::MiaResult {
                    method: "few-shot".into(),
                    target_epsilon: None,
                    radius: None,
                    auc: Interval::of(&[0.9, 0.8]).unwrap(),
                    per_repetition: vec![0.9, 0.8],
                    members: Vec::new(),
                },
                mia::MiaResult {
                    method: "dps-mozo+on".into(),
                    target_epsilon: Some(1.0),
                    radius: Some(0.01),
                    auc: Interval::of(&[0.5, 0.6]).unwrap(),
                    per_repetition: vec![0.5, 0.6],
                    members: Vec::new(),
                },
            ],
            forward_seconds: 0.0,
            mixing_seconds: 0.0,
        };
        IclResults {
            config: serde_json::from_value(serde_json::json!({
                "model": "m", "tokenizer": null, "wordnet": "w", "private_demos": 8,
                "test_queries": 1, "public_inputs": 0, "n_shots": 2, "top_k": 5,
                "max_tokens": 3, "epsilons": [1.0, 8.0], "delta": 1e-5, "seed": 0,
                "mia_examples": 3
            }))
            .unwrap(),
            nouns: 100,
            summary: summarise(&seeds).unwrap(),
            seeds,
            mia: Some(mia),
            embedding_skipped: None,
            seconds: 0.0,
            reused_seconds: 0.0,
            cache_check: None,
        }
    }

    #[test]
    fn accessors_find_each_method_and_epsilon() {
        let r = results();
        // A configuration of before the seeds reads as one seed and one repetition.
        assert_eq!((r.config.seeds, r.config.mia_repetitions), (1, 1));
        let on1 = r.rouge("dps-mozo+on", Some(1.0)).unwrap();
        assert!((on1.mean - 0.25).abs() < 1e-12 && on1.n == 5);
        assert_eq!(
            r.rouge_per_seed("dps-mozo+on", Some(1.0)).unwrap(),
            [0.2, 0.3, 0.25, 0.22, 0.28]
        );
        let on8 = r.rouge_per_seed("dps-mozo+on", Some(8.0)).unwrap();
        assert!((on8[1] - 0.35).abs() < 1e-12);
        assert!((r.rouge("few-shot", None).unwrap().mean - 0.35).abs() < 1e-12);
        assert!((r.rouge("zero-shot", None).unwrap().mean - 0.15).abs() < 1e-12);
        // Absent: another ε, a baseline asked with an ε, an unknown method.
        assert!(r.rouge("dps-mozo+on", Some(2.0)).is_none());
        assert!(r.rouge("few-shot", Some(1.0)).is_none());
        assert!(r.rouge("dps-mozo+off", Some(1.0)).is_none());
        assert!(r.rouge_per_seed("wu-embedding-agg", Some(1.0)).is_none());
        let auc = r.mia_auc("few-shot", None).unwrap();
        assert!((auc.mean - 0.85).abs() < 1e-12 && auc.n == 2);
        assert!((r.mia_auc("dps-mozo+on", Some(1.0)).unwrap().mean - 0.55).abs() < 1e-12);
        assert!(r.mia_auc("dps-mozo+on", None).is_none());
        assert!(r.mia_auc("dps-mozo+on", Some(8.0)).is_none());
        // Paired comparison over seeds, as the claims use it.
        let d = Interval::of_differences(
            &r.rouge_per_seed("few-shot", None).unwrap(),
            &r.rouge_per_seed("dps-mozo+on", Some(1.0)).unwrap(),
        )
        .unwrap();
        assert!((d.mean - 0.1).abs() < 1e-12);
        // The JSON round trip keeps everything the accessors read.
        let back: IclResults = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        // (serde_json's float parsing may differ in the last bit.)
        let near = |a: Option<Interval>, b: Option<Interval>| {
            let (a, b) = (a.unwrap(), b.unwrap());
            let d = [a.mean - b.mean, a.low - b.low, a.high - b.high];
            assert!(
                d.iter().all(|x| x.abs() < 1e-12) && a.n == b.n,
                "{a:?} {b:?}"
            );
        };
        near(
            back.rouge("dps-mozo+on", Some(8.0)),
            r.rouge("dps-mozo+on", Some(8.0)),
        );
        near(back.mia_auc("few-shot", None), r.mia_auc("few-shot", None));
    }
}
