//! PMixED: private mixing of ensemble distributions (Flemings, Razaviyayn, Annavaram,
//! "Differentially Private Next-Token Prediction of Large Language Models",
//! arXiv:2403.15638; restated in "Adaptively Private Next-Token Prediction of Large
//! Language Models", arXiv:2410.02016, §3.2, Alg. 2, App. C), charged with the bound
//! of [`crate::bounds`].
//!
//! Per query: each member is kept independently with probability q (Poisson
//! subsampling — a member appears at most once, unlike the reference code's
//! sampling with replacement); each kept member is projected toward the public
//! distribution, `p̄ᵢ = λᵢpᵢ + (1−λᵢ)p₀` with the largest λᵢ ∈ [0, 1] such that
//! `Dsym_{α_c}(p̄ᵢ, p₀) ≤ b` (privmix-mixing's [`PmixedProjection`]); the output
//! is the average of the p̄ᵢ (p₀ when no member is drawn), and one token is
//! sampled from it.
//!
//! Guarantee: each query is (α, ε(α))-RDP under changed-member adjacency (a unit's
//! data lies in one member's shard; adding, removing or replacing it changes that
//! member's distributions arbitrarily, N fixed) with ε = [`pmixed_curve`]
//! (data-independent: computed once per configuration, account orders and ensemble
//! size, never per step). Orders above `α_max = α_c²/(2α_c − 1)` are charged +∞.
//! N = 1 is allowed and charged the full triangle bound c·b. The paper's own bound
//! (arXiv:2410.02016 Thm 3.1) does not hold as used and is not charged. The proof of
//! what is charged, and of why the paper's bound fails, is written out in `proof.md`
//! beside this file (`src/pmixed/proof.md`).
//!
//! Temperature: [`temper`] raises each model's distribution (public and
//! members) to the power 1/T before the mechanism. It is part of the *model*:
//! the mechanism's guarantee holds for whatever distributions it is given, so a
//! temperature applied to its inputs costs nothing. It is NOT applied to the
//! mechanism's output — sharpening the mixture after the projection would
//! change the output distribution the bound was proven for.

pub(crate) mod averaging;
pub mod bounds;
mod second_order;

use privmix_accountant::{Orders, RdpCurve, largest_feasible};
use privmix_mixing::{PmixedProjection, Solution};
use privmix_renyi::{Order, ValidatedRow};
use rand::Rng;
use rayon::prelude::*;

use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release,
};
use bounds::{
    check_enforcement_order, check_probability, check_radius, max_accounted_order, pmixed_curve,
};

/// Vocabulary entries per parallel task when averaging mixtures.
const CHUNK: usize = 4096;

/// A validated PMixED configuration: enforcement order α_c, radius b, and the
/// Poisson sampling probability q of each member.
///
/// Choosing α_c: the bound is finite up to `α_max = α_c²/(2α_c − 1)`; to
/// account at the paper's α = 18 take α_c ≥ 18 + √(18·17) ≈ 35.5, e.g. 36
/// (α_max ≈ 18.25).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PmixedConfig {
    alpha_c: f64,
    radius: f64,
    q: f64,
}

impl PmixedConfig {
    /// α_c finite > 1, b finite ≥ 0, q ∈ [0, 1].
    pub fn new(alpha_c: f64, radius: f64, q: f64) -> Result<Self, MechanismError> {
        check_enforcement_order(alpha_c)?;
        check_radius(radius)?;
        check_probability("q", q)?;
        Ok(Self { alpha_c, radius, q })
    }

    /// The largest radius b such that `queries` PMixED queries (ensembles of
    /// `n_members`, sampling probability q, enforcement order α_c) compose over
    /// `orders` to at most ε at δ, with the same rounded-up arithmetic that
    /// charges them.
    ///
    /// The accountant's one search, [`largest_feasible`]: a bracket [good, bad]
    /// with `good` checked feasible and `bad` infeasible, returning `good` once
    /// `bad − good ≤ 1e-9·bad`; b = 0 (the public model, charged nothing) when no
    /// positive radius fits, as when no order ≤ α_max can convert below ε at δ.
    /// Errors if no order of `orders` is ≤ α_max
    /// (nothing finite could be charged), for ε ≤ 0 or non-finite, δ ∉ (0, 1),
    /// zero queries or members.
    pub fn calibrate(
        epsilon: f64,
        delta: f64,
        queries: u64,
        q: f64,
        n_members: u64,
        alpha_c: f64,
        orders: &Orders,
    ) -> Result<Self, MechanismError> {
        Self::calibrate_within(None, epsilon, delta, queries, q, n_members, alpha_c, orders)
    }

