//! Budgeted DPS-MOZO transcripts, charges read where they happen (issue 39 §3).
//!
//! A run (+On: one prompt; +Off generation: one prompt per public input, one after the
//! other) is driven step by step through `IclMechanism::step` against a real account —
//! unbudgeted, or the accountant's (ε, δ) `Budget` running out before the first token,
//! after the first, or at the last — as `generate_icl` and `generate_dp_demonstrations`
//! drive it: a stop token ends a prompt's output, the first refusal or error ends the run
//! (both drivers return it and nothing else; [`tie_to_drivers`] checks them against this
//! stepping, seed by seed). Every step's outcome is a transcript entry (the engine's
//! [`Seen`]): the token, or a refusal (which must leave the account bit for bit), or an
//! error kind, with the charge the step reports (which must be what the account added,
//! `engine::check_charged`) and the account's spent curve after it.
//!
//! Coins: at each node the step is called at several seeds against clones of the
//! mechanism and the account; what it publishes besides the token (accepted, refused or
//! failed, the charge, the account after) must be the same at every seed, and a released
//! token must be in the support of the verifier's law. The token's law given acceptance
//! is `exact::Laws::token` — the demonstrations' draw summed out, with the `mech`, `own`
//! and `real` laws of `exact.rs` (the verifier's own arithmetic, error bounds in
//! `law.rs`) — so a transcript's log-probability is the sum of its tokens'.
//!
//! Divergence: `D_α` of the two laws (union of their transcripts, −∞ where one lacks
//! one) in both directions, for all three laws, with `law::renyi`'s error bound, against
//! the largest total any transcript of either law realised (the account's spent curve
//! after its last step; each transcript's is checked to be the composition of what its
//! steps reported). Without a stop token every transcript must realise the same total; a
//! stop (a function of the released tokens) ends the run early and realises less, and the
//! largest is the fixed-horizon total the mechanism claims.

use std::collections::{BTreeMap, BTreeSet};

use privmix_accountant::RdpCurve;
use privmix_mechanisms::{
    Account, DpsMozo, IclMechanism, IclSource, MechanismError, PrivacyRng, StepOutcome,
    generate_dp_demonstrations, generate_icl,
};

use super::exact::{Case, Laws, Variant, orders};
use super::law::{self, ETA_REAL, ETA_TOKEN, ORDERS, U};
use super::world::{Source, World};
use crate::verifier::engine::{AccountKind, Acct, Seen, Step, check_charged, error_kind};

const DELTA: f64 = 1e-5;

/// Seeds each node's step is called at.
const SEEDS: [u64; 3] = [3, 0xFEED_5EED, 0x0DD5_EED5];

/// A mechanism claiming to be DPS-MOZO.
pub trait Claimed: IclMechanism + Clone {}
impl<M: IclMechanism + Clone> Claimed for M {}

/// A transcript's log-probabilities under the `mech`, `own` and `real` laws.
pub type Lp = [f64; 3];

/// A law over budgeted transcripts.
pub type Law = BTreeMap<Vec<Seen>, Lp>;

