//! Membership inference against in-context learning, with the protocol of
//! DPS-MOZO (arXiv:2501.19287), §5.5 and App. D.1, after Duan et al. (2024) and
//! Yeom et al. (2018).
//!
//! One repetition takes a set of m examples. Attack j puts example j alone in the
//! private set (one demonstration, one shot) and scores every example i as a query:
//! the score is the probability the method's next-token distributions give to i's
//! reference definition, as the mean over its tokens of the probability of the true
//! token (teacher forcing; 0 off the method's support). Example j's own score is the
//! member score, the m − 1 others are non-member scores. Every example is the member
//! of exactly one attack (App. D.1.3, step 1, so members and non-members are equally
//! hard on average), and the AUC-ROC of the m member scores against the m(m − 1)
//! non-member scores pooled over the m attacks is the repetition's AUC. Repetitions
//! use disjoint example sets ([`super::split`]); the report gives the mean AUC with
//! its 95% interval over repetitions ([`Interval`]). 0.5 is chance; the non-private
//! few-shot (ε = ∞) should score well above it, since the member query finds its own
//! answer in the prompt.
//!
//! Cost: the model's forwards do not depend on the method or on ε. The zero-shot
//! prefix and the m one-shot prefixes of a set are prefilled once, in one padded
//! batch; for query i a copy of that batch is fed the query, then the reference
//! token by token through the KV cache; at each position
//! every method is applied to the same rows — restricted to the zero-shot top-k
//! support, the only entries DPS-MOZO's output depends on — and the rows are dropped
//! before the next query.

use std::time::Instant;

use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::{DpsMozoConfig, ZeroShot, dps_mozo_output, few_shot_output};
use privmix_models::Tokenizer;
use serde::{Deserialize, Serialize};

use super::common::{HEADER, demo_text, query_text, tokens};
use super::source::{IclDecoder, IclRunner};
use super::wordnet::Definition;
use crate::error::BenchError;
use crate::stats::Interval;

/// One method's attack result over every repetition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MiaResult {
    /// `zero-shot`, `few-shot` (one shot, no privacy) or `dps-mozo+on`.
    pub method: String,
    /// The ε whose DPS-MOZO+On radius was used (None: no privacy, or zero-shot).
    pub target_epsilon: Option<f64>,
    /// The projection radius (DPS-MOZO).
    pub radius: Option<f64>,
    /// AUC-ROC (a fraction in [0, 1]): mean and 95% interval over repetitions.
    pub auc: Interval,
    /// Each repetition's AUC-ROC.
    pub per_repetition: Vec<f64>,
    /// Each repetition's member scores, one per attack.
    pub members: Vec<Vec<f64>>,
}

/// The attack's results and what it cost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MiaRun {
    /// Repetitions (example sets).
    pub repetitions: usize,
    /// Examples m per repetition.
    pub examples: usize,
    /// One result per method (and ε).
    pub results: Vec<MiaResult>,
    /// Seconds in model forwards (shared by every method and ε).
    pub forward_seconds: f64,
    /// Seconds applying the methods to the forwards' rows.
    pub mixing_seconds: f64,
}

/// AUC-ROC: the probability that a member scores above a non-member, ties
/// counting one half (the Mann–Whitney statistic). Computed by sorting, in
/// O((m + n) log(m + n)). Errors: an empty side or a NaN score.
pub fn auc(members: &[f64], non_members: &[f64]) -> Result<f64, BenchError> {
    if members.is_empty() || non_members.is_empty() {
        return Err(BenchError::Config(format!(
            "an AUC needs members and non-members ({} and {})",
            members.len(),
            non_members.len()
        )));
    }
    if members.iter().chain(non_members).any(|x| x.is_nan()) {
        return Err(BenchError::Config("an attack score is NaN".into()));
    }
    let mut sorted = non_members.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut wins = 0.0;
    for &m in members {
        let below = sorted.partition_point(|&n| n < m);
        let ties = sorted[below..].partition_point(|&n| n <= m);
        wins += below as f64 + 0.5 * ties as f64;
    }
    Ok(wins / (members.len() as f64 * non_members.len() as f64))
}