    /// [`PmixedConfig::calibrate`] for a run that follows what an account has
    /// already spent (its curve `spent`, over the orders the run is charged at):
    /// the largest radius b such that `spent` composed with `queries` PMixED
    /// queries converts to at most ε at δ.
    ///
    /// RDP composes order by order (Mironov 2017, "Rényi Differential Privacy",
    /// arXiv:1702.07476, Prop. 1) and the conversion to (ε, δ) is a minimum over
    /// orders, so what is left of a budget is not ε minus the spent ε: the run is
    /// fitted to the composed curve, with the same rounded-up arithmetic that
    /// charges it. Errors as [`PmixedConfig::calibrate`] does, and when `spent`
    /// alone already converts to ε or more at δ.
    pub fn calibrate_after(
        spent: &RdpCurve,
        epsilon: f64,
        delta: f64,
        queries: u64,
        q: f64,
        n_members: u64,
        alpha_c: f64,
    ) -> Result<Self, MechanismError> {
        Self::calibrate_within(
            Some(spent),
            epsilon,
            delta,
            queries,
            q,
            n_members,
            alpha_c,
            spent.orders(),
        )
    }

    /// The bisection of [`PmixedConfig::calibrate`] and
    /// [`PmixedConfig::calibrate_after`]: a run's curve composed after `spent`
    /// (nothing spent when `None`).
    #[allow(clippy::too_many_arguments)]
    fn calibrate_within(
        spent: Option<&RdpCurve>,
        epsilon: f64,
        delta: f64,
        queries: u64,
        q: f64,
        n_members: u64,
        alpha_c: f64,
        orders: &Orders,
    ) -> Result<Self, MechanismError> {
        check_enforcement_order(alpha_c)?;
        check_probability("q", q)?;
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(MechanismError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "the target ε must be finite and > 0",
            });
        }
        if delta.is_nan() || delta <= 0.0 || delta >= 1.0 {
            return Err(MechanismError::InvalidParameter {
                name: "delta",
                value: delta,
                reason: "δ must lie in (0, 1)",
            });
        }
        if queries == 0 || n_members == 0 {
            return Err(MechanismError::InvalidParameter {
                name: if queries == 0 { "queries" } else { "n_members" },
                value: 0.0,
                reason: "must be at least 1",
            });
        }
        if orders.as_slice()[0] > max_accounted_order(alpha_c) {
            return Err(MechanismError::InvalidParameter {
                name: "alpha_c",
                value: alpha_c,
                reason: "no order of the account is ≤ α_c²/(2α_c − 1): every charge would be +∞",
            });
        }
        check_spent(spent, epsilon, delta)?;
        let feasible = |b: f64| -> Result<bool, MechanismError> {
            let run = pmixed_curve(orders, alpha_c, b, n_members, q)?.self_compose(queries);
            let curve = match spent {
                Some(spent) => spent.compose(&run)?,
                None => run,
            };
            Ok(curve.epsilon(delta)?.epsilon <= epsilon)
        };
        // b = 0 (the public model alone) charges nothing, so the search starts
        // feasible and returns 0 when no positive radius fits (e.g. no order
        // ≤ α_max converts below ε at δ); f64::MAX when every radius fits (q = 0).
        let b = largest_feasible("radius", 0.0, epsilon / queries as f64, feasible)?;
        Self::new(alpha_c, b, q)
    }

    /// The enforcement order α_c.
    pub fn alpha_c(&self) -> f64 {
        self.alpha_c
    }

    /// The radius b.
    pub fn radius(&self) -> f64 {
        self.radius
    }

    /// The sampling probability q.
    pub fn q(&self) -> f64 {
        self.q
    }

    /// The per-query charge for ensembles of `n_members` ([`pmixed_curve`]).
    pub fn curve(&self, orders: &Orders, n_members: u64) -> Result<RdpCurve, MechanismError> {
        pmixed_curve(orders, self.alpha_c, self.radius, n_members, self.q)
    }
}

/// PMixED's projection of any member of one ensemble: the public row validated
/// once per step (not once per member), the order, and the radius. Each solve is
/// privmix-mixing's certified one: it enforces the radius less a margin enclosing the
/// divergence evaluator's error ([`privmix_mixing::enforced_radius`]), so the exact
/// divergence of the returned mixture is at most b, the radius every charge is
/// computed from.
struct Projector<'a> {
    ensemble: &'a Ensemble,
    public: ValidatedRow<'a>,
    order: Order,
    radius: f64,
}

