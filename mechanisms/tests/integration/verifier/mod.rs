//! An exact transcript verifier, independent of the mechanisms' code.
//!
//! What it checks: for a mechanism run as a user runs it (T ≤ 3 tokens, each query's
//! distributions chosen adaptively from the tokens released so far, against an
//! unbudgeted account or an (ε, δ) budget that runs out mid-run), the law of
//! everything the run publishes — a *transcript*: each step's token, refusal or error
//! kind, the charge it reports and the account's spent curve after it (`engine.rs`) —
//! on a dataset and on each neighbour, and `D_α(law ‖ law')` in both directions
//! against the total the account realised (the same on every transcript).
//!
//! Independence: laws are built from what the mechanism RELEASES through its public
//! entry point, never from its diagnostics. The verifier enumerates the mechanism's
//! coins (Poisson draws: a seed per subset, `pmixed.rs`; screening noise: AdaPMixED's
//! audit entry point), requires each released distribution to be its own
//! recomputation (averages of one-member releases, each checked on the segment from
//! p₀ and inside the ball with this module's divergence), checks the reports against
//! the releases, and computes divergences here, in f64 log space. The samplers the
//! laws assume exact are tested against their laws in `verify_samplers.rs`
//! (`stats.rs`). What it covers is tabled in `COVERAGE.md` beside this file.
//!
//! Error bound: laws have at most a few hundred outcomes built from products of T ≤ 3
//! probabilities each a sum of ≤ 2^8 products; every entry carries a relative error
//! below 1e-13, so a computed `D_α` is within `1e-12·(1 + D_α)` of the divergence of
//! the exact laws for the orders used (≤ 64). Assertions allow exactly that slack.

#![allow(dead_code)]

use std::collections::BTreeMap;

pub mod engine;
pub mod pmixed;
pub mod stats;
pub mod submix;

pub use engine::{AccountKind, Acct, Branch, Law, assert_realised, coverage_table, run_law};

/// The relative slack of the verifier's own f64 arithmetic (module docs).
pub const SLACK: f64 = 1e-12;

/// Orders the verifier checks (the account's orders in the tests).
pub const ORDERS: [f64; 8] = [1.5, 2.0, 3.0, 4.0, 8.0, 12.0, 16.0, 18.0];

/// `ln Σ_x exp(terms_x)`, stable.
fn log_sum_exp(terms: &[f64]) -> f64 {
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max.is_infinite() {
        return max;
    }
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}

/// `D_α(P ‖ Q)` of two finite laws given as (outcome → probability), each divided by
/// its own total (so rounding in the totals does not bias the result): +∞ where P has
/// mass Q lacks.
pub fn renyi<K: Ord>(p: &BTreeMap<K, f64>, q: &BTreeMap<K, f64>, alpha: f64) -> f64 {
    let sp: f64 = p.values().sum();
    let sq: f64 = q.values().sum();
    let mut terms = Vec::with_capacity(p.len());
    for (k, &pk) in p {
        if pk <= 0.0 {
            continue;
        }
        let qk = q.get(k).copied().unwrap_or(0.0);
        if qk <= 0.0 {
            return f64::INFINITY;
        }
        terms.push(alpha * (pk / sp).ln() + (1.0 - alpha) * (qk / sq).ln());
    }
    (log_sum_exp(&terms) / (alpha - 1.0)).max(0.0)
}

/// `D_α(p ‖ q)` of two probability vectors (the verifier's own kernel).
pub fn renyi_vec(p: &[f64], q: &[f64], alpha: f64) -> f64 {
    let pm: BTreeMap<usize, f64> = p.iter().copied().enumerate().collect();
    let qm: BTreeMap<usize, f64> = q.iter().copied().enumerate().collect();
    renyi(&pm, &qm, alpha)
}

/// `max(D_α(p‖q), D_α(q‖p))`.
pub fn dsym_vec(p: &[f64], q: &[f64], alpha: f64) -> f64 {
    renyi_vec(p, q, alpha).max(renyi_vec(q, p, alpha))
}

/// `λ·p + (1 − λ)·p₀`, entry by entry.
pub fn mix(lambda: f64, p: &[f64], p0: &[f64]) -> Vec<f64> {
    p.iter()
        .zip(p0)
        .map(|(&x, &y)| lambda * x + (1.0 - lambda) * y)
        .collect()
}

/// A small deterministic generator (SplitMix64), for adaptive query tables.
#[derive(Debug, Clone)]
pub struct Mix64(pub u64);

