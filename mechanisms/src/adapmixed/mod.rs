//! AdaPMixED: PMixED with noisy screening (Flemings, Razaviyayn, Annavaram,
//! "Adaptively Private Next-Token Prediction of Large Language Models",
//! arXiv:2410.02016, §4, Alg. 1), with
//! its data-dependent savings kept the provable way: an individual Rényi filter per
//! member ([`crate::adapmixed::filter`]).
//!
//! Per query, over N ≥ 1 members of which some may have left the filter (a member that
//! left holds the public distribution p₀ in its slot from then on):
//! 1. **Screening.** Mix every slot with the small fixed λ_s, average, keep the top-k
//!    indices K of p₀: `s = (1/N)Σᵢ(λ_s pᵢ + (1−λ_s)p₀)|_K`, NOT renormalised (the
//!    reference code renormalises first, which can raise the sensitivity). A changed
//!    member moves s by at most `√2·λ_s/N` in L2. s is rounded to a grid of granularity
//!    g and discrete Gaussian noise of scale σ is added ([`crate::noise::gaussian_on_grid`],
//!    floating-point safe), so the screening costs the Gaussian mechanism's
//!    `α·Δ'²/(2σ²)` with `Δ' = √2·λ_s/N + √k·g`. Then, as post-processing: clip at 0,
//!    renormalise, and answer from p₀ when `D_{α_s}(noisy ‖ p₀|_K) > T` (Alg. 1 line 7).
//! 2. **Private answer.** Project every active member with PMixED's λ (enforcement
//!    order α_c, radius b) and output `p = (1/N)Σ p̄ᵢ` over all slots.
//!
//! Guarantee: changed-member adjacency (a unit's data lies in one member's shard; adding,
//! removing or replacing it changes that member's distributions arbitrarily, N fixed).
//! Each query's charge is a fixed step of a schedule that depends on N, the
//! configuration and the number of queries already charged only, and it is taken before
//! the query reads any member; a refused charge changes nothing (issue 39: a charge
//! sized by the screening decision let a refusal reveal it). After t queries the account
//! holds the proven RDP of a t-query run ([`crate::adapmixed::filter`]: the filter
//! theorem of Feldman & Zrnic, plain composition with fixed per-query bounds (Mironov,
//! arXiv:1702.07476, Prop. 1) and Mironov's weak triangle inequality). With a filter budget B the whole run costs at
//! most the changed-member conversion of B, however many queries it answers; members
//! whose distributions stay near p₀ spend little and stay longest. The argument is
//! written out in `proof.md` beside this file (`src/adapmixed/proof.md`).
//!
//! The paper's own accounting, `max_i Dsym_α(p ‖ p₋ᵢ)` charged per query, is a function
//! of the private data and is not a DP release; [`Adapmixed::data_dependent_losses`]
//! computes it for comparison only.

pub mod filter;
mod leave_one_out;

use privmix_accountant::{Orders, RdpCurve, gaussian, largest_feasible};
use privmix_mixing::{Solution, evaluator_error, top_k_indices};
use privmix_renyi::round::{add_up, div_up, mul_up, sqrt_up, usize_down};
use privmix_renyi::{Direction, Order, batched_divergence, divergence};
use rayon::prelude::*;

use crate::noise::{check_granularity, gaussian_on_grid, rounded_l2_sensitivity};
use crate::pmixed::averaging::average_in_place;
use crate::pmixed::bounds::{
    check_enforcement_order, check_probability, check_radius, row_mass_deviation,
    screening_sum_error,
};
use crate::pmixed::{StepBuffers, solve_and_sum};
use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release,
};
use filter::{MemberFilter, changed_member_epsilon, private_loss};
use leave_one_out::{fast_order, leave_one_out_divergences, others_sum};

/// The orders each member's loss is tracked at by default (those ≤ α_c are used).
pub const DEFAULT_TRACKED_ORDERS: [f64; 14] = [
    1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 24.0, 32.0,
];

