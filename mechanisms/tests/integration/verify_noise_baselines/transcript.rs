//! Budgeted transcripts of the three noise baselines (issue 39 §3), on the engine of
//! `verifier/engine.rs`.
//!
//! A run of T ≤ 3 steps is driven through each mechanism's public entry point (`release`)
//! against a real account — unbudgeted, or the accountant's (ε, δ) `Budget` running out
//! before the first step, after the first of three, or at the last step — each query's
//! rows chosen adaptively from the tokens released so far (a [`Table`]). Every step's
//! outcome is read where it happens: the token, or a refusal (which must leave the
//! account bit for bit), or an error kind, with the charge the step reports (which must
//! be what the account added) and the account's spent curve after it. The exact law of
//! these transcripts is computed on a dataset and on each replace-one neighbour, and
//! `D_α` in both directions is compared with the total the account realised.
//!
//! Coins: the noise is lattice noise drawn inside `release`, which has no entry point
//! fixing it, so it is not enumerated through `release` as PMixED's subsets are. Instead
//! each node calls `release` at several seeds, against clones of the mechanism and the
//! account, and requires what the step publishes besides the token — accepted, refused
//! or failed, the charge, the account after — to be the same at every seed (a coin-
//! dependent refusal would be a law this verifier cannot enumerate, and fails). The
//! token's law given acceptance is this file's parent's law from the definitions
//! (`gnmax_law`, `laplace_law`, `embedding_law`: the noise lattice summed out), each
//! release's token must lie in its support, and `the_verified_laws_are_what_the_
//! mechanisms_draw` ties those laws to the draws by frequency.
//!
//! Error bound: each computed token probability P̃ satisfies
//! `P̃(1 − 10⁻¹²) ≤ P ≤ P̃(1 + 10⁻¹²) + τ` (the parent's bounds, τ the lattice tail, 0 for
//! the Gaussian lattices), so a transcript's probability lies between the products of
//! those bounds over its tokens (refusals and errors are certain given the context);
//! `D_α` is bounded above with the upper bounds in the numerator's place and the lower
//! ones in the denominator's, as in the parent.
//!
//! Adjacency: replace-one (the member count, hence every charge, is the same on both
//! sides). Add/remove changes Laplace's and embedding aggregation's charge with N, so
//! the spent curves differ and the transcripts are disjoint: the ensemble size is public
//! there, and those pairs are checked on the token at T = 1 by the parent's tests.

use std::collections::BTreeMap;

use privmix_accountant::{Orders, RdpCurve};
use privmix_mechanisms::baselines::{Gnmax, SubsampleAggregateLaplace};
use privmix_mechanisms::{
    Account, Diagnostics, EmbeddingSpaceAggregation, EnsembleMechanism, MechanismError, PrivacyRng,
    Release,
};

use super::{embedding_law, ensemble, gnmax_law, laplace_law, votes};
use crate::verifier::engine::run_law_at;
use crate::verifier::engine::{COVERAGE, Seen, Step, realised_total};
use crate::verifier::{AccountKind, Acct, Branch, Law, ORDERS, SLACK, Table};

const DELTA: f64 = 1e-5;

/// Seeds each node's `release` is called at (what it publishes besides the token must
/// not depend on them).
const SEEDS: [u64; 3] = [1, 0xDEAD_BEEF, 0x5EED_C01D];

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// What a deliberately wrong GNMax does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bug {
    /// Charges (and reports) nothing when member 0 votes for token 0: a data-dependent
    /// charge (with a budget, a refusal on one side only).
    ChargeDependsOnData,
    /// Refuses (charging nothing) when member 0 votes for token 0: a data-dependent
    /// refusal.
    RefusesOnData,
    /// Reports the right charge but takes half of it from the account.
    ChargesHalfReportsFull,
    /// Fails with an error (after charging) when member 0 votes for token 0.
    ErrsOnData,
}

/// The mechanism a run drives.
#[derive(Debug, Clone)]
pub enum Mech {
    Gnmax(Gnmax),
    Laplace(SubsampleAggregateLaplace),
    /// Embedding aggregation with the members' rows as outputs (f32) and the V unit
    /// vectors as candidates: the chosen candidate is the token.
    Embedding(EmbeddingSpaceAggregation),
    /// A wrapper around GNMax, claiming to be it.
    Wrong(Gnmax, Bug),
}