impl<'a> Projector<'a> {
    fn new(ensemble: &'a Ensemble, alpha_c: f64, radius: f64) -> Result<Self, MechanismError> {
        // A bad order is reported before a bad public row.
        let order = Order::new(alpha_c)?;
        Ok(Projector {
            ensemble,
            public: ensemble.public_row(),
            order,
            radius,
        })
    }

    /// Member `i`'s projection toward p₀.
    fn solve(&self, i: usize) -> Result<Solution, MechanismError> {
        Ok(PmixedProjection::from_rows(
            &self.ensemble.member_row(i),
            &self.public,
            self.order,
            self.radius,
        )?
        .solve_certified()?)
    }
}

/// Projects each listed member toward p₀ (in parallel) and returns the
/// solutions, in the order of `members`.
pub(crate) fn solve_lambdas(
    ensemble: &Ensemble,
    members: &[usize],
    alpha_c: f64,
    radius: f64,
) -> Result<Vec<Solution>, MechanismError> {
    let projector = Projector::new(ensemble, alpha_c, radius)?;
    members.par_iter().map(|&i| projector.solve(i)).collect()
}

/// Fixed number of member groups of [`solve_and_sum`]: the sum's rounding depends on
/// this constant only, never on the number of threads.
const SUM_GROUPS: usize = 16;

/// [`solve_lambdas`] for every member, and `S = Σᵢ (λᵢ·pᵢ + (1 − λᵢ)·p₀)` formed
/// while each member's row is still in cache: members are split into
/// [`SUM_GROUPS`] contiguous groups, each summed in member order on one worker,
/// and the group sums are added in group order (deterministic).
///
/// `buffers` holds the group sums (and S) between calls. Why: they are vocabulary-sized
/// (16 × 400 KB for GPT-2), and fresh buffers of that size come from the
/// allocator as new pages each step (page faults and zeroing), a cost that varies
/// with the heap's state. Their contents are
/// never read before being written: each group's first member writes its mixture
/// (bitwise `0 + x`).
pub(crate) fn solve_and_sum(
    ensemble: &Ensemble,
    alpha_c: f64,
    radius: f64,
    buffers: &mut StepBuffers,
) -> Result<(Vec<Solution>, Vec<f64>), MechanismError> {
    let partials = &mut buffers.partials;
    let projector = Projector::new(ensemble, alpha_c, radius)?;
    let members: Vec<usize> = (0..ensemble.len()).collect();
    let group = members.len().div_ceil(SUM_GROUPS).max(1);
    let groups = members.len().div_ceil(group);
    partials.resize_with(groups, Vec::new);
    let solved: Vec<Vec<Solution>> = members
        .par_chunks(group)
        .zip(partials.par_iter_mut())
        .map(|(g, partial)| {
            partial.resize(ensemble.vocab(), 0.0);
            let mut solutions = Vec::with_capacity(g.len());
            for &i in g {
                let solution = projector.solve(i)?;
                add_mixture(
                    partial,
                    ensemble.member(i),
                    ensemble.public(),
                    solution.lambda,
                    solutions.is_empty(),
                );
                solutions.push(solution);
            }
            Ok(solutions)
        })
        .collect::<Result<_, MechanismError>>()?;
    // The group sums added in group order, in parallel over vocabulary chunks
    // (a serial pass over 16 vocabulary-sized buffers is a step's worth of waiting).
    let mut sum = std::mem::take(&mut buffers.sum);
    // Every entry is written below (the first group's sum is copied in).
    sum.resize(ensemble.vocab(), 0.0);
    let partials = &partials[..groups];
    sum.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let start = c * CHUNK;
        out.copy_from_slice(&partials[0][start..start + out.len()]);
        for partial in &partials[1..] {
            let part = &partial[start..start + out.len()];
            out.iter_mut().zip(part).for_each(|(a, &b)| *a += b);
        }
    });
    Ok((solved.into_iter().flatten().collect(), sum))
}

/// Vocabulary-sized buffers kept between steps (its `Debug` shows their number,
/// not their contents): [`solve_and_sum`]'s group sums, and spare buffers for the
/// next step's sum `S` and output distribution, handed back after a step. Fresh
/// buffers of that size are new pages from the allocator every step (page faults
/// and zeroing); none of these is read before being written.
#[derive(Clone, Default)]
pub(crate) struct StepBuffers {
    pub(crate) partials: Vec<Vec<f64>>,
    pub(crate) sum: Vec<f64>,
    pub(crate) distribution: Vec<f64>,
}

impl std::fmt::Debug for StepBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepBuffers({} group sums)", self.partials.len())
    }
}

