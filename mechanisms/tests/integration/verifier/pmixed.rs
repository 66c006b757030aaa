//! PMixED's coins and released outputs, for the transcript engine.
//!
//! The Poisson draw is the mechanism's only coin before the token. For every subset S
//! of the members with positive probability `q^|S|(1−q)^{N−|S|}` the verifier finds a
//! seed whose draw is S (by replaying the mechanism's public `draw_members` on seeds
//! 0, 1, …: a hint only), runs the mechanism's `release` at that seed, and requires the
//! RELEASED distribution to be the verifier's own recomputation for S: the average,
//! in the verifier's arithmetic, of each member's mixture in S (p₀ for S = ∅). Each
//! member's mixture is the released output of a one-member PMixED (its λ depends on
//! that member and p₀ only), checked here to lie on the segment from p₀ to the member
//! and inside the ball `Dsym_{α_c}(·, p₀) ≤ b` with the verifier's own divergence.
//! The law of the step is then built from the released distributions, weighted by the
//! Poisson law (which `verify_samplers.rs` tests against what `release` draws). The
//! reported diagnostics (`drawn`, λ) are checked against the released outputs, never
//! used to build a law.
//!
//! A seed whose release is not the recomputation for S fails the check whatever the
//! reason (a draw that depends on the data, a wrong mixture, a member used that was
//! not drawn), so the hint cannot hide a bug.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use privmix_accountant::Orders;
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, Unbudgeted,
};

use super::{Acct, Branch, SLACK, dsym_vec, mix};

/// PMixED's parameters as the verifier knows them (its specification).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub alpha_c: f64,
    pub radius: f64,
    pub q: f64,
}

impl Spec {
    pub fn config(&self) -> PmixedConfig {
        PmixedConfig::new(self.alpha_c, self.radius, self.q).unwrap()
    }
}

/// The Poisson probability of the subset `mask` of `n` members.
pub fn poisson(mask: u32, n: usize, q: f64) -> f64 {
    let k = mask.count_ones() as i32;
    q.powi(k) * (1.0 - q).powi(n as i32 - k)
}

type SeedCache = HashMap<(usize, u64), Arc<Vec<Option<u64>>>>;

static SEEDS: Mutex<Option<SeedCache>> = Mutex::new(None);

/// For each subset of `n` members with positive probability at q, a seed of
/// `PrivacyRng::from_seed` whose Poisson draw is that subset.
pub fn subset_seeds(n: usize, q: f64) -> Arc<Vec<Option<u64>>> {
    let key = (n, q.to_bits());
    if let Some(found) = SEEDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return found.clone();
    }
    let probe = Pmixed::new(PmixedConfig::new(2.0, 1.0, q).unwrap());
    let mut seeds: Vec<Option<u64>> = vec![None; 1 << n];
    let mut missing = (0u32..1 << n).filter(|&m| poisson(m, n, q) > 0.0).count();
    let mut seed = 0u64;
    while missing > 0 {
        assert!(
            seed < 4_000_000,
            "no seed draws some subset of {n} at q {q}: lower N or move q from 0 and 1"
        );
        let drawn = probe.draw_members(n, &mut PrivacyRng::from_seed(seed));
        let mask = drawn.iter().fold(0u32, |m, &i| m | 1 << i);
        if seeds[mask as usize].is_none() {
            assert!(poisson(mask, n, q) > 0.0, "drew an impossible subset");
            seeds[mask as usize] = Some(seed);
            missing -= 1;
        }
        seed += 1;
    }
    let seeds = Arc::new(seeds);
    SEEDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, seeds.clone());
    seeds
}

/// `|a − b|` small for every entry: the verifier's recomputation against a release.
pub fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (x, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-11 * g.abs().max(w.abs()) + 1e-14;
        assert!(
            (g - w).abs() <= tol,
            "{what}: released {got:?}, the verifier computes {want:?} (token {x})"
        );
    }
}

/// [`assert_close`] after dividing each vector by its sum: a release is a law up to a
/// factor (the sampler draws in proportion to the entries; an average whose quotient
/// would be subnormal is released undivided, `src/pmixed/averaging.rs`).
pub fn assert_proportional(got: &[f64], want: &[f64], what: &str) {
    let norm = |v: &[f64]| {
        let s: f64 = v.iter().sum();
        v.iter().map(|x| x / s).collect::<Vec<f64>>()
    };
    assert_close(&norm(got), &norm(want), what);
}

/// The coefficient λ with `d = λ·p + (1 − λ)·p₀`, checked: `d` must lie on the
/// segment (within rounding). `None` when p = p₀ (any λ).
pub fn on_segment(d: &[f64], p: &[f64], p0: &[f64], what: &str) -> Option<f64> {
    let (x, diff) = p
        .iter()
        .zip(p0)
        .map(|(a, b)| a - b)
        .enumerate()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .unwrap();
    if diff == 0.0 {
        assert_close(d, p0, what);
        return None;
    }
    let lambda = (d[x] - p0[x]) / diff;
    // The recovered λ is exact up to the rounding of d[x] and p₀[x] over |diff|.
    let error = 1e-9 + 1e-15 * d[x].abs().max(p0[x].abs()) / diff.abs();
    assert!(
        (-error..=1.0 + error).contains(&lambda),
        "{what}: λ {lambda} outside [0, 1] (± {error})"
    );
    let lambda = lambda.clamp(0.0, 1.0);
    assert_close(d, &mix(lambda, p, p0), what);
    Some(lambda)
}