/// AdaPMixED's parameters. [`Default`] is the paper's Table 4 (α 18, β 0.2,
/// σ 1e-2, λ 1e-4, T 4.5, k 60) with no filter budget.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapmixedConfig {
    /// Enforcement order α_c of the λ projections (default 18, the paper's α).
    pub alpha_c: f64,
    /// Radius b of the projections (default βα = 0.2·18 = 3.6, the paper's).
    pub radius: f64,
    /// Order of the screening divergence (default 18).
    pub screen_order: f64,
    /// Fixed mixing weight λ_s of the screening (default 1e-4).
    pub screen_lambda: f64,
    /// Standard deviation σ of the screening noise (default 1e-2).
    pub sigma: f64,
    /// Grid granularity g of the screening noise, a power of two (default 2⁻⁴⁰).
    pub screen_granularity: f64,
    /// Screening threshold T (default 4.5).
    pub threshold: f64,
    /// Top-k of p₀ the screening looks at (default 60; a k above the
    /// vocabulary size keeps the whole vocabulary).
    pub top_k: usize,
    /// Orders at which each member's loss is tracked, increasing, each in (1, α_c].
    /// `None` (the default): [`DEFAULT_TRACKED_ORDERS`] below α_c, then α_c.
    pub tracked_orders: Option<Vec<f64>>,
    /// The filter budget B at each tracked order (`None`, the default: no filter —
    /// members never leave and the run is charged plain composition).
    pub filter_budget: Option<Vec<f64>>,
}

impl Default for AdapmixedConfig {
    fn default() -> Self {
        Self {
            alpha_c: 18.0,
            radius: 3.6,
            screen_order: 18.0,
            screen_lambda: 1e-4,
            sigma: 1e-2,
            screen_granularity: 2f64.powi(-40),
            threshold: 4.5,
            top_k: 60,
            tracked_orders: None,
            filter_budget: None,
        }
    }
}

impl AdapmixedConfig {
    /// The tracked orders ([`AdapmixedConfig::tracked_orders`] or its default).
    pub fn tracked(&self) -> Vec<f64> {
        match &self.tracked_orders {
            Some(list) => list.clone(),
            None => {
                let mut list: Vec<f64> = DEFAULT_TRACKED_ORDERS
                    .iter()
                    .copied()
                    .filter(|&a| a < self.alpha_c)
                    .collect();
                list.push(self.alpha_c);
                list
            }
        }
    }

