//! Membership inference against in-context learning (DPS-MOZO, arXiv:2501.19287, §5.5 and
//! App. D.1, after Duan et al. 2024 and Yeom et al. 2018).
//!
//! Over m examples, attack `j` puts example j alone in the private set (one
//! demonstration, one shot) and scores every example i as a query: the score is
//! the log-probability the method's next-token distributions give to i's
//! reference definition, token by token (teacher forcing). Example j's own score
//! is the member score, the m − 1 others are non-member scores; the AUC-ROC of
//! members against non-members pooled over all m attacks is reported. 0.5 is
//! chance; the non-private one-shot should score well above it, since the member
//! query finds its own answer in the prompt.
//!
//! The per-position logits are computed once — for query i, one padded batch of
//! the zero-shot prompt and the m one-shot prompts, prefilled, then fed the
//! reference token by token through the KV cache — and every method is applied
//! to the same logits.

use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::{DpsMozoConfig, ZeroShot, dps_mozo_output, few_shot_output};
use privmix_models::Tokenizer;
use serde::{Deserialize, Serialize};

use super::common::{HEADER, demo_text, query_text, tokens};
use super::source::IclRunner;
use super::wordnet::Definition;
use crate::error::BenchError;

/// One method's attack result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MiaResult {
    /// `zero-shot`, `one-shot (no privacy)` or `dps-mozo`.
    pub method: String,
    /// The ε whose DPS-MOZO+On radius was used (None for the baselines).
    pub target_epsilon: Option<f64>,
    /// The projection radius (DPS-MOZO).
    pub radius: Option<f64>,
    /// AUC-ROC of member against non-member scores.
    pub auc: f64,
    /// Member scores, one per attack.
    pub members: Vec<f64>,
}

/// AUC-ROC: the probability that a member scores above a non-member, ties
/// counting one half (the Mann–Whitney statistic).
pub fn auc(members: &[f64], non_members: &[f64]) -> f64 {
    let mut wins = 0.0;
    for &m in members {
        for &n in non_members {
            wins += if m > n {
                1.0
            } else if m == n {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / (members.len() * non_members.len()).max(1) as f64
}

/// Per-position rows of one query: the zero-shot row and each demo's one-shot
/// row, at each reference position.
struct QueryRows {
    target: Vec<u32>,
    /// `[position][row]` log-probabilities (row 0 zero-shot, row 1 + j demo j).
    rows: Vec<Vec<Vec<f64>>>,
}

fn query_rows(
    runner: &IclRunner,
    tokenizer: &Tokenizer,
    examples: &[Definition],
    i: usize,
) -> Result<QueryRows, BenchError> {
    let enc = |t: &str| tokens(tokenizer, t);
    let header = enc(HEADER)?;
    let query = enc(&query_text(&examples[i].word))?;
    let target = enc(&format!(" {}", examples[i].gloss))?;
    let mut prompts = vec![[header.as_slice(), &query].concat()];
    for d in examples {
        let demo = enc(&demo_text(d))?;
        prompts.push([header.as_slice(), &demo, &query].concat());
    }
    let mut decoder = runner.decoder(RowLayout::public_only(prompts.len()))?;
    let to_rows = |lp: &privmix_ensemble::rows::LogProbRows| -> Vec<Vec<f64>> {
        (0..lp.rows())
            .map(|r| lp.row(r).iter().map(|&x| f64::from(x)).collect())
            .collect()
    };
    let mut rows = vec![to_rows(&decoder.prefill_rows(&prompts)?)];
    for &t in &target[..target.len().saturating_sub(1)] {
        rows.push(to_rows(&decoder.next_log_probs(t)?));
    }
    Ok(QueryRows { target, rows })
}

/// A method's output for `(zero-shot logits, one-shot logits)`.
type OutputFn = dyn Fn(&[f64], &[f64]) -> Result<privmix_mechanisms::IclOutput, BenchError>;

/// Mean over positions of `p(target)` under `output` (0 off the support).
fn sequence_score(q: &QueryRows, demo: usize, output: &OutputFn) -> Result<f64, BenchError> {
    let mut total = 0.0;
    for (pos, rows) in q.rows.iter().enumerate() {
        let out = output(&rows[0], &rows[1 + demo])?;
        let t = q.target[pos] as usize;
        total += out
            .support
            .iter()
            .position(|&s| s == t)
            .map_or(0.0, |j| out.log_probs[j].exp());
    }
    Ok(total / q.rows.len().max(1) as f64)
}

/// Runs the attack on `examples` for the zero-shot and one-shot baselines and
/// DPS-MOZO at each `(ε, radius)`.
pub fn membership_inference(
    runner: &IclRunner,
    tokenizer: &Tokenizer,
    examples: &[Definition],
    top_k: usize,
    radii: &[(f64, f64)],
) -> Result<Vec<MiaResult>, BenchError> {
    let m = examples.len();
    if m < 2 {
        return Err(BenchError::Config(
            "membership inference needs at least 2 examples".into(),
        ));
    }
    let queries = (0..m)
        .map(|i| query_rows(runner, tokenizer, examples, i))
        .collect::<Result<Vec<_>, _>>()?;
    let zero = ZeroShot::new(top_k)?;
    let one_shot = DpsMozoConfig::new(1, top_k, 0.0)?;
    type Method = Box<OutputFn>;
    let mut methods: Vec<(String, Option<f64>, Option<f64>, Method)> = vec![
        (
            "zero-shot".into(),
            None,
            None,
            Box::new(move |z: &[f64], _: &[f64]| Ok(zero.output(z)?)),
        ),
        (
            "one-shot (no privacy)".into(),
            None,
            None,
            Box::new(move |z: &[f64], o: &[f64]| Ok(few_shot_output(&one_shot, z, &[o])?)),
        ),
    ];
    for &(eps, radius) in radii {
        let config = DpsMozoConfig::new(1, top_k, radius)?;
        methods.push((
            "dps-mozo".into(),
            Some(eps),
            Some(radius),
            Box::new(move |z: &[f64], o: &[f64]| Ok(dps_mozo_output(&config, z, &[o])?)),
        ));
    }
    let mut results = Vec::new();
    for (method, target_epsilon, radius, output) in methods {
        let (mut members, mut others) = (Vec::new(), Vec::new());
        for j in 0..m {
            for (i, q) in queries.iter().enumerate() {
                let score = sequence_score(q, j, &*output)?;
                if i == j {
                    members.push(score);
                } else {
                    others.push(score);
                }
            }
        }
        results.push(MiaResult {
            method,
            target_epsilon,
            radius,
            auc: auc(&members, &others),
            members,
        });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::auc;

    #[test]
    fn auc_is_the_mann_whitney_probability() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]), 1.0);
        assert_eq!(auc(&[1.0], &[2.0, 3.0]), 0.0);
        assert_eq!(auc(&[2.0], &[2.0]), 0.5);
        // 2 beats 1, ties 2, loses to 3: (1 + 0.5 + 0) / 3.
        assert!((auc(&[2.0], &[1.0, 2.0, 3.0]) - 0.5).abs() < 1e-15);
        assert_eq!(auc(&[f64::NEG_INFINITY], &[f64::NEG_INFINITY, 0.0]), 0.25);
    }
}