/// The embedding outputs of a row's members.
fn outputs(members: &[Vec<f64>]) -> Vec<Vec<f32>> {
    members
        .iter()
        .map(|m| m.iter().map(|&x| x as f32).collect())
        .collect()
}

/// The candidates: the V unit vectors.
fn candidates(vocab: usize) -> Vec<Vec<f32>> {
    (0..vocab)
        .map(|t| (0..vocab).map(|j| if j == t { 1.0 } else { 0.0 }).collect())
        .collect()
}

fn one_hot(vocab: usize, t: usize) -> Vec<f64> {
    let mut d = vec![0.0; vocab];
    d[t] = 1.0;
    d
}

impl Mech {
    pub fn name(&self) -> &'static str {
        match self {
            Mech::Gnmax(_) | Mech::Wrong(..) => "GNMax",
            Mech::Laplace(_) => "Laplace subsample-and-aggregate",
            Mech::Embedding(_) => "embedding aggregation",
        }
    }

    /// The per-step charge the mechanism states for `members` members over `vocab`
    /// tokens (its public curve function), for building budgets.
    pub fn curve(&self, members: usize, vocab: usize) -> RdpCurve {
        match self {
            Mech::Gnmax(g) | Mech::Wrong(g, _) => g.curve(&orders()).unwrap(),
            Mech::Laplace(l) => l.curve(&orders(), members, vocab).unwrap(),
            Mech::Embedding(e) => e.curve(&orders(), members, vocab).unwrap(),
        }
    }

    /// One step through the public entry point.
    fn release(
        &mut self,
        public: &[f64],
        members: &[Vec<f64>],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        match self {
            Mech::Gnmax(g) => g.release(&ensemble(public, members), rng, account),
            Mech::Laplace(l) => l.release(&ensemble(public, members), rng, account),
            Mech::Embedding(e) => {
                let r = e.release(&outputs(members), &candidates(public.len()), rng, account)?;
                Ok(Release {
                    distribution: one_hot(public.len(), r.index),
                    charge: r.charge,
                    diagnostics: Diagnostics::default(),
                })
            }
            Mech::Wrong(g, bug) => {
                let e = ensemble(public, members);
                let member0_votes_0 = votes(&members[..1], public.len())[0] == 1;
                let curve = g.curve(account.orders())?;
                let zero = RdpCurve::zero(account.orders().clone());
                let (taken, reported) = match bug {
                    Bug::ChargeDependsOnData if member0_votes_0 => (zero.clone(), zero),
                    Bug::RefusesOnData if member0_votes_0 => {
                        return Err(MechanismError::ChargeRefused(
                            "wrong: refused on the data".into(),
                        ));
                    }
                    Bug::ChargesHalfReportsFull => (
                        RdpCurve::from_fn(account.orders().clone(), |a| {
                            curve.at(a).unwrap() / 2.0
                        })?,
                        curve,
                    ),
                    _ => (curve.clone(), curve),
                };
                let mut free = privmix_mechanisms::Unbudgeted::new(account.orders().clone());
                let mut r = g.release(&e, rng, &mut free)?;
                account.charge(&taken, "wrong-gnmax")?;
                if *bug == Bug::ErrsOnData && member0_votes_0 {
                    return Err(MechanismError::EmptyVocabulary);
                }
                r.charge = reported;
                Ok(r)
            }
        }
    }

    /// The verifier's token law for one query (lower bounds) and its tail τ.
    fn token_law(&self, public: &[f64], members: &[Vec<f64>]) -> (Vec<f64>, f64) {
        let law = match self {
            Mech::Gnmax(g) | Mech::Wrong(g, _) => {
                gnmax_law(&votes(members, public.len()), g.sigma())
            }
            Mech::Laplace(l) => laplace_law(&ensemble(public, members), l),
            Mech::Embedding(e) => embedding_law(
                &outputs(members),
                &candidates(public.len()),
                e.sigma(),
                e.granularity(),
            ),
        };
        let total: f64 = law.mass.iter().sum();
        assert!(
            total <= 1.0 + 1e-12 && total >= 1.0 - 1e-12 - law.tail * public.len() as f64,
            "{}: the token law sums to {total}",
            self.name()
        );
        (law.mass, law.tail)
    }
}

