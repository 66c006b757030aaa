//! Canary extraction (SubMix, arXiv:2201.00971, §4.2, after Carlini et al. 2019, arXiv:1802.08232): users whose
//! text holds a random secret, members fine-tuned on them, and an attacker who
//! prompts with the canary's prefix and samples the continuation.
//!
//! Canary k is the sentence `Record k: the PIN of account <name> is d d d d d d.`
//! with six seeded random digits, repeated `repeats` times as the text of one
//! user, given to member `k mod N` beside as many of that member's own training
//! blocks. The members here are fine-tuned for the audit (cached like the others);
//! they are not the members of the perplexity table.
//!
//! The attack's success is measured exactly rather than by Monte Carlo: with the
//! prefix as the prompt, the probability that one sampled continuation reproduces
//! the six digits is the product, over the digit positions, of the mechanism's
//! released probability of the true digit given the true earlier ones (teacher
//! forcing) — the expected hit rate of one attempt. Each mechanism runs with its
//! own account over exactly these queries (PMixED calibrated to them), so the
//! leakage shown is what its (ε, δ) allows for the queries it answered.

use std::time::Instant;

use crate::Backend;
use privmix_accountant::Orders;
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::{Ensemble, PrivacyRng, Rows};
use privmix_models::{LanguageModel, Model, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

pub use super::config::CanaryPlan;
use super::config::ExperimentConfig;
use super::contenders::contenders;
use super::data::ExperimentData;
use super::members::train_members;
use crate::error::BenchError;

/// One mechanism's extraction result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CanaryResult {
    /// Mechanism name.
    pub mechanism: String,
    /// Target ε (None for the public model and the non-private ensemble).
    pub target_epsilon: Option<f64>,
    /// Mean over canaries of the probability that one sampled continuation of the
    /// prefix reproduces the secret (the expected hit rate of one attempt).
    pub hit_rate: f64,
    /// log₁₀ of that probability for each canary.
    pub log10_probabilities: Vec<f64>,
    /// Whether greedy decoding from the prefix reproduces each canary's secret
    /// (every true digit the mode of the released law given the earlier ones).
    #[serde(default)]
    pub extracted: Vec<bool>,
    /// The share of canaries extracted by greedy decoding (the SubMix paper's
    /// recall, Fig. 4).
    #[serde(default)]
    pub recall: f64,
    /// ε spent over the canary queries (None: infinite).
    pub spent_epsilon: Option<f64>,
}

/// What the audit measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CanaryAudit {
    /// The settings.
    pub plan: CanaryPlan,
    /// The prefix and secret of each canary.
    pub canaries: Vec<(String, String)>,
    /// The uniform guess's hit rate, 10^−6.
    pub uniform_hit_rate: f64,
    /// Results per mechanism and ε.
    pub results: Vec<CanaryResult>,
    /// Seconds (training included).
    pub seconds: f64,
}

/// The canaries: `(prefix, secret)` pairs from the seed.
pub fn make_canaries(count: usize, seed: u64) -> Vec<(String, String)> {
    const NAMES: [&str; 8] = [
        "Imogen",
        "Benvolio",
        "Cordelia",
        "Florizel",
        "Hermia",
        "Lysander",
        "Perdita",
        "Sebastian",
    ];
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0xCA4A_21E5);
    (0..count)
        .map(|k| {
            let digits: Vec<String> = (0..6)
                .map(|_| rng.random_range(0..10).to_string())
                .collect();
            (
                format!(
                    "Record {k}: the PIN of account {} is",
                    NAMES[k % NAMES.len()]
                ),
                format!(" {}", digits.join(" ")),
            )
        })
        .collect()
}

