//! The transcript engine: what a user sees of a run, step by step, and its exact law.
//!
//! A run is driven through the mechanism's public entry point (`release`, or an audit
//! entry point that fixes the coins), against a real account — [`Unbudgeted`] or the
//! accountant's in-memory [`Budget`], which refuses a charge that would take the spend
//! above its (ε, δ) — and every step's outcome is recorded as the user sees it
//! ([`Seen`]): the token, or a refusal, or an error (its kind), with the charge the step
//! reports and the account's spent curve after it. A refused or failed step releases
//! nothing and the run goes on with the same context (the user may keep asking).
//!
//! The caller enumerates the mechanism's coins at each node ([`Branch`]: the coin's
//! exact probability, the mechanism and account after it, and what the entry point
//! returned); the token law of a released distribution is that distribution itself
//! (the sampler draws `dₜ/Σd` exactly; `verify_samplers.rs` tests that). Nothing is
//! read from the mechanism's diagnostics here.
//!
//! Charges are read where they happen: each accepted step's charge must be what the
//! account added (checked with the verifier's own sum), a refused step must leave the
//! account bit for bit as it was, and [`assert_realised`] compares the divergence of two
//! laws with the total the account realised on each transcript.

use std::collections::BTreeMap;
use std::sync::Mutex;

use privmix_accountant::{Budget, Orders, RdpCurve};
use privmix_mechanisms::{Account, MechanismError, Release, Unbudgeted};

use super::{SLACK, Table, renyi};

/// What one step published.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A released token.
    Token(u32),
    /// The account refused the charge: nothing released.
    Refused,
    /// The step failed with an error of this kind: nothing released.
    Error(String),
}

/// One step as a user sees it: the outcome, the bits of the charge the step reports
/// (empty when nothing was released), and the bits of the account's spent curve after
/// the step (what it publishes as the run's ε).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub step: Step,
    pub charge: Vec<u64>,
    pub spent: Vec<u64>,
}

/// A law over transcripts.
pub type Law = BTreeMap<Vec<Seen>, f64>;

/// The accounts a run is driven against.
#[derive(Debug, Clone)]
pub enum Acct {
    /// No budget: every charge accepted.
    Free(Unbudgeted),
    /// The accountant's (ε, δ) budget: a charge over it is refused.
    Budgeted(Budget),
}

impl Acct {
    pub fn free(orders: &Orders) -> Self {
        Acct::Free(Unbudgeted::new(orders.clone()))
    }

    pub fn budget(orders: &Orders, epsilon: f64, delta: f64) -> Self {
        Acct::Budgeted(Budget::new(orders.clone(), epsilon, delta).unwrap())
    }

    /// A budget whose ε lies halfway between the conversions at δ of `before` (what
    /// `k` accepted steps spend) and `after` (what `k + 1` spend): the (k+1)-th step is
    /// refused.
    pub fn budget_between(before: &RdpCurve, after: &RdpCurve, delta: f64) -> Self {
        let a = before.epsilon(delta).unwrap().epsilon;
        let b = after.epsilon(delta).unwrap().epsilon;
        assert!(a < b, "the steps spend nothing: {a} {b}");
        Self::budget(before.orders(), 0.5 * (a + b), delta)
    }

    /// The spent curve's values.
    pub fn spent(&self) -> Vec<f64> {
        match self {
            Acct::Free(a) => a.spent().epsilons().to_vec(),
            Acct::Budgeted(b) => b.spent().epsilons().to_vec(),
        }
    }

    /// The account's kind, for the coverage table.
    pub fn kind(&self) -> &'static str {
        match self {
            Acct::Free(_) => "unbudgeted",
            Acct::Budgeted(_) => "budget",
        }
    }
}

impl Account for Acct {
    fn orders(&self) -> &Orders {
        match self {
            Acct::Free(a) => a.orders(),
            Acct::Budgeted(b) => Account::orders(b),
        }
    }

    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError> {
        match self {
            Acct::Free(a) => a.charge(curve, label),
            Acct::Budgeted(b) => Account::charge(b, curve, label),
        }
    }
}

