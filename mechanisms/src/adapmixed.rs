//! AdaPMixED: PMixED with noisy screening and data-dependent accounting
//! (Flemings et al., adapmixed.txt §4, Alg. 1, App. D–E).
//!
//! Per query, with N ≥ 2 members:
//! 1. **Screening.** Mix every member with the small fixed λ_s, average,
//!    keep the top-k indices K of p₀: `s = (1/N)Σᵢ(λ_s pᵢ + (1−λ_s)p₀)|_K`, NOT
//!    renormalised (the reference code renormalises first, which can raise the
//!    sensitivity). Add N(0, σ²) to each of the k entries. Between D and D
//!    minus member i, `s_D − s_{D'} = (λ_s/N)(pᵢ − p̄₋ᵢ)|_K`, whose L2 norm is at
//!    most `√2·λ_s/N`: the Gaussian mechanism costs `(λ_s/(Nσ))²·α`
//!    (accountant `adapmixed_screening`; Mironov 2017 Prop. 7).
//!    Then, as post-processing of the noisy vector: clip negative entries to 0,
//!    renormalise, and compare `D_{α_s}(noisy ‖ p₀|_K renormalised)` with T. Above
//!    T (or nothing left after clipping) the query is answered from p₀
//!    (Alg. 1 line 7: large divergence = potentially expensive query).
//! 2. **Private answer.** Project every member with PMixED's λ (enforcement
//!    order α_c, radius b), output `p = (1/N)Σ p̄ᵢ`, and charge, at each order,
//!    `min(data-dependent, data-independent)`:
//!    * data-dependent: `max_i Dsym_α(p ‖ p₋ᵢ)`, `p₋ᵢ = (1/(N−1))Σ_{j≠i} p̄ⱼ` —
//!      exactly the output on the neighbour without member i (the other λⱼ do
//!      not depend on member i). Built from the running sum S = Σ p̄ⱼ in O(N·V):
//!      `S − p̄ᵢ`, except where p̄ᵢ holds more than half of S (at most one i per
//!      token), where the sum of the others is recomputed, so no entry suffers
//!      cancellation. An additive allowance of `16(N + V + 64)·u·α/(α−1)` (u the
//!      f64 unit roundoff) covers the rounding of these sums and of the
//!      divergence kernel (a first-order error model, not an interval proof),
//!      then the value is rounded up.
//!    * data-independent: the proven `ε(α; max(N, 2))` of [`crate::bounds`].
//!
//!    Both are valid per-order bounds, so their per-order minimum is.
//!
//! The charge is **data-dependent**: its value depends on the private data and
//! is itself sensitive (the paper's caveat, §4.2); it must not be published
//! without sanitisation. It bounds the privacy loss against removal
//! neighbours in the sense of adapmixed Thm 4.2.

use privmix_accountant::{Orders, RdpCurve, adapmixed_screening};
use privmix_mixing::{Solution, top_k_indices};
use privmix_renyi::{Direction, Order, batched_divergence, divergence};
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use crate::bounds::{
    check_enforcement_order, check_probability, check_radius, pmixed_bound_at,
};
use crate::leave_one_out::{fast_order, leave_one_out_divergences, others_sum};
use crate::pmixed::{StepBuffers, solve_and_sum};
use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release,
};

/// AdaPMixED's parameters. [`Default`] is the paper's Table 4 (α 18, β 0.2,
/// σ 1e-2, λ 1e-4, T 4.5, k 60; N = 100 and δ = 1e-5 are properties of the
/// ensemble and of the budget, not of the mechanism).
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
    /// Screening threshold T (default 4.5).
    pub threshold: f64,
    /// Top-k of p₀ the screening looks at (default 60; a k above the
    /// vocabulary size keeps the whole vocabulary).
    pub top_k: usize,
    /// Orders at which the data-dependent loss is computed. `None` (default):
    /// every order of the account. `Some(list)`: only these; an account order α
    /// uses the value at the smallest listed order ≥ α (Rényi divergence is
    /// non-decreasing in the order), and orders above every listed one use the
    /// data-independent bound alone. Each listed order costs one pass over N×V.
    pub data_dependent_orders: Option<Vec<f64>>,
}

impl Default for AdapmixedConfig {
    fn default() -> Self {
        Self {
            alpha_c: 18.0,
            radius: 3.6,
            screen_order: 18.0,
            screen_lambda: 1e-4,
            sigma: 1e-2,
            threshold: 4.5,
            top_k: 60,
            data_dependent_orders: None,
        }
    }
}