    fn validate(&self) -> Result<(), MechanismError> {
        check_enforcement_order(self.alpha_c)?;
        check_radius(self.radius)?;
        Order::new(self.screen_order)?;
        check_probability("screen_lambda", self.screen_lambda)?;
        check_granularity(self.screen_granularity)?;
        let bad = |name, value, reason| MechanismError::InvalidParameter {
            name,
            value,
            reason,
        };
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(bad("sigma", self.sigma, "σ must be finite and > 0"));
        }
        if self.threshold.is_nan() || self.threshold < 0.0 {
            return Err(bad("threshold", self.threshold, "T must be ≥ 0"));
        }
        if self.top_k == 0 {
            return Err(bad("top_k", 0.0, "k must be at least 1"));
        }
        let tracked = self.tracked();
        if tracked.is_empty() {
            return Err(bad("tracked_orders", 0.0, "the list is empty"));
        }
        let mut previous = 1.0;
        for &a in &tracked {
            if !(a > previous && a <= self.alpha_c) {
                return Err(bad(
                    "tracked_orders",
                    a,
                    "orders must be increasing, > 1 and ≤ α_c",
                ));
            }
            previous = a;
        }
        if let Some(b) = &self.filter_budget {
            if b.len() != tracked.len() {
                return Err(bad(
                    "filter_budget",
                    b.len() as f64,
                    "one budget per tracked order",
                ));
            }
            if let Some(&x) = b.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
                return Err(bad("filter_budget", x, "budgets must be finite and ≥ 0"));
            }
        }
        Ok(())
    }

    /// The screening's cost per query at `orders` for N members: the Gaussian
    /// mechanism with sensitivity `√2·λ_s·(1 + ν)/N + 2E` enlarged by the grid rounding,
    /// where `1 + ν` bounds a row's exact mass ([`row_mass_deviation`]) and E the f64
    /// error of the screening sum on each side ([`screening_sum_error`]; `proof.md`,
    /// "Per-step losses against W").
    pub fn screening_cost(
        &self,
        orders: &Orders,
        members: usize,
    ) -> Result<RdpCurve, MechanismError> {
        let n = members.max(1);
        let exact = div_up(
            mul_up(
                mul_up(sqrt_up(2.0), self.screen_lambda),
                add_up(1.0, row_mass_deviation()),
            ),
            usize_down(n),
        );
        let float = mul_up(2.0, screening_sum_error(n, self.top_k));
        let sensitivity =
            rounded_l2_sensitivity(add_up(exact, float), self.top_k, self.screen_granularity);
        Ok(gaussian(orders, self.sigma, sensitivity)?)
    }

    /// The worst loss of one query (screening plus a private answer) at each tracked
    /// order, for N members.
    pub fn worst_query_loss(&self, members: usize) -> Result<Vec<f64>, MechanismError> {
        let tracked = Orders::new(self.tracked())?;
        let screen = self.screening_cost(&tracked, members)?;
        let private = private_loss(
            &self.tracked(),
            self.radius,
            self.radius,
            self.alpha_c,
            members,
        );
        Ok(screen
            .epsilons()
            .iter()
            .zip(private)
            .map(|(&s, p)| add_up(s, p))
            .collect())
    }

    /// The changed-member curve at `orders` of a run whose bound against the
    /// emptied-member corpus is `g` at the tracked orders.
    pub fn changed_member_curve(
        &self,
        g: &[f64],
        orders: &Orders,
    ) -> Result<RdpCurve, MechanismError> {
        let tracked = self.tracked();
        Ok(RdpCurve::from_fn(orders.clone(), |a| {
            changed_member_epsilon(&tracked, g, a)
        })?)
    }

    /// Sets the filter budget to the largest multiple `s` of one query's worst loss
    /// ([`AdapmixedConfig::worst_query_loss`]) whose changed-member curve over `orders`
    /// converts to at most ε at δ: the whole run, however long, then fits (ε, δ).
    /// The accountant's one search ([`largest_feasible`]), keeping a checked-feasible
    /// lower end, to a relative 1e-9.
    pub fn with_calibrated_filter(
        self,
        epsilon: f64,
        delta: f64,
        members: usize,
        orders: &Orders,
    ) -> Result<Self, MechanismError> {
        self.calibrate_filter_within(None, epsilon, delta, members, orders)
    }

    /// [`AdapmixedConfig::with_calibrated_filter`] for a run after what an account
    /// has already spent (its curve `spent`, whose orders the run is charged at):
    /// the largest filter budget whose changed-member curve, composed after
    /// `spent` (RDP adds order by order, Mironov 2017, "Rényi Differential
    /// Privacy", arXiv:1702.07476, Prop. 1), converts to at most ε at δ. Errors as
    /// `with_calibrated_filter` does, and when `spent` alone converts to ε or more.
    pub fn with_calibrated_filter_after(
        self,
        spent: &RdpCurve,
        epsilon: f64,
        delta: f64,
        members: usize,
    ) -> Result<Self, MechanismError> {
        let orders = spent.orders().clone();
        self.calibrate_filter_within(Some(spent), epsilon, delta, members, &orders)
    }

    fn calibrate_filter_within(
        mut self,
        spent: Option<&RdpCurve>,
        epsilon: f64,
        delta: f64,
        members: usize,
        orders: &Orders,
    ) -> Result<Self, MechanismError> {
        self.validate()?;
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(MechanismError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "the target ε must be finite and > 0",
            });
        }
        crate::pmixed::check_spent(spent, epsilon, delta)?;
        let unit = self.worst_query_loss(members)?;
        let feasible = |s: f64| -> Result<bool, MechanismError> {
            let g: Vec<f64> = unit.iter().map(|&u| mul_up(u, s)).collect();
            let run = self.changed_member_curve(&g, orders)?;
            let curve = match spent {
                Some(spent) => spent.compose(&run)?,
                None => run,
            };
            Ok(curve.epsilon(delta)?.epsilon <= epsilon)
        };
        let good = largest_feasible("filter budget", 0.0, 1.0, feasible)?;
        if good == 0.0 {
            return Err(MechanismError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "no filter budget fits: the tracked orders cannot reach an order whose conversion is below ε",
            });
        }
        self.filter_budget = Some(unit.iter().map(|&u| u * good).collect());
        Ok(self)
    }
}