/// Trains the audit members and measures every mechanism's hit rate.
pub fn canary_audit(
    config: &ExperimentConfig,
    plan: &CanaryPlan,
    tokenizer: &Tokenizer,
    data: &ExperimentData,
    progress: bool,
) -> Result<CanaryAudit, BenchError> {
    let started = Instant::now();
    let n = config.members;
    let canaries = make_canaries(plan.canaries, config.seed);
    let mut members = Vec::with_capacity(n);
    for i in 0..n {
        let mut text = String::new();
        for (prefix, secret) in canaries.iter().skip(i).step_by(n) {
            for _ in 0..plan.repeats {
                text.push_str(&format!("{prefix}{secret}.\n"));
            }
        }
        let ids = tokenizer.encode(&text, false)?;
        let mut blocks = privmix_ensemble::data::cut_blocks(&ids, config.block, None)?;
        let own = blocks.len().max(1);
        blocks.extend(data.members[i].iter().take(own).cloned());
        members.push(blocks);
    }
    let audit_data = ExperimentData {
        members,
        ..data.clone()
    };
    let mut audit_config = config.clone();
    audit_config.training.epochs = plan.epochs;
    audit_config.training.learning_rate = plan.learning_rate;
    audit_config.dp_sgd = None;
    let trained = train_members(&audit_config, &audit_data, progress)?;
    let model = Model::<Backend>::load(&config.model, &Default::default())?;
    let vocab = model.vocab_size();
    let runner = EnsembleRunner::new(model, &trained.members)?;
    let layout = RowLayout::public_and_members(n);

    let encoded = canaries
        .iter()
        .map(|(p, s)| Ok((tokenizer.encode(p, false)?, tokenizer.encode(s, false)?)))
        .collect::<Result<Vec<_>, BenchError>>()?;
    let queries: u64 = encoded.iter().map(|(_, s)| s.len() as u64).sum();
    let orders = Orders::dp_accounting_default();
    let mut cs = contenders(config, queries, vocab, false, &orders)?;
    let mut rng = PrivacyRng::from_seed(config.seed ^ 0xCA4A);
    // The last position's ensemble, whose buffers the next one reuses.
    let mut last: Option<Ensemble> = None;
    for (prefix, secret) in &encoded {
        let tokens = [prefix.as_slice(), secret].concat();
        let steps = runner.score_block_full(&layout, &tokens)?;
        for (i, rows) in steps.iter().enumerate().skip(prefix.len() - 1) {
            let flat = rows.as_flat();
            let ensemble = Ensemble::renew_or_new(
                last.take(),
                Rows::LogProbF32(&flat[..vocab]),
                Rows::LogProbF32(&flat[vocab..(n + 1) * vocab]),
            )?;
            for c in &mut cs {
                c.observe(&ensemble, tokens[i + 1] as usize, &mut rng)?;
            }
            last = Some(ensemble);
        }
        for c in &mut cs {
            c.end_block();
        }
    }
    let mut results = Vec::new();
    for c in cs {
        let r = c.finish()?;
        // A block's perplexity is exp(−log P / L): log₁₀ P = −L·log₁₀(perplexity).
        let log10_probabilities: Vec<f64> = r
            .block_perplexities
            .iter()
            .zip(&encoded)
            .map(|(ppl, (_, s))| -(s.len() as f64) * ppl.log10())
            .collect();
        let mut extracted = Vec::with_capacity(encoded.len());
        let mut at = 0;
        for (_, secret) in &encoded {
            extracted.push(r.greedy_hits[at..at + secret.len()].iter().all(|&h| h));
            at += secret.len();
        }
        let recall =
            extracted.iter().filter(|&&e| e).count() as f64 / extracted.len().max(1) as f64;
        let hit_rate = log10_probabilities
            .iter()
            .map(|l| 10f64.powf(*l))
            .sum::<f64>()
            / log10_probabilities.len().max(1) as f64;
        results.push(CanaryResult {
            mechanism: r.mechanism,
            target_epsilon: r.target_epsilon,
            hit_rate,
            log10_probabilities,
            extracted,
            recall,
            spent_epsilon: r.spent_epsilon,
        });
    }
    Ok(CanaryAudit {
        plan: plan.clone(),
        canaries,
        uniform_hit_rate: 1e-6,
        results,
        seconds: started.elapsed().as_secs_f64(),
    })
}