impl AdapmixedConfig {
    fn validate(&self) -> Result<(), MechanismError> {
        check_enforcement_order(self.alpha_c)?;
        check_radius(self.radius)?;
        Order::new(self.screen_order)?;
        check_probability("screen_lambda", self.screen_lambda)?;
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
        if let Some(list) = &self.data_dependent_orders {
            if list.is_empty() {
                return Err(bad("data_dependent_orders", 0.0, "the list is empty"));
            }
            for &a in list {
                if !(a.is_finite() && a > 1.0) {
                    return Err(bad(
                        "data_dependent_orders",
                        a,
                        "orders must be finite and > 1",
                    ));
                }
            }
        }
        Ok(())
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

/// The screening decision for one noise draw.
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

/// The AdaPMixED mechanism (see the module docs for its guarantee).
#[derive(Debug, Clone)]
pub struct Adapmixed {
    config: AdapmixedConfig,
    /// The private answer's group sums, S and output buffer, kept between steps (see
    /// `solve_and_sum` and [`EnsembleMechanism::recycle`]); never read before being
    /// written.
    buffers: StepBuffers,
}

impl Adapmixed {
    /// A mechanism with a validated configuration.
    pub fn new(config: AdapmixedConfig) -> Result<Self, MechanismError> {
        config.validate()?;
        Ok(Self {
            config,
            buffers: StepBuffers::default(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &AdapmixedConfig {
        &self.config
    }

    fn check_members(ensemble: &Ensemble) -> Result<(), MechanismError> {
        match ensemble.len() {
            0 => Err(MechanismError::EmptyEnsemble),
            1 => Err(MechanismError::InvalidParameter {
                name: "members",
                value: 1.0,
                reason: "AdaPMixED needs at least 2 members (its neighbour must have one)",
            }),
            _ => Ok(()),
        }
    }

    /// Step 1a: the truncated, un-renormalised screening vector.
    pub fn screening_vector(&self, ensemble: &Ensemble) -> Result<ScreeningVector, MechanismError> {
        if ensemble.is_empty() {
            return Err(MechanismError::EmptyEnsemble);
        }
        let public = ensemble.public();
        let k = self.config.top_k.min(ensemble.vocab());
        let indices = top_k_indices(public, k)?;
        let lambda = self.config.screen_lambda;
        let n = ensemble.len() as f64;
        // In parallel over the indices: each one reads every member's row at a
        // scattered entry (a cache miss per member), summed in member order.
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

    /// Step 1b: the decision for a given noise vector (one entry per index).
    /// Post-processing only: clip at 0, renormalise, compare with T.
    pub fn screen(
        &self,
        ensemble: &Ensemble,
        screening: &ScreeningVector,
        noise: &[f64],
    ) -> Result<ScreenDecision, MechanismError> {
        if noise.len() != screening.values.len() {
            return Err(MechanismError::LengthMismatch {
                what: "screening noise",
                len: noise.len(),
                vocab: screening.values.len(),
            });
        }
        let mut noisy: Vec<f64> = screening
            .values
            .iter()
            .zip(noise)
            .map(|(&v, &z)| (v + z).max(0.0))
            .collect();
        let sum: f64 = noisy.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) {
            return Ok(ScreenDecision {
                divergence: f64::INFINITY,
                answer_privately: false,
            });
        }
        noisy.iter_mut().for_each(|x| *x /= sum);
        let mut p0: Vec<f64> = screening
            .indices
            .iter()
            .map(|&x| ensemble.public()[x])
            .collect();
        let s0: f64 = p0.iter().sum();
        p0.iter_mut().for_each(|x| *x /= s0);
        let d = divergence(&noisy, &p0, Order::new(self.config.screen_order)?)?;
        Ok(ScreenDecision {
            divergence: d,
            answer_privately: d <= self.config.threshold,
        })
    }

    /// Step 2a: every member's projection and the average of the mixtures.
    pub fn private_answer(&mut self, ensemble: &Ensemble) -> Result<PrivateAnswer, MechanismError> {
        Self::check_members(ensemble)?;
        let (solutions, sum) = solve_and_sum(
            ensemble,
            self.config.alpha_c,
            self.config.radius,
            &mut self.buffers,
        )?;
        let n = ensemble.len() as f64;
        let mut distribution = std::mem::take(&mut self.buffers.distribution);
        distribution.resize(sum.len(), 0.0);
        distribution
            .par_iter_mut()
            .zip(&sum)
            .for_each(|(d, &s)| *d = s / n);
        Ok(PrivateAnswer {
            distribution,
            solutions,
            sum,
        })
    }

    /// Step 2b: `max_i Dsym_α(p ‖ p₋ᵢ)` at each of `orders`, as computed (no
    /// allowance, not rounded up), from the running sum.
    pub fn data_dependent_losses(
        &mut self,
        ensemble: &Ensemble,
        answer: &PrivateAnswer,
        orders: &[f64],
    ) -> Result<Vec<f64>, MechanismError> {
        Self::check_members(ensemble)?;
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

    /// The private branch's charge at `orders`: per order
    /// `min(data-dependent + allowance rounded up, data-independent ε(α; N))`.
    pub fn private_charge(
        &mut self,
        ensemble: &Ensemble,
        answer: &PrivateAnswer,
        orders: &Orders,
    ) -> Result<RdpCurve, MechanismError> {
        let account_orders = orders.as_slice();
        let computed: Vec<f64> = match &self.config.data_dependent_orders {
            None => account_orders.to_vec(),
            Some(list) => {
                let mut l = list.clone();
                l.sort_by(f64::total_cmp);
                l.dedup();
                l
            }
        };
        let losses = self.data_dependent_losses(ensemble, answer, &computed)?;
        let (n, v) = (ensemble.len(), ensemble.vocab());
        let base = 16.0 * (n + v + 64) as f64 * f64::EPSILON;
        let (alpha_c, radius) = (self.config.alpha_c, self.config.radius);
        Ok(RdpCurve::from_fn(orders.clone(), |a| {
            let at = computed.partition_point(|&c| c < a);
            let dd = match losses.get(at) {
                Some(&loss) => {
                    let c = computed[at];
                    let allowance = base * c / (c - 1.0);
                    (loss + allowance).next_up()
                }
                None => f64::INFINITY,
            };
            dd.min(pmixed_bound_at(a, alpha_c, radius, n as u64, 1.0))
        })?)
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
        Self::check_members(ensemble)?;
        let orders = account.orders().clone();
        let screen_cost = adapmixed_screening(
            &orders,
            self.config.screen_lambda,
            ensemble.len() as u64,
            self.config.sigma,
        )?;
        let screening = self.screening_vector(ensemble)?;
        let normal =
            Normal::new(0.0, self.config.sigma).map_err(|_| MechanismError::InvalidParameter {
                name: "sigma",
                value: self.config.sigma,
                reason: "σ must be finite and > 0",
            })?;
        let noise: Vec<f64> = (0..screening.values.len())
            .map(|_| normal.sample(rng))
            .collect();
        let decision = self.screen(ensemble, &screening, &noise)?;
        if !decision.answer_privately {
            account.charge(&screen_cost, "adapmixed-screened")?;
            return Ok(Release {
                distribution: ensemble.public().to_vec(),
                charge: screen_cost,
                diagnostics: Diagnostics {
                    public_reason: Some(PublicReason::Screened),
                    ..Diagnostics::default()
                },
            });
        }
        let mut answer = self.private_answer(ensemble)?;
        let private = self.private_charge(ensemble, &answer, &orders)?;
        self.buffers.sum = std::mem::take(&mut answer.sum);
        let charge = screen_cost.compose(&private)?;
        account.charge(&charge, self.name())?;
        let main = self.config.alpha_c;
        let data_dependent_loss = orders
            .as_slice()
            .iter()
            .position(|&a| a == main)
            .map(|i| private.epsilons()[i]);
        Ok(Release {
            charge,
            diagnostics: Diagnostics {
                lambdas: answer.solutions.iter().map(|s| s.lambda).collect(),
                drawn: (0..ensemble.len()).collect(),
                public_reason: None,
                data_dependent_loss,
                solver_evaluations: answer
                    .solutions
                    .iter()
                    .map(|s| s.evaluations as usize)
                    .sum(),
            },
            distribution: answer.distribution,
        })
    }

    fn name(&self) -> &'static str {
        "adapmixed"
    }

    fn recycle(&mut self, distribution: Vec<f64>) {
        self.buffers.distribution = distribution;
    }
}