/// The screening's truncated, un-renormalised average of λ_s-mixtures.
#[derive(Debug, Clone, PartialEq)]
pub struct ScreeningVector {
    /// The top-k indices of p₀, largest first.
    pub indices: Vec<usize>,
    /// `(1/N)Σᵢ(λ_s pᵢ(x) + (1−λ_s)p₀(x))` at each index (NOT renormalised).
    pub values: Vec<f64>,
}

/// The screening decision for one noisy vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScreenDecision {
    /// `D_{α_s}(noisy ‖ p₀|_K)` after clipping and renormalising (+∞ if nothing
    /// positive was left).
    pub divergence: f64,
    /// True when the query is answered privately (divergence ≤ T).
    pub answer_privately: bool,
}

/// The private branch's output for an ensemble.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateAnswer {
    /// `p = (1/N)Σ p̄ᵢ`.
    pub distribution: Vec<f64>,
    /// Each member's projection, in member order.
    pub solutions: Vec<Solution>,
    /// The running sum `S = Σ p̄ᵢ`.
    pub sum: Vec<f64>,
}

/// The AdaPMixED mechanism (see the module docs for its guarantee). One value is one
/// run: its filter state lives as long as it does.
#[derive(Debug, Clone)]
pub struct Adapmixed {
    config: AdapmixedConfig,
    filter: Option<MemberFilter>,
    /// The private answer's group sums, S and output buffer, kept between steps (see
    /// `solve_and_sum` and [`EnsembleMechanism::recycle`]); never read before being
    /// written.
    buffers: StepBuffers,
}

