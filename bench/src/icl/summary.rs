//! Per-seed results of the ICL experiment gathered into one row per method and ε:
//! the mean ROUGE-L F1 over seeds with its 95% interval ([`Interval`]), each seed's
//! value beside it.

use serde::{Deserialize, Serialize};

use super::common::IclResult;
use crate::error::BenchError;
use crate::stats::Interval;

/// One seed's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclSeed {
    /// The seed its randomness (draw of D, mechanisms' noise) derives from.
    pub seed: u64,
    /// One result per method and ε, in the order they ran.
    pub results: Vec<IclResult>,
}

/// One method at one ε over every seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclSummary {
    /// The method (see [`IclResult::method`]).
    pub method: String,
    /// Target ε (None for the baselines).
    pub target_epsilon: Option<f64>,
    /// ROUGE-L F1: mean over seeds of each seed's mean over its queries, with its
    /// 95% interval.
    pub rouge_l_f1: Interval,
    /// Each seed's mean ROUGE-L F1, in seed order.
    pub per_seed: Vec<f64>,
    /// The largest ε spent by any seed at δ, rounded up (None: no finite guarantee).
    pub spent_epsilon: Option<f64>,
    /// Tokens generated over all seeds.
    pub tokens: usize,
    /// Mean over the seeds that mixed of their mean λ (private diagnostic).
    pub mean_lambda: Option<f64>,
    /// The first seed's parameters.
    pub parameters: String,
    /// The first seed's example answers.
    pub examples: Vec<(String, String, String)>,
    /// Seconds over all seeds.
    pub seconds: f64,
}

/// Whether two target ε are the same (both None, or equal up to rounding).
pub(super) fn same_epsilon(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()),
        _ => false,
    }
}

/// One row per (method, ε), in the first seed's order. Errors: no seed, or a seed
/// without a (method, ε) of the first seed (the seeds must have run the same methods).
pub fn summarise(seeds: &[IclSeed]) -> Result<Vec<IclSummary>, BenchError> {
    let first = seeds
        .first()
        .ok_or_else(|| BenchError::Config("no seed to summarise".into()))?;
    first
        .results
        .iter()
        .map(|r| {
            let runs = seeds
                .iter()
                .map(|s| {
                    s.results
                        .iter()
                        .find(|x| {
                            x.method == r.method && same_epsilon(x.target_epsilon, r.target_epsilon)
                        })
                        .ok_or_else(|| {
                            BenchError::Config(format!(
                                "seed {} has no {} at ε {:?}",
                                s.seed, r.method, r.target_epsilon
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let per_seed: Vec<f64> = runs.iter().map(|x| x.rouge_l_f1).collect();
            let lambdas: Vec<f64> = runs.iter().filter_map(|x| x.mean_lambda).collect();
            Ok(IclSummary {
                method: r.method.clone(),
                target_epsilon: r.target_epsilon,
                rouge_l_f1: Interval::of(&per_seed)?,
                per_seed,
                spent_epsilon: runs
                    .iter()
                    .map(|x| x.spent_epsilon)
                    .try_fold(0.0f64, |acc, e| e.map(|e| acc.max(e))),
                tokens: runs.iter().map(|x| x.tokens).sum(),
                mean_lambda: (!lambdas.is_empty())
                    .then(|| lambdas.iter().sum::<f64>() / lambdas.len() as f64),
                parameters: r.parameters.clone(),
                examples: r.examples.clone(),
                seconds: runs.iter().map(|x| x.seconds).sum(),
            })
        })
        .collect()
}

/// A result row for tests.
#[cfg(test)]
pub(crate) fn test_result(
    method: &str,
    eps: Option<f64>,
    f1: f64,
    spent: Option<f64>,
) -> IclResult {
    IclResult {
        method: method.into(),
        target_epsilon: eps,
        rouge_l_f1: f1,
        per_query: vec![f1],
        spent_epsilon: spent,
        tokens: 10,
        mean_lambda: eps.map(|_| 0.5),
        examples: Vec::new(),
        parameters: String::new(),
        seconds: 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_gather_every_seed() {
        let seeds: Vec<IclSeed> = [(0.20, 0.9), (0.30, 1.0), (0.25, 0.8)]
            .iter()
            .enumerate()
            .map(|(s, &(f1, spent))| IclSeed {
                seed: s as u64,
                results: vec![
                    test_result("few-shot", None, f1 + 0.1, None),
                    test_result("dps-mozo+on", Some(1.0), f1, Some(spent)),
                ],
            })
            .collect();
        let rows = summarise(&seeds).unwrap();
        assert_eq!(rows.len(), 2);
        let on = &rows[1];
        assert_eq!(on.per_seed, [0.20, 0.30, 0.25]);
        assert!((on.rouge_l_f1.mean - 0.25).abs() < 1e-12);
        assert_eq!(on.rouge_l_f1.n, 3);
        assert!(on.rouge_l_f1.low < 0.25 && on.rouge_l_f1.high > 0.25);
        assert_eq!(on.spent_epsilon, Some(1.0), "the largest over seeds");
        assert_eq!((on.tokens, on.seconds), (30, 3.0));
        assert_eq!(rows[0].spent_epsilon, None, "no finite guarantee");
    }

    #[test]
    fn a_seed_missing_a_method_is_an_error() {
        let seeds = vec![
            IclSeed {
                seed: 0,
                results: vec![test_result("dps-mozo+on", Some(1.0), 0.2, Some(1.0))],
            },
            IclSeed {
                seed: 1,
                results: vec![test_result("dps-mozo+on", Some(2.0), 0.2, Some(1.0))],
            },
        ];
        assert!(summarise(&seeds).is_err());
        assert!(summarise(&[]).is_err());
    }

    #[test]
    fn epsilons_match_up_to_rounding_only() {
        assert!(same_epsilon(None, None));
        assert!(same_epsilon(Some(1.0), Some(1.0 + 1e-12)));
        assert!(!same_epsilon(Some(1.0), Some(1.01)));
        assert!(!same_epsilon(Some(1.0), None));
    }
}