/// `acc += λ·p + (1 − λ)·p₀` (or `acc = …` when `first`, the same value as adding
/// to zero), compiled for the CPU's widest vectors (the entry is the expression
/// [`PmixedProjection::mixture`] uses).
fn add_mixture(acc: &mut [f64], p: &[f64], p0: &[f64], lambda: f64, first: bool) {
    struct Add<'a>(&'a mut [f64], &'a [f64], &'a [f64], f64, bool);
    impl pulp::WithSimd for Add<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            let Add(acc, p, p0, lambda, first) = self;
            let mu = 1.0 - lambda;
            if first {
                for ((a, &p), &q) in acc.iter_mut().zip(p).zip(p0) {
                    *a = lambda * p + mu * q;
                }
            } else {
                for ((a, &p), &q) in acc.iter_mut().zip(p).zip(p0) {
                    *a += lambda * p + mu * q;
                }
            }
        }
    }
    pulp::Arch::new().dispatch(Add(acc, p, p0, lambda, first));
}

/// `out[x] = Σ_k (λ_k·p_{members[k]}(x) + (1 − λ_k)·p₀(x))`, summed over k in
/// order (deterministic), parallel over vocabulary chunks. The mixture entry is
/// the expression [`PmixedProjection::mixture`] uses.
pub(crate) fn mixture_sum(
    ensemble: &Ensemble,
    members: &[usize],
    lambdas: &[f64],
    out: &mut [f64],
) {
    let public = ensemble.public();
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, acc)| {
        let start = c * CHUNK;
        let p0 = &public[start..start + acc.len()];
        acc.fill(0.0);
        for (&i, &lambda) in members.iter().zip(lambdas) {
            let mu = 1.0 - lambda;
            let row = &ensemble.member(i)[start..start + acc.len()];
            for ((a, &p), &q) in acc.iter_mut().zip(row).zip(p0) {
                *a += lambda * p + mu * q;
            }
        }
    });
}

/// The output distribution of one PMixED query for a fixed draw, with the
/// solutions of the drawn members' projections.
#[derive(Debug, Clone, PartialEq)]
pub struct PmixedOutput {
    /// The average of the drawn members' mixtures (p₀ if none was drawn).
    pub distribution: Vec<f64>,
    /// The projection of each drawn member, in the order of the draw.
    pub solutions: Vec<Solution>,
}

/// The PMixED mechanism (see the module docs for its guarantee).
#[derive(Debug, Clone)]
pub struct Pmixed {
    config: PmixedConfig,
    cached: Option<(Orders, usize, RdpCurve)>,
    /// A released distribution handed back ([`EnsembleMechanism::recycle`]), whose
    /// buffer the next release reuses: a fresh vocabulary-sized buffer per step
    /// costs page faults. Its contents are never read.
    spare: Vec<f64>,
}