/// Where the screening noise comes from.
enum Noise<'a> {
    Drawn(&'a mut PrivacyRng),
    /// Given in grid units (audits and the exact verifier).
    Given(&'a [i64]),
}

impl Adapmixed {
    /// A mechanism with a validated configuration.
    pub fn new(config: AdapmixedConfig) -> Result<Self, MechanismError> {
        config.validate()?;
        Ok(Self {
            config,
            filter: None,
            buffers: StepBuffers::default(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &AdapmixedConfig {
        &self.config
    }

    /// Which members are still active (None before the first query). Private state,
    /// for audits and tests: never publish it.
    pub fn active_members(&self) -> Option<&[bool]> {
        self.filter.as_ref().map(|f| f.active())
    }

    /// The members the next query's screening will read (those active now whose
    /// budget still admits the screening cost), for `members` members. Private state,
    /// for audits and the exact verifier: never publish it.
    pub fn next_screening_members(&self, members: usize) -> Result<Vec<bool>, MechanismError> {
        let c = &self.config;
        let mut filter = match &self.filter {
            Some(f) => f.clone(),
            None => MemberFilter::new(
                members,
                c.tracked(),
                c.filter_budget.clone(),
                c.worst_query_loss(members)?,
            ),
        };
        let tracked = Orders::new(c.tracked())?;
        let loss = c.screening_cost(&tracked, members)?.epsilons().to_vec();
        for i in 0..members {
            filter.admit(i, &loss);
        }
        Ok(filter.active().to_vec())
    }

    /// Step 1a: the truncated, un-renormalised screening vector of `ensemble`.
    pub fn screening_vector(&self, ensemble: &Ensemble) -> Result<ScreeningVector, MechanismError> {
        if ensemble.is_empty() {
            return Err(MechanismError::EmptyEnsemble);
        }
        let public = ensemble.public();
        let k = self.config.top_k.min(ensemble.vocab());
        let indices = top_k_indices(public, k)?;
        let lambda = self.config.screen_lambda;
        let n = ensemble.len() as f64;
        let values = indices
            .par_iter()
            .map(|&x| {
                let total: f64 = (0..ensemble.len())
                    .map(|i| lambda * ensemble.member(i)[x] + (1.0 - lambda) * public[x])
                    .sum();
                total / n
            })
            .collect();
        Ok(ScreeningVector { indices, values })
    }

    /// Step 1b: the decision for a noisy screening vector (post-processing only:
    /// clip at 0, renormalise, compare with T).
    pub fn decide(
        &self,
        ensemble: &Ensemble,
        indices: &[usize],
        noisy: &[f64],
    ) -> Result<ScreenDecision, MechanismError> {
        if noisy.len() != indices.len() {
            return Err(MechanismError::LengthMismatch {
                what: "screening noise",
                len: noisy.len(),
                vocab: indices.len(),
            });
        }
        let mut clipped: Vec<f64> = noisy.iter().map(|&v| v.max(0.0)).collect();
        let sum: f64 = clipped.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) {
            return Ok(ScreenDecision {
                divergence: f64::INFINITY,
                answer_privately: false,
            });
        }
        clipped.iter_mut().for_each(|x| *x /= sum);
        let mut p0: Vec<f64> = indices.iter().map(|&x| ensemble.public()[x]).collect();
        let s0: f64 = p0.iter().sum();
        p0.iter_mut().for_each(|x| *x /= s0);
        let d = divergence(&clipped, &p0, Order::new(self.config.screen_order)?)?;
        Ok(ScreenDecision {
            divergence: d,
            answer_privately: d <= self.config.threshold,
        })
    }

    /// Step 2a: every member's projection and the average of the mixtures.
    pub fn private_answer(&mut self, ensemble: &Ensemble) -> Result<PrivateAnswer, MechanismError> {
        if ensemble.is_empty() {
            return Err(MechanismError::EmptyEnsemble);
        }
        let (solutions, sum) = solve_and_sum(
            ensemble,
            self.config.alpha_c,
            self.config.radius,
            &mut self.buffers,
        )?;
        let mut distribution = std::mem::take(&mut self.buffers.distribution);
        distribution.clear();
        distribution.extend_from_slice(&sum);
        average_in_place(&mut distribution, ensemble.len());
        Ok(PrivateAnswer {
            distribution,
            solutions,
            sum,
        })
    }

    /// The paper's data-dependent loss `max_i Dsym_α(p ‖ p₋ᵢ)` at each of `orders`, as
    /// computed (no allowance, not rounded up), from the running sum (arXiv:2410.02016, Thm 4.2).
    ///
    /// **Not a DP release.** It is a function of every member's data; the paper charges
    /// it and publishes it, which leaks (two corpora that differ in one member give
    /// different values). privmix charges the filter's data-independent account
    /// instead and offers this only to report AdaPMixED "as the paper accounts it",
    /// labelled as such. It compares with the ensemble *without* member i, not with a
    /// changed member.
    pub fn data_dependent_losses(
        &mut self,
        ensemble: &Ensemble,
        answer: &PrivateAnswer,
        orders: &[f64],
    ) -> Result<Vec<f64>, MechanismError> {
        if ensemble.len() < 2 {
            return Err(MechanismError::InvalidParameter {
                name: "members",
                value: ensemble.len() as f64,
                reason: "the leave-one-out loss needs at least 2 members",
            });
        }
        let (n, v) = (ensemble.len(), ensemble.vocab());
        for (what, len, want) in [
            ("answer sum", answer.sum.len(), v),
            ("answer distribution", answer.distribution.len(), v),
            ("answer solutions", answer.solutions.len(), n),
        ] {
            if len != want {
                return Err(MechanismError::LengthMismatch {
                    what,
                    len,
                    vocab: want,
                });
            }
        }
        let lambdas: Vec<f64> = answer.solutions.iter().map(|s| s.lambda).collect();
        let orders: Vec<Order> = orders
            .iter()
            .map(|&a| Order::new(a))
            .collect::<Result<_, _>>()?;
        // Integer orders up to 64 go through the fused kernel; the general kernels
        // serve the other orders, and any member the fused kernel declines.
        let fast: Vec<(usize, u32)> = orders
            .iter()
            .enumerate()
            .filter_map(|(o, a)| fast_order(a.value()).map(|k| (o, k)))
            .collect();
        let slow: Vec<usize> = (0..orders.len())
            .filter(|o| !fast.iter().any(|(f, _)| f == o))
            .collect();
        let mut losses = vec![vec![0.0; orders.len()]; n];
        let mut redo: Vec<usize> = Vec::new();
        if !fast.is_empty() {
            let ks: Vec<u32> = fast.iter().map(|&(_, k)| k).collect();
            let fused = leave_one_out_divergences(
                ensemble,
                &lambdas,
                &answer.sum,
                &answer.distribution,
                &ks,
            );
            for (i, values) in fused.into_iter().enumerate() {
                match values {
                    Some(values) => {
                        for (&(o, _), value) in fast.iter().zip(values) {
                            losses[i][o] = value;
                        }
                    }
                    None => redo.push(i),
                }
            }
        }
        let all_members: Vec<usize> = (0..n).collect();
        for (members, which) in [
            (&redo, (0..orders.len()).collect::<Vec<_>>()),
            (&all_members, slow.clone()),
        ] {
            if members.is_empty() || which.is_empty() {
                continue;
            }
            let at: Vec<Order> = which.iter().map(|&o| orders[o]).collect();
            let values = general_losses(ensemble, answer, &lambdas, members, &at)?;
            for (&i, row) in members.iter().zip(values) {
                for (&o, value) in which.iter().zip(row) {
                    losses[i][o] = value;
                }
            }
        }
        Ok((0..orders.len())
            .map(|o| losses.iter().map(|row| row[o]).fold(0.0, f64::max))
            .collect())
    }

    /// The ensemble with every member that left the filter replaced by p₀ (the given
    /// ensemble itself while all are active).
    fn effective(
        &self,
        ensemble: &Ensemble,
        active: &[bool],
    ) -> Result<Option<Ensemble>, MechanismError> {
        if active.iter().all(|&a| a) {
            return Ok(None);
        }
        let mut rows = Vec::with_capacity(ensemble.members().len());
        for (i, &a) in active.iter().enumerate() {
            rows.extend_from_slice(if a {
                ensemble.member(i)
            } else {
                ensemble.public()
            });
        }
        Ok(Some(Ensemble::from_probabilities(
            ensemble.public(),
            &rows,
        )?))
    }

    /// One query with the screening noise supplied in grid units (one integer per
    /// screened index): the audit entry point the exact verifier enumerates. Otherwise
    /// identical to [`EnsembleMechanism::release`].
    pub fn release_with_screening_noise(
        &mut self,
        ensemble: &Ensemble,
        noise: &[i64],
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        self.query(ensemble, Noise::Given(noise), account)
    }

    fn query(
        &mut self,
        ensemble: &Ensemble,
        noise: Noise<'_>,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let n = ensemble.len();
        if n == 0 {
            return Err(MechanismError::EmptyEnsemble);
        }
        let c = self.config.clone();
        let mut filter = match self.filter.take() {
            Some(f) if f.members() == n => f,
            Some(f) => {
                self.filter = Some(f);
                return Err(MechanismError::InvalidParameter {
                    name: "members",
                    value: n as f64,
                    reason: "the number of members changed during an AdaPMixED run",
                });
            }
            None => MemberFilter::new(
                n,
                c.tracked(),
                c.filter_budget.clone(),
                c.worst_query_loss(n)?,
            ),
        };
        let result = self.query_with(ensemble, noise, account, &mut filter, &c);
        self.filter = Some(filter);
        result
    }

    fn query_with(
        &mut self,
        ensemble: &Ensemble,
        noise: Noise<'_>,
        account: &mut dyn Account,
        filter: &mut MemberFilter,
        c: &AdapmixedConfig,
    ) -> Result<Release, MechanismError> {
        let n = ensemble.len();
        let tracked_list = c.tracked();
        let tracked = Orders::new(tracked_list.clone())?;
        // The query's step of the data-independent schedule, charged before any member
        // is read: its size depends on the number of queries already charged only, so
        // whether the account accepts it says nothing about the members. A refusal
        // returns here and leaves the filter as it was (`proof.md`, "What is charged").
        let charge = filter.charge_next_query(account, self.name())?;
        // Sub-step 1: the screening. Every active member pays its (data-independent) cost.
        let screen_loss = c.screening_cost(&tracked, n)?.epsilons().to_vec();
        for i in 0..n {
            filter.admit(i, &screen_loss);
        }
        let effective = self.effective(ensemble, filter.active())?;
        let current = effective.as_ref().unwrap_or(ensemble);
        let screening = self.screening_vector(current)?;
        let g = c.screen_granularity;
        let noisy = match noise {
            Noise::Drawn(rng) => gaussian_on_grid(&screening.values, c.sigma, g, rng)?,
            Noise::Given(z) => {
                if z.len() != screening.values.len() {
                    return Err(MechanismError::LengthMismatch {
                        what: "screening noise",
                        len: z.len(),
                        vocab: screening.values.len(),
                    });
                }
                screening
                    .values
                    .iter()
                    .zip(z)
                    .map(|(&v, &z)| {
                        let r = crate::noise::round_to_grid(v, g)?;
                        Ok((r as f64 + z as f64) * g)
                    })
                    .collect::<Result<_, MechanismError>>()?
            }
        };
        let decision = self.decide(current, &screening.indices, &noisy)?;
        if !decision.answer_privately {
            return Ok(Release {
                distribution: ensemble.public().to_vec(),
                charge,
                diagnostics: Diagnostics {
                    public_reason: Some(PublicReason::Screened),
                    ..Diagnostics::default()
                },
            });
        }
        // Sub-step 2: the private answer. Each active member's loss is computed from its
        // own projection (its λ depends on it and p₀ only); a member it would take over
        // the budget leaves before anything is computed from its mixture.
        let mut answer = self.private_answer(current)?;
        // The evaluator's value at λ, enlarged by its proven error, bounds the exact
        // `Dsym_{α_c}(p̄ᵢ, p₀)` (privmix-mixing's margin analysis).
        let error = evaluator_error(Order::new(c.alpha_c)?, current.vocab())?;
        let mut left = false;
        for i in 0..n {
            if !filter.active()[i] {
                continue;
            }
            let value = answer.solutions[i].value;
            let d =
                add_up(value, add_up(mul_up(value, error.relative), error.absolute)).min(c.radius);
            if !filter.admit(i, &private_loss(&tracked_list, d, c.radius, c.alpha_c, n)) {
                left = true;
            }
        }
        if left {
            self.buffers.sum = std::mem::take(&mut answer.sum);
            self.buffers.distribution = std::mem::take(&mut answer.distribution);
            let after = self
                .effective(ensemble, filter.active())?
                .expect("a member just left");
            answer = self.private_answer(&after)?;
        }
        self.buffers.sum = std::mem::take(&mut answer.sum);
        Ok(Release {
            charge,
            diagnostics: Diagnostics {
                lambdas: answer.solutions.iter().map(|s| s.lambda).collect(),
                drawn: (0..n).filter(|&i| filter.active()[i]).collect(),
                public_reason: None,
                solver_evaluations: answer
                    .solutions
                    .iter()
                    .map(|s| s.evaluations as usize)
                    .sum(),
            },
            distribution: answer.distribution,
        })
    }
}

/// `Dsym_α(p ‖ p₋ᵢ)` for each of `members` at each of `orders` (`result[member][order]`)
/// with the general kernels of `privmix_renyi`, on materialised leave-one-out rows.
fn general_losses(
    ensemble: &Ensemble,
    answer: &PrivateAnswer,
    lambdas: &[f64],
    members: &[usize],
    orders: &[Order],
) -> Result<Vec<Vec<f64>>, MechanismError> {
    let v = ensemble.vocab();
    let sum = &answer.sum;
    // A few leave-one-out rows at a time per worker (they stay in cache for every
    // order), never the N×V matrix; `batched_divergence` validates the reference
    // and takes its reciprocals once per block, and screens rows in its kernel.
    let per_block: Vec<Vec<Vec<f64>>> = members
        .par_chunks(LOO_BLOCK)
        .map_init(
            || vec![0.0; LOO_BLOCK * v],
            |block, group| {
                let rows = &mut block[..group.len() * v];
                for (row, &i) in rows.chunks_exact_mut(v).zip(group) {
                    leave_one_out_row(ensemble, lambdas, sum, i, row);
                }
                let by_order = orders
                    .iter()
                    .map(|&a| {
                        batched_divergence(rows, &answer.distribution, a, Direction::Symmetric)
                    })
                    .collect::<Result<Vec<Vec<f64>>, _>>()?;
                Ok((0..group.len())
                    .map(|m| by_order.iter().map(|values| values[m]).collect())
                    .collect())
            },
        )
        .collect::<Result<_, MechanismError>>()?;
    Ok(per_block.into_iter().flatten().collect())
}

/// Members per leave-one-out block: four rows of GPT-2's vocabulary (1.6 MB) stay in a
/// core's L2 cache while every order is scored.
const LOO_BLOCK: usize = 4;

/// `row = p₋ᵢ = (1/(N−1))Σ_{j≠i} p̄ⱼ`, from the running sum `S = Σ p̄ⱼ`: `S − p̄ᵢ`,
/// except where p̄ᵢ holds more than half of S, where the others are summed directly
/// (so no entry suffers cancellation).
fn leave_one_out_row(ensemble: &Ensemble, lambdas: &[f64], sum: &[f64], i: usize, row: &mut [f64]) {
    let n = ensemble.len();
    let public = ensemble.public();
    let scale = 1.0 / (n - 1) as f64;
    let (li, mi) = (lambdas[i], 1.0 - lambdas[i]);
    let pi = ensemble.member(i);
    for x in 0..row.len() {
        let own = li * pi[x] + mi * public[x];
        let rest = if own > 0.5 * sum[x] {
            // Member i dominates this token: sum the others directly.
            others_sum(ensemble, lambdas, i, x)
        } else {
            sum[x] - own
        };
        row[x] = rest.max(0.0) * scale;
    }
}

impl EnsembleMechanism for Adapmixed {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        self.query(ensemble, Noise::Drawn(rng), account)
    }

    fn name(&self) -> &'static str {
        "adapmixed"
    }

    fn recycle(&mut self, distribution: Vec<f64>) {
        self.buffers.distribution = distribution;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_screening_sensitivity_adds_the_row_masses_and_the_sum_error() {
        let c = AdapmixedConfig::default();
        let orders = Orders::new(vec![1.5, 2.0, 8.0]).unwrap();
        for n in [1usize, 4, 100] {
            let nu = row_mass_deviation();
            let exact = 2f64.sqrt() * c.screen_lambda * (1.0 + nu) / n as f64;
            let float = 2.0 * screening_sum_error(n, c.top_k);
            let old = 2f64.sqrt() * c.screen_lambda / n as f64;
            let g = c.screen_granularity;
            let cost = c.screening_cost(&orders, n).unwrap();
            let closed = rounded_l2_sensitivity(exact + float, c.top_k, g);
            let without = rounded_l2_sensitivity(old, c.top_k, g);
            assert!(closed > without, "{n}");
            for (&a, &e) in orders.as_slice().iter().zip(cost.epsilons()) {
                let want = a * closed * closed / (2.0 * c.sigma * c.sigma);
                assert!(
                    e >= want && e <= want * (1.0 + 1e-12),
                    "{n} {a}: {e} vs {want}"
                );
                assert!(e > a * without * without / (2.0 * c.sigma * c.sigma));
            }
        }
    }
}