/// The prompts of a case's generation and its per-prompt length and stop token.
fn prompts(variant: &Variant) -> (Vec<Vec<u32>>, usize, Option<u32>) {
    match variant {
        Variant::On {
            prompt,
            max_tokens,
            stop,
        } => (vec![prompt.clone()], *max_tokens, *stop),
        Variant::Off {
            inputs,
            max_tokens,
            stop,
            ..
        } => (inputs.clone(), *max_tokens, *stop),
    }
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The account of a run over `n` demonstrations.
pub fn account(case: &Case, n: usize, kind: AccountKind) -> Acct {
    match kind {
        AccountKind::Unbudgeted => Acct::free(&orders()),
        AccountKind::RunsOutAfter(k) => {
            let step = DpsMozo::new(case.config).charge(&orders(), n).unwrap();
            let before = if k == 0 {
                RdpCurve::zero(orders())
            } else {
                step.self_compose(k as u64)
            };
            Acct::budget_between(&before, &step.self_compose(k as u64 + 1), DELTA)
        }
    }
}

/// One node of the run tree.
struct Node<M> {
    mech: M,
    account: Acct,
    /// Which prompt, and the tokens released for it so far.
    prompt: usize,
    out: Vec<u32>,
    transcript: Vec<Seen>,
    lp: Lp,
    done: bool,
}

/// What a step published besides its token.
type Published = (Result<Vec<u64>, String>, Vec<u64>);

fn published(r: &Result<StepOutcome, MechanismError>, a: &Acct) -> Published {
    (
        match r {
            Ok(s) => Ok(bits(s.charge.epsilons())),
            Err(e) => Err(error_kind(e)),
        },
        bits(&a.spent()),
    )
}

/// The law of the case's generation on `world` run by `mech` against `account`.
pub fn law<M: Claimed>(
    case: &Case,
    world: &World,
    laws: &mut Laws<'_>,
    mech: &M,
    account: &Acct,
) -> Law {
    let (prompts, max_tokens, stop) = prompts(&case.variant);
    let v = world.vocab;
    let mut frontier = vec![Node {
        mech: mech.clone(),
        account: account.clone(),
        prompt: 0,
        out: Vec::new(),
        transcript: Vec::new(),
        lp: [0.0; 3],
        done: prompts.is_empty(),
    }];
    let mut finished = Vec::new();
    while let Some(node) = frontier.pop() {
        if node.done {
            finished.push(node);
            continue;
        }
        let mut ctx = prompts[node.prompt].clone();
        ctx.extend_from_slice(&node.out);
        let before = node.account.spent();
        let mut first: Option<(M, Acct, Result<StepOutcome, MechanismError>)> = None;
        for seed in SEEDS {
            let mut m = node.mech.clone();
            let mut a = node.account.clone();
            let r = m.step(
                &mut Source::new(world),
                &ctx,
                &mut PrivacyRng::from_seed(seed),
                &mut a,
            );
            match &first {
                None => first = Some((m, a, r)),
                Some((_, a0, r0)) => assert_eq!(
                    published(r0, a0),
                    published(&r, &a),
                    "{}: what the step publishes besides its token depends on the coins",
                    case.name
                ),
            }
        }
        let (m, a, r) = first.unwrap();
        let after = a.spent();
        match r {
            Ok(s) => {
                let charge = s.charge.epsilons().to_vec();
                check_charged(&before, &charge, &after, &case.name);
                let tl = laws.token(&ctx);
                assert!(
                    tl.real[s.token] > f64::NEG_INFINITY,
                    "{}: released token {} outside the verifier's support at {ctx:?}",
                    case.name,
                    s.token
                );
                for t in 0..v {
                    let add = [tl.mech[t], tl.own[t], tl.real[t]];
                    if add.iter().all(|&x| x == f64::NEG_INFINITY) {
                        continue;
                    }
                    let mut out = node.out.clone();
                    out.push(t as u32);
                    let mut transcript = node.transcript.clone();
                    transcript.push(Seen {
                        step: Step::Token(t as u32),
                        charge: bits(&charge),
                        spent: bits(&after),
                    });
                    let ended = out.len() == max_tokens || Some(t as u32) == stop;
                    let (prompt, out) = if ended {
                        (node.prompt + 1, Vec::new())
                    } else {
                        (node.prompt, out)
                    };
                    frontier.push(Node {
                        mech: m.clone(),
                        account: a.clone(),
                        prompt,
                        out,
                        transcript,
                        lp: [0, 1, 2].map(|i| node.lp[i] + add[i]),
                        done: prompt == prompts.len(),
                    });
                }
            }
            Err(e) => {
                let step = match &e {
                    MechanismError::ChargeRefused(_) => {
                        assert_eq!(
                            bits(&before),
                            bits(&after),
                            "{}: a refused charge changed the account",
                            case.name
                        );
                        Step::Refused
                    }
                    other => Step::Error(error_kind(other)),
                };
                let mut transcript = node.transcript.clone();
                transcript.push(Seen {
                    step,
                    charge: Vec::new(),
                    spent: bits(&after),
                });
                finished.push(Node {
                    mech: m,
                    account: a,
                    transcript,
                    done: true,
                    ..node
                });
            }
        }
    }
    let mut out = Law::new();
    for n in finished {
        let prev = out.insert(n.transcript, n.lp);
        assert!(prev.is_none(), "a transcript reached twice");
    }
    out
}

/// The spent curve after a transcript's last step (zero for an empty run), checked to be
/// the composition of the charges its steps reported.
fn realised(transcript: &[Seen]) -> Vec<f64> {
    let Some(last) = transcript.last() else {
        return vec![0.0; ORDERS.len()];
    };
    let mut sum = vec![0.0; ORDERS.len()];
    for s in transcript {
        for (x, &c) in sum.iter_mut().zip(&s.charge) {
            *x += f64::from_bits(c);
        }
    }
    let spent: Vec<f64> = last.spent.iter().map(|&b| f64::from_bits(b)).collect();
    for (&s, &w) in spent.iter().zip(&sum) {
        assert!(
            s >= w * (1.0 - 1e-12) && s <= w * (1.0 + 1e-12) + 1e-300,
            "the account realised {s}, the steps reported {w} in all: {transcript:?}"
        );
    }
    spent
}

/// The worst `(D_α + error)/realised` of one comparison, per law.
pub type Ratios = [f64; 3];

/// Compares two laws against the largest total realised on any of their transcripts
/// (the same on all of them unless `stops`), every order, both directions, all three
/// laws; panics naming `label` on an under-charge; returns the worst ratios.
pub fn compare(a: &Law, b: &Law, stops: bool, tokens: usize, label: &str) -> Ratios {
    let keys: BTreeSet<&Vec<Seen>> = a.keys().chain(b.keys()).collect();
    let mut total = vec![0.0f64; ORDERS.len()];
    let mut first: Option<Vec<u64>> = None;
    for k in &keys {
        let r = realised(k);
        if !stops {
            let rb = bits(&r);
            match &first {
                None => first = Some(rb),
                Some(f) => assert_eq!(
                    f, &rb,
                    "[{label}] the realised charge differs between transcripts: {k:?}"
                ),
            }
        }
        for (t, x) in total.iter_mut().zip(&r) {
            *t = t.max(*x);
        }
    }
    let aligned = |l: &Law, i: usize| -> Vec<f64> {
        keys.iter()
            .map(|k| l.get(*k).map_or(f64::NEG_INFINITY, |lp| lp[i]))
            .collect()
    };
    let eta = tokens as f64 * (ETA_TOKEN + 20.0 * U);
    let eta_real = tokens as f64 * (ETA_REAL + 20.0 * U);
    let mut worst = [0.0f64; 3];
    for (oi, &alpha) in ORDERS.iter().enumerate() {
        let c = total[oi];
        for (dir, (p, q)) in [("D‖D'", (a, b)), ("D'‖D", (b, a))] {
            for (i, w) in worst.iter_mut().enumerate() {
                let e = if i == 2 { eta_real } else { eta };
                let (d, err) = law::renyi(&aligned(p, i), &aligned(q, i), alpha, e);
                // As `exact::compare`: covered when the certified bound is within the
                // realised total, or the divergence is within its own error of 0 (the
                // verifier's resolution; a budget refusing the first token realises 0).
                assert!(
                    (c > 0.0 && d + err <= c) || d <= err,
                    "UNDER-CHARGE [{label}] law {} at α = {alpha}, {dir}: D = {d} (+ error {err}) > realised charge {c}",
                    ["mech", "own", "real"][i]
                );
                if c > 0.0 {
                    *w = w.max((d + err) / c);
                }
            }
        }
    }
    worst
}

/// Runs `mech` step by step (one generator across steps, as the drivers use it) from
/// `seed` against `account`, as [`law`] steps it; returns the transcript.
fn stepped<M: Claimed>(
    case: &Case,
    world: &World,
    mech: &M,
    account: &Acct,
    seed: u64,
) -> (Vec<Seen>, Vec<Vec<u32>>, Acct) {
    let (prompts, max_tokens, stop) = prompts(&case.variant);
    let mut m = mech.clone();
    let mut a = account.clone();
    let mut rng = PrivacyRng::from_seed(seed);
    let mut transcript = Vec::new();
    let mut outs = Vec::new();
    for p in &prompts {
        let mut ctx = p.clone();
        let mut out = Vec::new();
        for _ in 0..max_tokens {
            match m.step(&mut Source::new(world), &ctx, &mut rng, &mut a) {
                Ok(s) => {
                    let t = s.token as u32;
                    transcript.push(Seen {
                        step: Step::Token(t),
                        charge: bits(s.charge.epsilons()),
                        spent: bits(&a.spent()),
                    });
                    ctx.push(t);
                    out.push(t);
                    if Some(t) == stop {
                        break;
                    }
                }
                Err(e) => {
                    transcript.push(Seen {
                        step: match &e {
                            MechanismError::ChargeRefused(_) => Step::Refused,
                            other => Step::Error(error_kind(other)),
                        },
                        charge: Vec::new(),
                        spent: bits(&a.spent()),
                    });
                    return (transcript, outs, a);
                }
            }
        }
        outs.push(out);
    }
    (transcript, outs, a)
}

/// The public drivers (`generate_icl` for +On, `generate_dp_demonstrations` for +Off)
/// against the same account from the same seeds give what stepping gives: the same
/// tokens and account when every step was accepted, the same error kind and account
/// when one was not; and every stepped transcript has positive probability in `law`.
pub fn tie_to_drivers(case: &Case, world: &World, account: &Acct, law: &Law) {
    let mech = DpsMozo::new(case.config);
    let (prompts, max_tokens, stop) = prompts(&case.variant);
    for seed in 100..104u64 {
        let (transcript, outs, a) = stepped(case, world, &mech, account, seed);
        assert!(
            law.get(&transcript)
                .is_some_and(|lp| lp[2] > f64::NEG_INFINITY),
            "{}: a stepped run's transcript {transcript:?} is not in the law",
            case.name
        );
        let mut a2 = account.clone();
        let mut rng = PrivacyRng::from_seed(seed);
        let got: Result<Vec<Vec<u32>>, MechanismError> = match &case.variant {
            Variant::On { .. } => generate_icl(
                &mut DpsMozo::new(case.config),
                &mut Source::new(world),
                &prompts[0],
                max_tokens,
                stop,
                &mut rng,
                &mut a2,
            )
            .map(|g| vec![g.tokens]),
            Variant::Off { .. } => generate_dp_demonstrations(
                &mut DpsMozo::new(case.config),
                &mut Source::new(world),
                &prompts,
                max_tokens,
                stop,
                &mut rng,
                &mut a2,
            )
            .map(|d| {
                d.demonstrations()
                    .iter()
                    .map(|x| x.output.clone())
                    .collect()
            }),
        };
        let last = &transcript.last().expect("at least one step").step;
        match (got, last) {
            (Ok(g), Step::Token(_)) => assert_eq!(g, outs, "{}: seed {seed}", case.name),
            (Err(e), Step::Refused) => assert_eq!(error_kind(&e), "ChargeRefused"),
            (Err(e), Step::Error(k)) => assert_eq!(&error_kind(&e), k),
            (got, last) => panic!("{}: driver {got:?}, stepping {last:?}", case.name),
        }
        assert_eq!(
            bits(&a2.spent()),
            bits(&a.spent()),
            "{}: the driver's account",
            case.name
        );
    }
}

/// The accounts every budgeted check runs against: unbudgeted, and budgets refusing the
/// first token, the second, and the last of `tokens`.
pub fn every_account(tokens: usize) -> Vec<AccountKind> {
    let mut kinds = vec![AccountKind::Unbudgeted, AccountKind::RunsOutAfter(0)];
    if tokens > 2 {
        kinds.push(AccountKind::RunsOutAfter(1));
    }
    if tokens > 1 {
        kinds.push(AccountKind::RunsOutAfter(tokens - 1));
    }
    kinds
}

/// (variant, account kind, T) → (worst ratios, comparisons).
pub type Report = BTreeMap<(String, &'static str, usize), (Ratios, usize)>;

/// Verifies `mech` (claiming to be the case's DPS-MOZO) on the case's world and every
/// replace-one neighbour against each account of `kinds` (with `tie`, also ties the
/// case's DPS-MOZO to the drivers on the world). Returns the worst ratios and the
/// world's law per kind.
pub fn verify_budgeted<M: Claimed>(
    case: &Case,
    mech: &M,
    kinds: &[AccountKind],
    tie: bool,
) -> (Report, Vec<Law>) {
    let t = case.variant.tokens();
    let (_, _, stop) = prompts(&case.variant);
    let label = match &case.variant {
        Variant::On { .. } => "+On",
        Variant::Off { .. } => "+Off generation",
    };
    let n = case.world.demos.len();
    let neighbours: Vec<(String, World)> = case
        .replacements
        .iter()
        .enumerate()
        .flat_map(|(ri, r)| {
            (0..n).map(move |j| {
                (
                    format!("demo {j} ← replacement {ri}"),
                    case.world.replaced(j, r),
                )
            })
        })
        .collect();
    let mut base_laws = Laws::new(&case.world, case.config);
    let mut other_laws: Vec<Laws<'_>> = neighbours
        .iter()
        .map(|(_, w)| Laws::new(w, case.config))
        .collect();
    let mut report = Report::new();
    let mut laws_seen = Vec::new();
    for &kind in kinds {
        let acct = account(case, n, kind);
        let base = law(case, &case.world, &mut base_laws, mech, &acct);
        if tie {
            tie_to_drivers(case, &case.world, &acct, &base);
        }
        for ((what, w), laws) in neighbours.iter().zip(other_laws.iter_mut()) {
            let other = law(case, w, laws, mech, &acct);
            let ratios = compare(
                &base,
                &other,
                stop.is_some(),
                t,
                &format!("{} / {what} / {kind:?}", case.name),
            );
            let e = report
                .entry((label.to_string(), acct.kind(), t))
                .or_insert(([0.0; 3], 0));
            for i in 0..3 {
                e.0[i] = e.0[i].max(ratios[i]);
            }
            e.1 += 1;
        }
        laws_seen.push(base);
    }
    (report, laws_seen)
}

/// The outcomes of every transcript of a law, step by step (tokens as `T`).
pub fn shapes(law: &Law) -> BTreeSet<Vec<&'static str>> {
    law.keys()
        .map(|t| {
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

/// A deliberately wrong DPS-MOZO: refuses (charging nothing) when demonstration 0's
/// one-shot logits at the context favour token 0 — a refusal that depends on the data.
#[derive(Debug, Clone)]
pub struct RefusesOnData(pub DpsMozo);

impl IclMechanism for RefusesOnData {
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        let row = source.one_shot_logits(0, context)?;
        if row.iter().all(|&x| x <= row[0]) {
            return Err(MechanismError::ChargeRefused(
                "wrong: refused on the data".into(),
            ));
        }
        self.0.step(source, context, rng, account)
    }

    fn name(&self) -> &'static str {
        "wrong-dps-mozo"
    }
}
