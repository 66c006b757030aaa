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
//! The audit needs a working positive control to mean anything, as in SubMix's
//! §4.2, where the non-private model memorises every code (≥ 90% recall):
//! - every training block holds whole canary sentences ([`canary_blocks`]), so
//!   no repeat is cut at a block's edge;
//! - the sentence's tokens are the prefix's then the secret's, as the attack
//!   feeds them ([`check_whole`]): a tokenizer that merged across the join
//!   would train on tokens the attack never scores;
//! - the member holding each canary is scored on its own ([`CANARY_MEMBER`]):
//!   SubMix's non-privately fine-tuned model, which the ensemble dilutes N-fold.
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
use privmix_models::{LanguageModel, LoadOptions, Model, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::adapters::load_all;
pub use super::config::CanaryPlan;
use super::config::ExperimentConfig;
use super::contenders::contenders;
use super::data::ExperimentData;
use super::members::{TrainedMembers, train_members};
use crate::error::BenchError;

/// The audit's row of the member holding each canary, without privacy: the
/// positive control.
pub const CANARY_MEMBER: &str = "canary's member";

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
    audit_members(config, plan, tokenizer, data, progress)?.score(config, plan)
}

/// The audit's canaries and members, before anything is scored: the members
/// trained, or found complete in the cache and not yet read.
pub struct AuditMembers {
    started: Instant,
    canaries: Vec<(String, String)>,
    encoded: Vec<(Vec<u32>, Vec<u32>)>,
    /// The members fine-tuned with the canaries.
    pub trained: TrainedMembers,
}