impl Mix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Distribution shapes the adversarial search draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Uniform-ish random weights.
    Random,
    /// One token holds all but ~1e-9 of the mass (near-deterministic).
    Peaked,
    /// Some exact zeros.
    Sparse,
    /// Some masses near the bottom of f64 (1e-300).
    Tiny,
}

pub const SHAPES: [Shape; 4] = [Shape::Random, Shape::Peaked, Shape::Sparse, Shape::Tiny];

/// A distribution over `v` tokens of the given shape.
pub fn distribution(rng: &mut Mix64, v: usize, shape: Shape) -> Vec<f64> {
    let mut w: Vec<f64> = (0..v).map(|_| rng.unit() + 1e-3).collect();
    match shape {
        Shape::Random => {}
        Shape::Peaked => {
            let top = (rng.next_u64() % v as u64) as usize;
            w.iter_mut().for_each(|x| *x *= 1e-9);
            w[top] = 1.0;
        }
        Shape::Sparse => {
            let keep = (rng.next_u64() % v as u64) as usize;
            for (i, x) in w.iter_mut().enumerate() {
                if i != keep && rng.unit() < 0.5 {
                    *x = 0.0;
                }
            }
        }
        Shape::Tiny => {
            let keep = (rng.next_u64() % v as u64) as usize;
            for (i, x) in w.iter_mut().enumerate() {
                if i != keep && rng.unit() < 0.5 {
                    *x = 1e-300;
                }
            }
        }
    }
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

/// One context's public distribution and member distributions.
pub type Row = (Vec<f64>, Vec<Vec<f64>>);

/// An adaptive query table: the public and member distributions for every context
/// (the tokens released so far), V tokens, up to `depth` released tokens.
#[derive(Debug, Clone)]
pub struct Table {
    pub vocab: usize,
    /// context → (public, members[i]).
    pub rows: BTreeMap<Vec<u32>, Row>,
}

impl Table {
    /// Every context of length < `depth` over `vocab` tokens, with distributions drawn
    /// from `seed` (public shape and member shapes chosen per context).
    pub fn random(seed: u64, vocab: usize, members: usize, depth: usize) -> Self {
        let mut rng = Mix64(seed);
        let mut rows = BTreeMap::new();
        for context in contexts(vocab, depth) {
            let shape = |rng: &mut Mix64| SHAPES[(rng.next_u64() % 4) as usize];
            let s = shape(&mut rng);
            let public = distribution(&mut rng, vocab, s);
            let ms = (0..members)
                .map(|_| {
                    let s = shape(&mut rng);
                    distribution(&mut rng, vocab, s)
                })
                .collect();
            rows.insert(context, (public, ms));
        }
        Table { vocab, rows }
    }

    /// The same table with member `i`'s row at every context replaced by `with`'s
    /// (an arbitrarily changed member).
    pub fn with_member(&self, i: usize, with: &Table, j: usize) -> Self {
        let mut out = self.clone();
        for (context, row) in out.rows.iter_mut() {
            row.1[i] = with.rows[context].1[j].clone();
        }
        out
    }

    /// The same table with member `i` equal to the public model at every context (an
    /// emptied shard).
    pub fn emptied(&self, i: usize) -> Self {
        let mut out = self.clone();
        for row in out.rows.values_mut() {
            row.1[i] = row.0.clone();
        }
        out
    }

    /// The row of a context.
    pub fn at(&self, context: &[u32]) -> &(Vec<f64>, Vec<Vec<f64>>) {
        &self.rows[context]
    }

    /// Number of members.
    pub fn members(&self) -> usize {
        self.rows.values().next().map_or(0, |r| r.1.len())
    }
}

/// Every token sequence of length < `depth` over `vocab` tokens.
pub fn contexts(vocab: usize, depth: usize) -> Vec<Vec<u32>> {
    let mut all = vec![Vec::new()];
    let mut frontier = vec![Vec::new()];
    for _ in 1..depth {
        let mut next = Vec::new();
        for c in &frontier {
            for t in 0..vocab as u32 {
                let mut d: Vec<u32> = c.clone();
                d.push(t);
                next.push(d);
            }
        }
        all.extend(next.iter().cloned());
        frontier = next;
    }
    all
}

/// The bits of a charge curve's values, for transcripts.
pub fn bits(values: &[f64]) -> Vec<u64> {
    values.iter().map(|v| v.to_bits()).collect()
}