/// Each member's released mixture (cached by its bits and p₀'s), checked.
#[derive(Default)]
pub struct Mixtures {
    cache: HashMap<(Vec<u64>, Vec<u64>), Vec<f64>>,
}

impl Mixtures {
    /// The released output of a one-member PMixED (q = 1) on `member`: member's
    /// mixture, checked on the segment and in the ball with the verifier's divergence.
    pub fn get(&mut self, alpha_c: f64, radius: f64, public: &[f64], member: &[f64]) -> Vec<f64> {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
        let key = (bits(public), bits(member));
        if let Some(m) = self.cache.get(&key) {
            return m.clone();
        }
        let mut one = Pmixed::new(PmixedConfig::new(alpha_c, radius, 1.0).unwrap());
        let e = Ensemble::from_probabilities(public, member).unwrap();
        let mut account = Unbudgeted::new(Orders::new(vec![2.0]).unwrap());
        let released = one
            .release(&e, &mut PrivacyRng::from_seed(0), &mut account)
            .unwrap()
            .distribution;
        check_in_ball(
            &released,
            member,
            public,
            alpha_c,
            radius,
            "a member's mixture",
        );
        self.cache.insert(key, released.clone());
        released
    }
}

/// A mixture the proof needs: on the segment from p₀ to `member`, and
/// `Dsym_{α_c}(mixed, p₀) ≤ b` by the verifier's divergence.
pub fn check_in_ball(
    mixed: &[f64],
    member: &[f64],
    public: &[f64],
    alpha_c: f64,
    radius: f64,
    what: &str,
) {
    on_segment(mixed, member, public, what);
    let d = dsym_vec(mixed, public, alpha_c);
    assert!(
        d <= radius * (1.0 + SLACK) + 1e-15,
        "{what} breaks its constraint: Dsym {d} > b {radius}"
    );
}

/// The average of rows, in the verifier's arithmetic.
pub fn average(rows: &[Vec<f64>], v: usize) -> Vec<f64> {
    let mut out = vec![0.0; v];
    for r in rows {
        out.iter_mut().zip(r).for_each(|(o, &x)| *o += x);
    }
    out.iter_mut().for_each(|o| *o /= rows.len() as f64);
    out
}

/// The branches of one PMixED step of `mech` (any [`EnsembleMechanism`] claiming to
/// be PMixED with `spec`) at a node: every Poisson subset, its seed's release, checked
/// against the verifier's recomputation, and the reports checked against the release.
pub fn branches<M: EnsembleMechanism + Clone>(
    spec: &Spec,
    mixtures: &mut Mixtures,
    mech: &M,
    account: &Acct,
    public: &[f64],
    members: &[Vec<f64>],
) -> Vec<Branch<M>> {
    let n = members.len();
    let seeds = subset_seeds(n, spec.q);
    let e = Ensemble::from_probabilities(public, &members.concat()).unwrap();
    let own: Vec<Vec<f64>> = members
        .iter()
        .map(|m| mixtures.get(spec.alpha_c, spec.radius, public, m))
        .collect();
    let mut out = Vec::new();
    for mask in 0u32..1 << n {
        let weight = poisson(mask, n, spec.q);
        if weight == 0.0 {
            continue;
        }
        let seed = seeds[mask as usize].expect("a seed for every subset");
        let mut m = mech.clone();
        let mut a = account.clone();
        let result = m.release(&e, &mut PrivacyRng::from_seed(seed), &mut a);
        if let Ok(r) = &result {
            let s: Vec<usize> = (0..n).filter(|&i| mask >> i & 1 == 1).collect();
            let want = if s.is_empty() {
                public.to_vec()
            } else {
                average(
                    &s.iter().map(|&i| own[i].clone()).collect::<Vec<_>>(),
                    public.len(),
                )
            };
            assert_proportional(
                &r.distribution,
                &want,
                &format!("the release when the draw is {s:?}"),
            );
            // The reports, against the released outputs.
            assert_eq!(
                r.diagnostics.drawn, s,
                "the mechanism reports other members than it released"
            );
            assert_eq!(r.diagnostics.lambdas.len(), s.len(), "reported λs");
            for (&i, &lambda) in s.iter().zip(&r.diagnostics.lambdas) {
                assert_close(
                    &mix(lambda, &members[i], public),
                    &own[i],
                    &format!("member {i}'s reported λ {lambda}"),
                );
            }
        }
        out.push(Branch {
            weight,
            mech: m,
            account: a,
            result,
        });
    }
    out
}