/// Which kind of account a test builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AccountKind {
    Unbudgeted,
    /// A budget that accepts this many steps and refuses the next.
    RunsOutAfter(usize),
}

/// One outcome of a node's coins.
pub struct Branch<M> {
    /// The coin outcome's exact probability.
    pub weight: f64,
    /// The mechanism after the step.
    pub mech: M,
    /// The account after the step.
    pub account: Acct,
    /// What the entry point returned.
    pub result: Result<Release, MechanismError>,
}

/// The kind of an error (its variant's name).
pub fn error_kind(e: &MechanismError) -> String {
    let text = format!("{e:?}");
    let end = text.find(['(', '{', ' ']).unwrap_or(text.len());
    text[..end].to_string()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks that the account went from `before` to `after` by exactly `charge` (the
/// verifier's own sum; composition rounds up, so `after` may exceed the f64 sum by a
/// relative `SLACK`, never fall below it by more).
pub fn check_charged(before: &[f64], charge: &[f64], after: &[f64], case: &str) {
    assert_eq!(before.len(), charge.len(), "{case}: charge at other orders");
    for ((&b, &c), &a) in before.iter().zip(charge).zip(after) {
        assert!(!c.is_nan() && c >= 0.0, "{case}: charge {c}");
        let want = b + c;
        if want == f64::INFINITY {
            assert_eq!(a, f64::INFINITY, "{case}: account {a}, charged ∞");
            continue;
        }
        assert!(
            a >= want * (1.0 - SLACK) && a <= want * (1.0 + SLACK) + 1e-300,
            "{case}: the account went {b} → {a}, the step reported a charge of {c}"
        );
    }
}

/// The law of a `steps`-step run of `mech` against `account` on `table`, the coins
/// at each node enumerated by `expand(mech, account, public, members)`.
pub fn run_law<M: Clone>(
    mech: &M,
    account: &Acct,
    table: &Table,
    steps: usize,
    mut expand: impl FnMut(&M, &Acct, &[f64], &[Vec<f64>]) -> Vec<Branch<M>>,
) -> Law {
    run_law_at(mech, account, table, steps, |m, a, _, p, ms| {
        expand(m, a, p, ms)
    })
}

/// [`run_law`] with the node's context (the tokens released so far) handed to
/// `expand(mech, account, context, public, members)` too.
pub fn run_law_at<M: Clone>(
    mech: &M,
    account: &Acct,
    table: &Table,
    steps: usize,
    mut expand: impl FnMut(&M, &Acct, &[u32], &[f64], &[Vec<f64>]) -> Vec<Branch<M>>,
) -> Law {
    type Node<M> = (M, Acct, Vec<u32>, Vec<Seen>, f64);
    let mut frontier: Vec<Node<M>> =
        vec![(mech.clone(), account.clone(), Vec::new(), Vec::new(), 1.0)];
    for _ in 0..steps {
        let mut next = Vec::new();
        for (m, acct, context, transcript, p) in frontier {
            let (public, members) = table.at(&context);
            let before = acct.spent();
            let branches = expand(&m, &acct, &context, public, members);
            let total: f64 = branches.iter().map(|b| b.weight).sum();
            assert!(
                (total - 1.0).abs() < 1e-12,
                "the coins' probabilities sum to {total}"
            );
            for branch in branches {
                if branch.weight <= 0.0 {
                    continue;
                }
                let after = branch.account.spent();
                let w = p * branch.weight;
                match branch.result {
                    Ok(release) => {
                        let charge = release.charge.epsilons().to_vec();
                        check_charged(&before, &charge, &after, "accepted step");
                        let d = &release.distribution;
                        assert_eq!(d.len(), public.len(), "released a wrong-sized law");
                        assert!(
                            d.iter().all(|x| x.is_finite() && *x >= 0.0),
                            "released {d:?}"
                        );
                        let sum: f64 = d.iter().sum();
                        assert!(sum > 0.0, "released {d:?}");
                        for (t, &pt) in d.iter().enumerate() {
                            if pt <= 0.0 {
                                continue;
                            }
                            let mut c = context.clone();
                            c.push(t as u32);
                            let mut tr = transcript.clone();
                            tr.push(Seen {
                                step: Step::Token(t as u32),
                                charge: bits(&charge),
                                spent: bits(&after),
                            });
                            next.push((
                                branch.mech.clone(),
                                branch.account.clone(),
                                c,
                                tr,
                                w * pt / sum,
                            ));
                        }
                    }
                    Err(e) => {
                        let step = match &e {
                            MechanismError::ChargeRefused(_) => {
                                assert_eq!(
                                    bits(&before),
                                    bits(&after),
                                    "a refused charge changed the account"
                                );
                                Step::Refused
                            }
                            other => Step::Error(error_kind(other)),
                        };
                        let mut tr = transcript.clone();
                        tr.push(Seen {
                            step,
                            charge: Vec::new(),
                            spent: bits(&after),
                        });
                        next.push((branch.mech, branch.account, context.clone(), tr, w));
                    }
                }
            }
        }
        frontier = next;
    }
    let mut law = Law::new();
    for (_, _, _, transcript, p) in frontier {
        *law.entry(transcript).or_insert(0.0) += p;
    }
    law
}

/// (mechanism, adjacency, account, T) → (worst exact/realised ratio, cases).
pub type Coverage = BTreeMap<(String, String, String, usize), (f64, usize)>;

pub static COVERAGE: Mutex<Coverage> = Mutex::new(BTreeMap::new());

/// The realised total of every transcript of `laws` (the account's spent curve after
/// its last step), which must be one and the same curve: the mechanisms verified here
/// charge data-independent amounts, so a total that differs between transcripts (or
/// between a dataset and its neighbour) is itself a leak.
pub fn realised_total(laws: &[&Law]) -> Vec<f64> {
    let mut total: Option<Vec<u64>> = None;
    for law in laws {
        for transcript in law.keys() {
            let last = transcript.last().expect("a run of at least one step");
            match &total {
                None => total = Some(last.spent.clone()),
                Some(t) => assert_eq!(
                    t, &last.spent,
                    "the realised charge differs between transcripts: {transcript:?}"
                ),
            }
        }
    }
    total.unwrap().into_iter().map(f64::from_bits).collect()
}

/// Checks `D_α(a ‖ b)` and `D_α(b ‖ a)` against the total the account realised (the
/// same on every transcript of both laws, [`realised_total`]) at every order of
/// `orders` (the account's), records the worst ratio under `key`, and panics naming the
/// case on an under-charge.
pub fn assert_realised(
    key: (&str, &str, &str, usize),
    case: &str,
    orders: &[f64],
    a: &Law,
    b: &Law,
) {
    let total = realised_total(&[a, b]);
    assert_eq!(total.len(), orders.len());
    let mut worst = 0.0f64;
    for (&alpha, &eps) in orders.iter().zip(&total) {
        assert!(!eps.is_nan(), "{case}: realised NaN at α {alpha}");
        if eps == f64::INFINITY {
            continue;
        }
        let d = renyi(a, b, alpha).max(renyi(b, a, alpha));
        // (The slack is relative to a finite d: `SLACK·(1 + ∞)` would pass an infinite
        // divergence, as the old `assert_covered` did.)
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

/// The coverage table as Markdown rows.
pub fn coverage_table() -> String {
    let table = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::from(
        "| mechanism | adjacency | account | T | cases | largest exact/realised |\n|---|---|---|---|---|---|\n",
    );
    for ((m, a, k, t), (worst, cases)) in table.iter() {
        out.push_str(&format!(
            "| {m} | {a} | {k} | {t} | {cases} | {worst:.4} |\n"
        ));
    }
    out
}
