//! One long deployment at the largest target ε: the AdaPMixED paper's
//! (arXiv:2410.02016, Table 1) 99,840-query setting, where a data-independent
//! account spread over that many queries leaves PMixED almost nothing per query
//! and AdaPMixED's screening is meant to keep its budget for the queries that
//! need it.
//!
//! It is one deployment with one budget, so it has no seeds to repeat. Its
//! interval comes from the deployment itself: its blocks, in order, are cut into
//! [`CHUNKS`] consecutive runs, each run's perplexity is one sample, and a
//! mechanism's figure is their geometric mean with the 95% t-interval
//! ([`Interval::geometric`]). The runs share the mechanisms' state (an account
//! spent earlier constrains a later run), so the interval describes the spread
//! over the deployment's queries, not over independent deployments.

use serde::{Deserialize, Serialize};

use super::contenders::MechanismResult;
use crate::error::BenchError;
use crate::stats::Interval;

/// Consecutive runs of blocks a long deployment is cut into for its interval.
pub const CHUNKS: usize = 8;

/// One mechanism of the long deployment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LongRow {
    /// Mechanism name (as in the seeds' results).
    pub mechanism: String,
    /// Target ε (None: the public model, the non-private ensemble).
    pub target_epsilon: Option<f64>,
    /// exp(mean NLL) over all the deployment's queries.
    pub perplexity: f64,
    /// Each chunk's perplexity, in deployment order.
    pub chunk_perplexities: Vec<f64>,
    /// Their geometric mean with its 95% interval (None: infinite in a chunk).
    pub interval: Option<Interval>,
    /// ε spent at δ after every query, rounded up (None: no finite guarantee).
    pub spent_epsilon: Option<f64>,
    /// Shares of the queries answered privately, screened, and after the budget
    /// ran out.
    pub shares: (f64, f64, f64),
    /// The parameters the mechanism ran with.
    pub parameters: String,
}

/// What the long deployment measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LongDeployment {
    /// Queries answered.
    pub queries: u64,
    /// Held-out blocks read (the last one possibly cut short).
    pub blocks: usize,
    /// Every mechanism's figures.
    pub rows: Vec<LongRow>,
}

impl LongDeployment {
    /// Summarises the deployment's results; `block_queries` is each block's
    /// number of queries, in order.
    pub fn summarise(
        results: &[MechanismResult],
        block_queries: &[u64],
    ) -> Result<Self, BenchError> {
        let queries: u64 = block_queries.iter().sum();
        let chunk_of = chunks(block_queries.len(), CHUNKS);
        let rows = results
            .iter()
            .map(|r| {
                if r.block_perplexities.len() != block_queries.len() {
                    return Err(BenchError::Config(format!(
                        "long deployment: {} scored {} blocks of {}",
                        r.mechanism,
                        r.block_perplexities.len(),
                        block_queries.len()
                    )));
                }
                let chunk_perplexities =
                    chunk_perplexities(&r.block_perplexities, block_queries, &chunk_of);
                let total = r.queries.max(1) as f64;
                Ok(LongRow {
                    mechanism: r.mechanism.clone(),
                    target_epsilon: r.target_epsilon,
                    perplexity: r.perplexity,
                    interval: Interval::geometric(&chunk_perplexities).ok(),
                    chunk_perplexities,
                    spent_epsilon: r.spent_epsilon,
                    shares: (
                        r.private_answers as f64 / total,
                        r.screened as f64 / total,
                        r.stopped as f64 / total,
                    ),
                    parameters: r.parameters.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            queries,
            blocks: block_queries.len(),
            rows,
        })
    }

    /// The row of `mechanism` at `target`.
    pub fn row(&self, mechanism: &str, target: Option<f64>) -> Option<&LongRow> {
        self.rows
            .iter()
            .find(|r| r.mechanism == mechanism && r.target_epsilon == target)
    }
}

/// The chunk of each of `blocks` blocks: `k` consecutive runs whose sizes differ
/// by at most one (fewer runs when there are fewer blocks).
fn chunks(blocks: usize, k: usize) -> Vec<usize> {
    let k = k.min(blocks).max(1);
    (0..blocks).map(|b| b * k / blocks.max(1)).collect()
}

/// Each chunk's perplexity: exp of its queries' mean NLL, from the blocks'
/// perplexities weighted by their query counts.
fn chunk_perplexities(block_ppl: &[f64], block_queries: &[u64], chunk_of: &[usize]) -> Vec<f64> {
    let k = chunk_of.last().map_or(0, |&c| c + 1);
    let mut nll = vec![0.0f64; k];
    let mut count = vec![0u64; k];
    for ((&ppl, &q), &c) in block_ppl.iter().zip(block_queries).zip(chunk_of) {
        nll[c] += ppl.ln() * q as f64;
        count[c] += q;
    }
    nll.iter()
        .zip(&count)
        .map(|(&s, &n)| (s / n.max(1) as f64).exp())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(mechanism: &str, block_ppl: Vec<f64>, queries: u64) -> MechanismResult {
        MechanismResult {
            mechanism: mechanism.into(),
            target_epsilon: Some(8.0),
            perplexity: 0.0,
            block_perplexities: block_ppl,
            greedy_hits: Vec::new(),
            screening_epsilon: None,
            queries,
            private_answers: queries / 2,
            screened: queries / 4,
            stopped: 0,
            spent_epsilon: Some(7.5),
            spent_trace: Vec::new(),
            lambda_trace: Vec::new(),
            parameters: String::new(),
            seconds: 0.0,
        }
    }

    #[test]
    fn chunks_are_consecutive_and_balanced() {
        assert_eq!(chunks(10, 4), vec![0, 0, 0, 1, 1, 2, 2, 2, 3, 3]);
        assert_eq!(chunks(3, 8), vec![0, 1, 2]);
        assert_eq!(chunks(16, 8).iter().filter(|&&c| c == 7).count(), 2);
    }

    #[test]
    fn a_chunk_is_the_perplexity_of_its_queries() {
        // Two blocks in one chunk: 3 queries at NLL ln 2, 1 query at NLL ln 16;
        // the chunk's mean NLL is (3 ln 2 + 4 ln 2) / 4 = (7/4) ln 2.
        let got = chunk_perplexities(&[2.0, 16.0], &[3, 1], &[0, 0]);
        assert!((got[0] - 2f64.powf(1.75)).abs() < 1e-12, "{got:?}");
    }

    #[test]
    fn the_summary_has_an_interval_over_chunks() {
        let block_ppl: Vec<f64> = (0..16).map(|b| 20.0 + (b % 3) as f64).collect();
        let queries = vec![127u64; 16];
        let d =
            LongDeployment::summarise(&[result("pmixed", block_ppl, 16 * 127)], &queries).unwrap();
        assert_eq!((d.queries, d.blocks), (16 * 127, 16));
        let row = d.row("pmixed", Some(8.0)).unwrap();
        assert_eq!(row.chunk_perplexities.len(), CHUNKS);
        let i = row.interval.unwrap();
        assert!(i.low <= i.mean && i.mean <= i.high && i.low >= 20.0 && i.high <= 22.0);
        assert_eq!(row.shares, (0.5, 0.25, 0.0));
        let short = LongDeployment::summarise(&[result("x", vec![1.0], 1)], &queries);
        assert!(short.is_err());
    }
}