/// The methods under attack, and how each turns the zero-shot row and one one-shot
/// row (both restricted to the zero-shot support) into log-probabilities on it.
#[derive(Debug, Clone, Copy)]
enum Method {
    Zero,
    FewShot,
    DpsMozo { epsilon: f64, radius: f64 },
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Zero => "zero-shot",
            Method::FewShot => "few-shot",
            Method::DpsMozo { .. } => "dps-mozo+on",
        }
    }

    /// Log-probabilities over the support (same order as `zero`), given rows whose
    /// entries are the support's logits, largest zero-shot logit first.
    fn log_probs(self, zero: &[f64], one: &[f64]) -> Result<Vec<f64>, BenchError> {
        let k = zero.len();
        let out = match self {
            Method::Zero => ZeroShot::new(k)?.output(zero)?,
            Method::FewShot => few_shot_output(&DpsMozoConfig::new(1, k, 0.0)?, zero, &[one])?,
            Method::DpsMozo { radius, .. } => {
                dps_mozo_output(&DpsMozoConfig::new(1, k, radius)?, zero, &[one])?
            }
        };
        // The output's support is the given one, possibly reordered on ties.
        let mut lp = vec![f64::NEG_INFINITY; k];
        for (&s, &l) in out.support.iter().zip(&out.log_probs) {
            lp[s] = l;
        }
        Ok(lp)
    }
}

/// The zero-shot prefix (`header`) and the m one-shot prefixes (`header`, then
/// demonstration j) of one example set, prefilled in one batch; every query of the
/// set continues a copy of it.
fn prefixes<'a>(
    runner: &'a IclRunner,
    tokenizer: &Tokenizer,
    examples: &[Definition],
) -> Result<IclDecoder<'a>, BenchError> {
    let header = tokens(tokenizer, HEADER)?;
    let mut prompts = vec![header.clone()];
    for d in examples {
        prompts.push([header.as_slice(), &tokens(tokenizer, &demo_text(d))?].concat());
    }
    let mut decoder = runner.decoder(RowLayout::public_only(prompts.len()))?;
    decoder.prefill_rows(&prompts)?;
    Ok(decoder)
}

/// Sums, over the reference's positions, of each method's probability of the true
/// token for query `i` under each attack j: `scores[method][j]`. `base` holds the
/// set's prefixes ([`prefixes`]).
#[allow(clippy::too_many_arguments)]
fn score_query(
    base: &IclDecoder<'_>,
    tokenizer: &Tokenizer,
    examples: &[Definition],
    i: usize,
    top_k: usize,
    methods: &[Method],
    timing: &mut (f64, f64),
) -> Result<Vec<Vec<f64>>, BenchError> {
    let query = tokens(tokenizer, &query_text(&examples[i].word))?;
    let target = tokens(tokenizer, &format!(" {}", examples[i].gloss))?;
    if target.is_empty() {
        return Err(BenchError::Config(format!(
            "the definition of {:?} encodes to no token",
            examples[i].word
        )));
    }
    let m = examples.len();
    let zero_shot = ZeroShot::new(top_k)?;
    let mut sums = vec![vec![0.0; m]; methods.len()];
    let t = Instant::now();
    let mut decoder = base.clone();
    let mut rows = decoder.prefill(&query)?;
    timing.0 += t.elapsed().as_secs_f64();
    for (pos, &true_token) in target.iter().enumerate() {
        let t = Instant::now();
        let zero_full: Vec<f64> = rows.row(0).iter().map(|&x| f64::from(x)).collect();
        let support = zero_shot.output(&zero_full)?.support;
        let gathered = |r: usize| -> Vec<f64> {
            let row = rows.row(r);
            support.iter().map(|&s| f64::from(row[s])).collect()
        };
        let zero = gathered(0);
        let at = support.iter().position(|&s| s == true_token as usize);
        if let Some(at) = at {
            for j in 0..m {
                let one = gathered(1 + j);
                for (method, sum) in methods.iter().zip(sums.iter_mut()) {
                    sum[j] += method.log_probs(&zero, &one)?[at].exp();
                }
            }
        }
        timing.1 += t.elapsed().as_secs_f64();
        if pos + 1 < target.len() {
            let t = Instant::now();
            rows = decoder.next_log_probs(true_token)?;
            timing.0 += t.elapsed().as_secs_f64();
        }
    }
    let n = target.len() as f64;
    Ok(sums
        .into_iter()
        .map(|s| s.into_iter().map(|x| x / n).collect())
        .collect())
}