/// The bits of an account's spent curve.
fn spent_bits(a: &Acct) -> Vec<u64> {
    a.spent().iter().map(|x| x.to_bits()).collect()
}

/// What a step published besides its token, for comparing seeds.
type Published = (Result<Vec<u64>, String>, Vec<u64>);

/// Per context: the token law's lower bounds and tail (for the upper-bound law).
type Laws = BTreeMap<Vec<u32>, (Vec<f64>, f64)>;

/// The coins of one node: `release` at every seed, which must publish the same outcome,
/// charge and account; an accepted step branches on the token with the verifier's law.
fn branches(
    mech: &Mech,
    account: &Acct,
    public: &[f64],
    members: &[Vec<f64>],
    laws: &mut Laws,
    context: Vec<u32>,
) -> Vec<Branch<Mech>> {
    let mut first: Option<(Mech, Acct, Result<Release, MechanismError>, Published)> = None;
    for seed in SEEDS {
        let mut m = mech.clone();
        let mut a = account.clone();
        let result = m.release(public, members, &mut PrivacyRng::from_seed(seed), &mut a);
        let published: Published = (
            match &result {
                Ok(r) => Ok(r.charge.epsilons().iter().map(|x| x.to_bits()).collect()),
                Err(e) => Err(crate::verifier::engine::error_kind(e)),
            },
            spent_bits(&a),
        );
        match &first {
            None => first = Some((m, a, result, published)),
            Some((_, _, _, p)) => assert_eq!(
                p,
                &published,
                "{}: what the step publishes besides its token depends on the noise",
                mech.name()
            ),
        }
    }
    let (m, a, result, _) = first.unwrap();
    let release = match result {
        Ok(r) => r,
        Err(e) => {
            return vec![Branch {
                weight: 1.0,
                mech: m,
                account: a,
                result: Err(e),
            }];
        }
    };
    let (mass, tail) = mech.token_law(public, members);
    for (t, &x) in release.distribution.iter().enumerate() {
        assert!(
            x <= 0.0 || mass[t] > 0.0,
            "{}: released token {t}, outside the verifier's support {mass:?}",
            mech.name()
        );
    }
    let total: f64 = mass.iter().sum();
    let out = mass
        .iter()
        .enumerate()
        .map(|(t, &w)| Branch {
            // The lower bounds renormalised (they miss at most V·τ ≈ 1e-16): the engine
            // requires coins summing to 1; the bound below uses the raw ones.
            weight: w / total,
            mech: m.clone(),
            account: a.clone(),
            result: Ok(Release {
                distribution: one_hot(public.len(), t),
                charge: release.charge.clone(),
                diagnostics: Diagnostics::default(),
            }),
        })
        .collect();
    laws.insert(context, (mass, tail));
    out
}

/// Lower and upper bounds of the law of a `steps`-step run, per transcript: the
/// product over its tokens of `P̃(1 − 10⁻¹²)`, and of `P̃(1 + 10⁻¹²) + τ`.
pub fn law(mech: &Mech, account: &Acct, table: &Table, steps: usize) -> (Law, Law) {
    let mut laws = Laws::new();
    let normalised = run_law_at(
        mech,
        account,
        table,
        steps,
        |m, a, context, public, members| {
            branches(m, a, public, members, &mut laws, context.to_vec())
        },
    );
    let (mut lower, mut upper) = (Law::new(), Law::new());
    for transcript in normalised.keys() {
        let (mut lo, mut hi) = (1.0f64, 1.0f64);
        let mut context = Vec::new();
        for seen in transcript {
            if let Step::Token(t) = seen.step {
                let (mass, tail) = &laws[&context];
                lo *= mass[t as usize] * (1.0 - 1e-12);
                hi *= mass[t as usize] * (1.0 + 1e-12) + tail;
                context.push(t);
            }
        }
        lower.insert(transcript.clone(), lo);
        upper.insert(transcript.clone(), hi);
    }
    (lower, upper)
}