/// Makes the canaries and trains (or finds in the cache) the audit's members.
pub fn audit_members(
    config: &ExperimentConfig,
    plan: &CanaryPlan,
    tokenizer: &Tokenizer,
    data: &ExperimentData,
    progress: bool,
) -> Result<AuditMembers, BenchError> {
    let started = Instant::now();
    let n = config.members;
    let canaries = make_canaries(plan.canaries, config.seed);
    let encoded = canaries
        .iter()
        .map(|(p, s)| Ok((tokenizer.encode(p, false)?, tokenizer.encode(s, false)?)))
        .collect::<Result<Vec<_>, BenchError>>()?;
    let mut members = Vec::with_capacity(n);
    for i in 0..n {
        let own = &data.members[i];
        let filler: Vec<u32> = own.first().cloned().unwrap_or_default();
        let mut blocks = Vec::new();
        for (k, (prefix, secret)) in canaries.iter().enumerate().skip(i).step_by(n) {
            let sentence = tokenizer.encode(&format!("{prefix}{secret}.\n"), false)?;
            check_whole(k, &encoded[k].0, &encoded[k].1, &sentence)?;
            blocks.extend(canary_blocks(
                &sentence,
                plan.repeats,
                config.block,
                &filler,
            )?);
        }
        let count = blocks.len().max(1);
        blocks.extend(own.iter().take(count).cloned());
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
    audit_config.fine_tuned = false;
    let trained = train_members(&audit_config, &audit_data, progress)?;
    Ok(AuditMembers {
        started,
        canaries,
        encoded,
        trained,
    })
}

impl AuditMembers {
    /// The token sequences the audit scores, each canary's prefix then its
    /// secret (what its cache key hashes).
    pub fn scored_tokens(&self) -> Vec<Vec<u32>> {
        self.encoded
            .iter()
            .map(|(prefix, secret)| [prefix.as_slice(), secret].concat())
            .collect()
    }

    /// Measures every mechanism's hit rate with the members read.
    pub fn score(
        self,
        config: &ExperimentConfig,
        plan: &CanaryPlan,
    ) -> Result<CanaryAudit, BenchError> {
        let Self {
            started,
            canaries,
            encoded,
            trained,
        } = self;
        let n = config.members;
        let model = Model::<Backend>::load(LoadOptions::path(&config.model, &Default::default()))?;
        let vocab = model.vocab_size();
        let runner = EnsembleRunner::new(model, &load_all(&trained.members)?)?;
        let layout = RowLayout::public_and_members(n);

        let queries: u64 = encoded.iter().map(|(_, s)| s.len() as u64).sum();
        let orders = Orders::dp_accounting_default();
        let mut cs = contenders(config, queries, vocab, false, &orders)?;
        let mut rng = PrivacyRng::from_seed(config.seed ^ 0xCA4A);
        // The last position's ensemble, whose buffers the next one reuses.
        let mut last: Option<Ensemble> = None;
        // The positive control: each canary's member, its log-probability of the
        // secret and whether greedy decoding reproduces it.
        let mut member_log10 = Vec::with_capacity(encoded.len());
        let mut member_extracted = Vec::with_capacity(encoded.len());
        for (k, (prefix, secret)) in encoded.iter().enumerate() {
            let tokens = [prefix.as_slice(), secret].concat();
            let steps = runner.score_block_full(&layout, &tokens)?;
            let holder = k % n;
            let (mut log_p, mut greedy) = (0.0f64, true);
            for (i, rows) in steps.iter().enumerate().skip(prefix.len() - 1) {
                let flat = rows.as_flat();
                let row = &flat[(holder + 1) * vocab..(holder + 2) * vocab];
                let truth = tokens[i + 1] as usize;
                log_p += f64::from(row[truth]);
                greedy &= row.iter().all(|&v| v <= row[truth]);
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
            member_log10.push(log_p / std::f64::consts::LN_10);
            member_extracted.push(greedy);
        }
        let mut results = vec![CanaryResult {
            mechanism: CANARY_MEMBER.into(),
            target_epsilon: None,
            hit_rate: member_log10.iter().map(|l| 10f64.powf(*l)).sum::<f64>()
                / member_log10.len().max(1) as f64,
            recall: member_extracted.iter().filter(|&&e| e).count() as f64
                / member_extracted.len().max(1) as f64,
            log10_probabilities: member_log10,
            extracted: member_extracted,
            spent_epsilon: None,
        }];
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
}

/// Checks, before anything is trained, that the tokenizer keeps every canary
/// of `plan` whole ([`check_whole`]).
pub fn check_canaries(
    plan: &CanaryPlan,
    seed: u64,
    tokenizer: &Tokenizer,
) -> Result<(), BenchError> {
    for (k, (prefix, secret)) in make_canaries(plan.canaries, seed).iter().enumerate() {
        let sentence = tokenizer.encode(&format!("{prefix}{secret}.\n"), false)?;
        check_whole(
            k,
            &tokenizer.encode(prefix, false)?,
            &tokenizer.encode(secret, false)?,
            &sentence,
        )?;
    }
    Ok(())
}

/// Checks that `sentence` (canary `k`'s training text) starts with the tokens
/// of its prefix followed by those of its secret, as the attack scores them.
pub fn check_whole(
    k: usize,
    prefix: &[u32],
    secret: &[u32],
    sentence: &[u32],
) -> Result<(), BenchError> {
    let joined = prefix.len() + secret.len();
    if sentence.len() < joined
        || sentence[..prefix.len()] != *prefix
        || sentence[prefix.len()..joined] != *secret
    {
        return Err(BenchError::Config(format!(
            "canary {k}: the tokenizer does not keep its prefix and secret apart in the \
             sentence (the attack would score tokens the members never saw)"
        )));
    }
    Ok(())
}

/// Training blocks of `len` tokens holding `repeats` whole copies of
/// `sentence` (rounded up to fill each block with as many as fit), each block
/// topped up to `len` with the first tokens of `filler` (the user's own text,
/// cycled). A sentence longer than a block (tiny test models) is repeated and
/// cut into blocks instead, at least one. Errors: an empty sentence, or no
/// filler when one is needed.
pub fn canary_blocks(
    sentence: &[u32],
    repeats: usize,
    len: usize,
    filler: &[u32],
) -> Result<Vec<Vec<u32>>, BenchError> {
    if sentence.is_empty() || len == 0 {
        return Err(BenchError::Config(
            "an empty canary sentence or block".into(),
        ));
    }
    if sentence.len() > len {
        let text = sentence.repeat(repeats.max(1));
        let mut blocks: Vec<Vec<u32>> = text.chunks_exact(len).map(<[u32]>::to_vec).collect();
        if blocks.is_empty() {
            blocks.push(text.iter().copied().cycle().take(len).collect());
        }
        return Ok(blocks);
    }
    let per_block = len / sentence.len();
    let pad = len - per_block * sentence.len();
    if pad > 0 && filler.is_empty() {
        return Err(BenchError::Config(
            "no text to top up the canary blocks with".into(),
        ));
    }
    let blocks = repeats.div_ceil(per_block);
    Ok((0..blocks)
        .map(|_| {
            let mut block: Vec<u32> = sentence.repeat(per_block);
            block.extend(filler.iter().copied().cycle().take(pad));
            block
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canary_blocks_hold_whole_sentences() {
        let sentence = [7, 8, 9];
        let blocks = canary_blocks(&sentence, 5, 8, &[1, 2]).unwrap();
        // Two sentences a block, three blocks for five repeats, topped up.
        assert_eq!(blocks, vec![vec![7, 8, 9, 7, 8, 9, 1, 2]; 3]);
        // Longer than a block: repeated and cut.
        assert_eq!(
            canary_blocks(&[1, 2, 3, 4, 5], 3, 4, &[]).unwrap(),
            vec![vec![1, 2, 3, 4], vec![5, 1, 2, 3], vec![4, 5, 1, 2]]
        );
        assert!(canary_blocks(&[], 1, 8, &[1]).is_err());
        assert!(canary_blocks(&sentence, 1, 8, &[]).is_err());
        assert_eq!(
            canary_blocks(&[1, 2], 2, 4, &[]).unwrap(),
            vec![vec![1, 2, 1, 2]]
        );
    }

    #[test]
    fn a_sentence_must_start_with_the_prefix_and_then_the_secret() {
        assert!(check_whole(0, &[1, 2], &[3, 4], &[1, 2, 3, 4, 5]).is_ok());
        // A merge across the join: the secret's first token is not there.
        assert!(check_whole(0, &[1, 2], &[3, 4], &[1, 9, 4, 5]).is_err());
        assert!(check_whole(0, &[1, 2], &[3, 4], &[1, 2, 3]).is_err());
    }
}