/// Runs the attack on each example set of `sets` (m ≥ 2 each, one repetition per
/// set) for zero-shot, the non-private few-shot, and DPS-MOZO+On at each
/// `(ε, radius)`; `progress` is told after each query.
pub fn membership_inference(
    runner: &IclRunner,
    tokenizer: &Tokenizer,
    sets: &[Vec<Definition>],
    top_k: usize,
    radii: &[(f64, f64)],
    mut progress: impl FnMut(),
) -> Result<MiaRun, BenchError> {
    let m = sets.first().map_or(0, Vec::len);
    if m < 2 || sets.iter().any(|s| s.len() != m) {
        return Err(BenchError::Config(format!(
            "membership inference needs example sets of one size m ≥ 2 (sizes {:?})",
            sets.iter().map(Vec::len).collect::<Vec<_>>()
        )));
    }
    let mut methods = vec![Method::Zero, Method::FewShot];
    methods.extend(
        radii
            .iter()
            .map(|&(epsilon, radius)| Method::DpsMozo { epsilon, radius }),
    );
    // per_rep[method][repetition] and members[method][repetition][j].
    let mut per_rep = vec![Vec::new(); methods.len()];
    let mut members = vec![Vec::new(); methods.len()];
    let mut timing = (0.0, 0.0);
    for examples in sets {
        // scores[method][j][i]: example i's score under attack j.
        let mut scores = vec![vec![vec![0.0; m]; m]; methods.len()];
        let t = Instant::now();
        let base = prefixes(runner, tokenizer, examples)?;
        timing.0 += t.elapsed().as_secs_f64();
        for i in 0..m {
            let by_attack =
                score_query(&base, tokenizer, examples, i, top_k, &methods, &mut timing)?;
            for (method, s) in by_attack.into_iter().enumerate() {
                for (j, x) in s.into_iter().enumerate() {
                    scores[method][j][i] = x;
                }
            }
            progress();
        }
        for (method, attacks) in scores.iter().enumerate() {
            let (mut mem, mut non) = (Vec::with_capacity(m), Vec::new());
            for (j, row) in attacks.iter().enumerate() {
                for (i, &x) in row.iter().enumerate() {
                    if i == j { mem.push(x) } else { non.push(x) }
                }
            }
            per_rep[method].push(auc(&mem, &non)?);
            members[method].push(mem);
        }
    }
    let results = methods
        .iter()
        .zip(per_rep)
        .zip(members)
        .map(|((method, per_repetition), members)| {
            let (target_epsilon, radius) = match *method {
                Method::DpsMozo { epsilon, radius } => (Some(epsilon), Some(radius)),
                _ => (None, None),
            };
            Ok(MiaResult {
                method: method.name().into(),
                target_epsilon,
                radius,
                auc: Interval::of(&per_repetition)?,
                per_repetition,
                members,
            })
        })
        .collect::<Result<_, BenchError>>()?;
    Ok(MiaRun {
        repetitions: sets.len(),
        examples: m,
        results,
        forward_seconds: timing.0,
        mixing_seconds: timing.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AUC by its definition: every (member, non-member) pair, ties ½.
    fn auc_by_pairs(members: &[f64], non: &[f64]) -> f64 {
        let mut wins = 0.0;
        for &m in members {
            for &n in non {
                wins += if m > n {
                    1.0
                } else if m == n {
                    0.5
                } else {
                    0.0
                };
            }
        }
        wins / (members.len() * non.len()) as f64
    }

    #[test]
    fn auc_is_the_mann_whitney_probability() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]).unwrap(), 1.0);
        assert_eq!(auc(&[1.0], &[2.0, 3.0]).unwrap(), 0.0);
        assert_eq!(auc(&[2.0], &[2.0]).unwrap(), 0.5);
        // 2 beats 1, ties 2, loses to 3: (1 + 0.5 + 0) / 3.
        assert!((auc(&[2.0], &[1.0, 2.0, 3.0]).unwrap() - 0.5).abs() < 1e-15);
        assert_eq!(
            auc(&[f64::NEG_INFINITY], &[f64::NEG_INFINITY, 0.0]).unwrap(),
            0.25
        );
        // One member among m − 1 = 3 non-members per attack, m = 4 attacks: the
        // protocol's shape. Members 0.9, 0.5, 0.2, 0.7 against twelve non-members.
        let members = [0.9, 0.5, 0.2, 0.7];
        let non = [0.1, 0.3, 0.5, 0.6, 0.2, 0.2, 0.8, 0.0, 0.4, 0.7, 0.05, 0.95];
        // By hand: 0.9 beats 11 (all but 0.95), 0.5 beats 7 and ties 1, 0.2 beats 3
        // and ties 2, 0.7 beats 9 and ties 1: (11 + 7.5 + 4 + 9.5) / 48 = 32 / 48.
        assert!((auc(&members, &non).unwrap() - 32.0 / 48.0).abs() < 1e-15);
    }

    #[test]
    fn auc_by_sorting_matches_the_pairwise_definition() {
        // A deterministic pseudo-random sweep with many ties (values on a grid).
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 17) as f64 / 16.0
        };
        for m in [1, 2, 5, 41] {
            let members: Vec<f64> = (0..m).map(|_| next()).collect();
            let non: Vec<f64> = (0..m * (m.max(2) - 1)).map(|_| next()).collect();
            let (a, b) = (auc(&members, &non).unwrap(), auc_by_pairs(&members, &non));
            assert!((a - b).abs() < 1e-12, "m {m}: {a} vs {b}");
        }
    }

    #[test]
    fn bad_scores_are_errors() {
        assert!(auc(&[], &[1.0]).is_err());
        assert!(auc(&[1.0], &[]).is_err());
        assert!(auc(&[f64::NAN], &[1.0]).is_err());
        assert!(auc(&[1.0], &[0.5, f64::NAN]).is_err());
    }

    #[test]
    fn methods_on_the_support_are_normalised_and_zero_shot_ignores_the_demo() {
        let zero = [2.0, 1.0, 0.5, -1.0];
        let one = [0.0, 3.0, 0.0, 0.0];
        let lp0 = Method::Zero.log_probs(&zero, &one).unwrap();
        let lp0b = Method::Zero.log_probs(&zero, &zero).unwrap();
        assert_eq!(lp0, lp0b);
        for method in [
            Method::Zero,
            Method::FewShot,
            Method::DpsMozo {
                epsilon: 1.0,
                radius: 0.1,
            },
        ] {
            let lp = method.log_probs(&zero, &one).unwrap();
            let total: f64 = lp.iter().map(|l| l.exp()).sum();
            assert!((total - 1.0).abs() < 1e-12, "{method:?}");
        }
        // The demo favours token 1: few-shot gives it more than zero-shot does, and
        // DPS-MOZO with a small radius lies in between.
        let few = Method::FewShot.log_probs(&zero, &one).unwrap()[1];
        let dp = Method::DpsMozo {
            epsilon: 1.0,
            radius: 0.1,
        }
        .log_probs(&zero, &one)
        .unwrap()[1];
        assert!(lp0[1] < dp && dp < few, "{} {dp} {few}", lp0[1]);
        // Radius 0: λ = 0, DPS-MOZO is the zero-shot output.
        let dp0 = Method::DpsMozo {
            epsilon: 1.0,
            radius: 0.0,
        }
        .log_probs(&zero, &one)
        .unwrap();
        for (a, b) in dp0.iter().zip(&lp0) {
            assert!((a - b).abs() < 1e-12);
        }
    }
}