impl Pmixed {
    /// A mechanism with a validated configuration.
    pub fn new(config: PmixedConfig) -> Self {
        Self {
            config,
            cached: None,
            spare: Vec::new(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &PmixedConfig {
        &self.config
    }

    /// Poisson subsampling: each of `n` members independently with probability
    /// q, returned in increasing order. q = 1 keeps all, q = 0 none.
    pub fn draw_members(&self, n: usize, rng: &mut impl Rng) -> Vec<usize> {
        // Exact Bernoulli(q) per member (`u < q` with a 53-bit u would draw with
        // probability ⌈q·2⁵³⌉/2⁵³ ≥ q); q ∈ [0, 1] is checked by `PmixedConfig`.
        let mut bits = crate::noise::RngBits::new(rng);
        (0..n)
            .filter(|_| crate::noise::bernoulli_unit(self.config.q, &mut bits))
            .collect()
    }

    /// The output distribution for a fixed draw: `drawn` must be strictly
    /// increasing member indices (else [`MechanismError::InvalidParameter`]).
    /// The exact property tests enumerate every draw through this function.
    pub fn output_distribution(
        &self,
        ensemble: &Ensemble,
        drawn: &[usize],
    ) -> Result<PmixedOutput, MechanismError> {
        self.output_distribution_in(ensemble, drawn, Vec::new())
    }

    /// [`Pmixed::output_distribution`] written into `distribution`'s buffer (whatever it
    /// holds).
    fn output_distribution_in(
        &self,
        ensemble: &Ensemble,
        drawn: &[usize],
        mut distribution: Vec<f64>,
    ) -> Result<PmixedOutput, MechanismError> {
        if let Some(w) = drawn.windows(2).find(|w| w[0] >= w[1]) {
            return Err(MechanismError::InvalidParameter {
                name: "drawn",
                value: w[1] as f64,
                reason: "drawn members must be strictly increasing (each at most once)",
            });
        }
        if let Some(&bad) = drawn.iter().find(|&&i| i >= ensemble.len()) {
            return Err(MechanismError::InvalidParameter {
                name: "drawn",
                value: bad as f64,
                reason: "member index out of range",
            });
        }
        if drawn.is_empty() {
            distribution.clear();
            distribution.extend_from_slice(ensemble.public());
            return Ok(PmixedOutput {
                distribution,
                solutions: Vec::new(),
            });
        }
        let solutions = solve_lambdas(ensemble, drawn, self.config.alpha_c, self.config.radius)?;
        let lambdas: Vec<f64> = solutions.iter().map(|s| s.lambda).collect();
        // Every entry is written by `mixture_sum` (each chunk is zeroed first).
        distribution.resize(ensemble.vocab(), 0.0);
        mixture_sum(ensemble, drawn, &lambdas, &mut distribution);
        averaging::average_in_place(&mut distribution, drawn.len());
        Ok(PmixedOutput {
            distribution,
            solutions,
        })
    }

    /// The per-query charge for `n_members` at `orders`, computed once and
    /// reused while the orders and ensemble size stay the same.
    pub fn charge_curve(
        &mut self,
        orders: &Orders,
        n_members: usize,
    ) -> Result<&RdpCurve, MechanismError> {
        let stale = !matches!(&self.cached, Some((o, n, _)) if o == orders && *n == n_members);
        if stale {
            let curve = self.config.curve(orders, n_members as u64)?;
            self.cached = Some((orders.clone(), n_members, curve));
        }
        Ok(&self.cached.as_ref().expect("just filled").2)
    }
}

impl EnsembleMechanism for Pmixed {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        if ensemble.is_empty() {
            return Err(MechanismError::EmptyEnsemble);
        }
        let charge = self.charge_curve(account.orders(), ensemble.len())?.clone();
        let drawn = self.draw_members(ensemble.len(), rng);
        let spare = std::mem::take(&mut self.spare);
        let output = self.output_distribution_in(ensemble, &drawn, spare)?;
        account.charge(&charge, self.name())?;
        Ok(Release {
            charge,
            diagnostics: Diagnostics {
                lambdas: output.solutions.iter().map(|s| s.lambda).collect(),
                public_reason: drawn.is_empty().then_some(PublicReason::NoMemberDrawn),
                solver_evaluations: output
                    .solutions
                    .iter()
                    .map(|s| s.evaluations as usize)
                    .sum(),
                drawn,
            },
            distribution: output.distribution,
        })
    }

    fn recycle(&mut self, distribution: Vec<f64>) {
        self.spare = distribution;
    }

    fn name(&self) -> &'static str {
        "pmixed"
    }
}

/// Refuses a run after `spent` when `spent` alone converts to at least ε at δ:
/// no radius leaves room for a query.
pub(crate) fn check_spent(
    spent: Option<&RdpCurve>,
    epsilon: f64,
    delta: f64,
) -> Result<(), MechanismError> {
    if let Some(spent) = spent
        && spent.epsilon(delta)?.epsilon >= epsilon
    {
        return Err(MechanismError::InvalidParameter {
            name: "epsilon",
            value: epsilon,
            reason: "what is already spent converts to at least this ε at δ: nothing is left for a run",
        });
    }
    Ok(())
}

/// Every distribution of `ensemble` (public and members) raised to the power
/// 1/`temperature` and renormalised, in log space (zeros stay zero).
///
/// A pre-processing of the models' outputs, before any mechanism (see the
/// module docs for why that costs no privacy and why it is not applied to a
/// mechanism's output). `temperature` must be finite and > 0.
pub fn temper(ensemble: &Ensemble, temperature: f64) -> Result<Ensemble, MechanismError> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(MechanismError::InvalidParameter {
            name: "temperature",
            value: temperature,
            reason: "the temperature must be finite and > 0",
        });
    }
    let scale = |row: &[f64]| -> Vec<f64> {
        let logs: Vec<f64> = row.iter().map(|&p| p.ln() / temperature).collect();
        let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = logs.iter().map(|&l| (l - max).exp()).collect();
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    };
    let public = scale(ensemble.public());
    let mut members = Vec::with_capacity(ensemble.members().len());
    for i in 0..ensemble.len() {
        members.extend(scale(ensemble.member(i)));
    }
    Ensemble::from_probabilities(&public, &members)
}

#[cfg(test)]
mod tests;