/// An upper bound of `D_α(P ‖ Q)` from P's upper and Q's lower bounds (not renormalised).
fn renyi_upper(p_hi: &Law, q_lo: &Law, alpha: f64) -> f64 {
    let mut logs = Vec::new();
    for (k, &p) in p_hi {
        if p <= 0.0 {
            continue;
        }
        let q = q_lo.get(k).copied().unwrap_or(0.0);
        if q <= 0.0 {
            return f64::INFINITY;
        }
        logs.push(alpha * p.ln() + (1.0 - alpha) * q.ln());
    }
    let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return 0.0;
    }
    let sum: f64 = logs.iter().map(|l| (l - max).exp()).sum();
    ((max + sum.ln()) / (alpha - 1.0)).max(0.0)
}

/// The account of a run on `members` members over `vocab` tokens.
pub fn account(mech: &Mech, members: usize, vocab: usize, kind: AccountKind) -> Acct {
    match kind {
        AccountKind::Unbudgeted => Acct::free(&orders()),
        AccountKind::RunsOutAfter(k) => {
            let step = mech.curve(members, vocab);
            let before = if k == 0 {
                RdpCurve::zero(orders())
            } else {
                step.self_compose(k as u64)
            };
            Acct::budget_between(&before, &step.self_compose(k as u64 + 1), DELTA)
        }
    }
}

/// The replace-one neighbours of `table`: each member emptied (→ p₀) and replaced by each
/// of `other`'s members, at every context.
pub fn neighbours(table: &Table, other: &Table) -> Vec<(&'static str, String, Table)> {
    let mut out = Vec::new();
    for i in 0..table.members() {
        out.push((
            "changed member (emptied → p₀)",
            format!("member {i} emptied"),
            table.emptied(i),
        ));
        for j in 0..other.members() {
            out.push((
                "changed member (arbitrary)",
                format!("member {i} → other {j}"),
                table.with_member(i, other, j),
            ));
        }
    }
    out
}

/// Checks two transcript laws (lower, upper) against the total the account realised
/// (one curve for every transcript of both: [`realised_total`]) at every order, both
/// directions, and records the worst ratio in the verifier's coverage table.
fn assert_realised_bounds(
    key: (&str, &str, &str, usize),
    case: &str,
    a: &(Law, Law),
    b: &(Law, Law),
) {
    let total = realised_total(&[&a.0, &b.0]);
    let mut worst = 0.0f64;
    for (&alpha, &eps) in ORDERS.iter().zip(&total) {
        assert!(!eps.is_nan(), "{case}: realised NaN at α {alpha}");
        if eps == f64::INFINITY {
            continue;
        }
        let d = renyi_upper(&a.1, &b.0, alpha).max(renyi_upper(&b.1, &a.0, alpha));
        assert!(
            d.is_finite() && d <= eps + SLACK * (1.0 + d),
            "{case}: α {alpha}: exact {d} > realised charge {eps}"
        );
        if eps > 0.0 {
            worst = worst.max(d / eps);
        }
    }
    let mut table = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    let entry = table
        .entry((
            key.0.to_string(),
            key.1.to_string(),
            key.2.to_string(),
            key.3,
        ))
        .or_insert((0.0, 0));
    entry.0 = entry.0.max(worst);
    entry.1 += 1;
}

/// Checks `mech` on `table` and every replace-one neighbour against each account of
/// `kinds`; returns the transcripts seen on `table` per kind (for the tests' shape
/// checks).
pub fn check(
    mech: &Mech,
    table: &Table,
    other: &Table,
    steps: usize,
    kinds: &[AccountKind],
) -> Vec<Law> {
    let mut seen = Vec::new();
    for &kind in kinds {
        let acct = account(mech, table.members(), table.vocab, kind);
        let base = law(mech, &acct, table, steps);
        let case = format!("{mech:?}, N {}, {kind:?}", table.members());
        for (adjacency, what, neighbour) in neighbours(table, other) {
            let other_law = law(mech, &acct, &neighbour, steps);
            assert_realised_bounds(
                (mech.name(), adjacency, acct.kind(), steps),
                &format!("{case}, {what}"),
                &base,
                &other_law,
            );
        }
        seen.push(base.0);
    }
    seen
}

/// The outcomes of every transcript of a law, step by step (tokens as `T`).
pub fn shapes(law: &Law) -> std::collections::BTreeSet<Vec<&'static str>> {
    law.keys()
        .map(|t: &Vec<Seen>| {
            t.iter()
                .map(|s| match &s.step {
                    Step::Token(_) => "T",
                    Step::Refused => "refused",
                    Step::Error(_) => "error",
                })
                .collect()
        })
        .collect()
}
