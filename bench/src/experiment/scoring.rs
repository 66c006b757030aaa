//! Teacher-forced perplexity of every mechanism on the held-out blocks.
//!
//! Convention of the PMixED, AdaPMixED and SubMix evaluations: every position of
//! a block is one query; the mechanism's output distribution given the true
//! prefix is evaluated at the true next token; perplexity is `exp(mean NLL)` per
//! block, then the mean over blocks. Each query is charged to the mechanism's
//! account exactly as if its token had been sampled and released
//! ([`EnsembleMechanism::release`]), in order, so a budget that runs out, a
//! SubMix STOP or an AdaPMixED screen affect the later queries as when serving.

use std::time::Instant;

use burn::backend::Flex;
use privmix_accountant::{Budget, Orders, RdpCurve};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::baselines::{NonPrivateEnsemble, PublicOnly};
use privmix_mechanisms::{
    Account, Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, MechanismError, Pmixed,
    PmixedConfig, PrivacyRng, PublicReason, Release, Rows, SubMix, Unbudgeted,
};
use privmix_models::Model;
use serde::{Deserialize, Serialize};

use super::{ExperimentConfig, TrainedMembers};
use crate::error::BenchError;

/// The mechanisms' parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScoringPlan {
    /// PMixED: enforcement order α_c of the λ projections. Its proven bound is
    /// finite only up to α_c²/(2α_c − 1) ≈ α_c/2, and the (ε, δ) conversion at
    /// δ = 1e-5 needs orders near 20 to leave much of a small ε: 36 (the CLI's
    /// default) rather than the paper's 18.
    pub pmixed_alpha_c: f64,
    /// AdaPMixED: enforcement order α_c (Table 4: 18).
    pub alpha_c: f64,
    /// PMixED: Poisson sampling probability of each member.
    pub pmixed_q: f64,
    /// AdaPMixED: projection radius b (the paper's βα = 3.6).
    pub adapmixed_radius: f64,
    /// AdaPMixED: screening noise σ, threshold T and top-k (Table 4: 1e-2, 4.5, 60).
    pub screen: (f64, f64, usize),
    /// AdaPMixED: orders at which the data-dependent loss is computed.
    pub data_dependent_orders: Vec<f64>,
}

impl Default for ScoringPlan {
    fn default() -> Self {
        let table4 = AdapmixedConfig::default();
        Self {
            pmixed_alpha_c: 36.0,
            alpha_c: table4.alpha_c,
            pmixed_q: 1.0,
            adapmixed_radius: table4.radius,
            screen: (table4.sigma, table4.threshold, table4.top_k),
            data_dependent_orders: vec![2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0],
        }
    }
}

/// One mechanism at one target ε.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MechanismResult {
    /// `public`, `ensemble`, `pmixed`, `adapmixed`, `submix` or `dp-sgd`.
    pub mechanism: String,
    /// The target ε (None for the public model and the non-private ensemble).
    pub target_epsilon: Option<f64>,
    /// Mean over blocks of the per-block perplexity.
    pub perplexity: f64,
    /// Each block's perplexity.
    pub block_perplexities: Vec<f64>,
    /// Queries scored.
    pub queries: u64,
    /// Queries answered with private data mixed in.
    pub private_answers: u64,
    /// Queries answered from the public model after noisy screening (AdaPMixED).
    pub screened: u64,
    /// Queries answered from the public model because a budget ran out
    /// (SubMix STOP, or a charge the (ε, δ) budget refused).
    pub stopped: u64,
    /// ε spent at δ after all queries, rounded up (None: no finite guarantee).
    pub spent_epsilon: Option<f64>,
    /// ε spent after each query (empty where it is constant).
    pub spent_trace: Vec<f64>,
    /// Mean λ of each query (0 when answered from the public model).
    pub lambda_trace: Vec<f64>,
    /// Describes the parameters the mechanism was run with.
    pub parameters: String,
    /// Seconds spent in this mechanism's steps (model forwards excluded).
    pub seconds: f64,
}

/// Where a contender's ε is read from.
enum Accounting {
    /// An (ε, δ) budget over RDP curves (PMixED, AdaPMixED).
    Budget(Budget),
    /// No budget: the public model (charges 0) and the non-private ensemble (+∞).
    Free(Unbudgeted),
    /// SubMix keeps its own per-part budgets; the account only records (at SubMix's order).
    Submix(Unbudgeted),
}

enum Mechanism {
    Public(PublicOnly),
    Ensemble(NonPrivateEnsemble),
    Pmixed(Pmixed),
    Adapmixed(Adapmixed),
    Submix(SubMix),
}

pub(crate) struct Contender {
    result: MechanismResult,
    mechanism: Mechanism,
    accounting: Accounting,
    delta: f64,
    block_nll: f64,
    block_len: usize,
}

impl Contender {
    fn new(
        mechanism: Mechanism,
        accounting: Accounting,
        name: &str,
        target: Option<f64>,
        parameters: String,
        delta: f64,
    ) -> Self {
        Self {
            result: MechanismResult {
                mechanism: name.into(),
                target_epsilon: target,
                perplexity: f64::NAN,
                block_perplexities: Vec::new(),
                queries: 0,
                private_answers: 0,
                screened: 0,
                stopped: 0,
                spent_epsilon: None,
                spent_trace: Vec::new(),
                lambda_trace: Vec::new(),
                parameters,
                seconds: 0.0,
            },
            mechanism,
            accounting,
            delta,
            block_nll: 0.0,
            block_len: 0,
        }
    }

    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
    ) -> Result<Release, MechanismError> {
        let account: &mut dyn Account = match &mut self.accounting {
            Accounting::Budget(b) => b,
            Accounting::Free(u) | Accounting::Submix(u) => u,
        };
        let mechanism: &mut dyn EnsembleMechanism = match &mut self.mechanism {
            Mechanism::Public(m) => m,
            Mechanism::Ensemble(m) => m,
            Mechanism::Pmixed(m) => m,
            Mechanism::Adapmixed(m) => m,
            Mechanism::Submix(m) => m,
        };
        mechanism.release(ensemble, rng, account)
    }

    /// ε spent so far at δ (None: infinite).
    fn spent(&self) -> Result<Option<f64>, BenchError> {
        let eps = match (&self.accounting, &self.mechanism) {
            (Accounting::Submix(_), Mechanism::Submix(s)) => {
                s.budgets().spent_epsilon(self.delta)?.epsilon
            }
            (Accounting::Budget(b), _) => b.spent_epsilon(self.delta)?.epsilon,
            (Accounting::Free(u), _) | (Accounting::Submix(u), _) => {
                u.spent().epsilon(self.delta)?.epsilon
            }
        };
        Ok(eps.is_finite().then_some(eps))
    }

    pub(crate) fn observe(
        &mut self,
        ensemble: &Ensemble,
        target: usize,
        rng: &mut PrivacyRng,
    ) -> Result<(), BenchError> {
        let t = Instant::now();
        let (p, lambda) = match self.release(ensemble, rng) {
            Ok(release) => {
                match release.diagnostics.public_reason {
                    Some(PublicReason::Screened) => self.result.screened += 1,
                    Some(PublicReason::Stopped) => self.result.stopped += 1,
                    Some(_) => {}
                    None => self.result.private_answers += 1,
                }
                let l = &release.diagnostics.lambdas;
                let lambda = if l.is_empty() || release.diagnostics.public_reason.is_some() {
                    0.0
                } else {
                    l.iter().sum::<f64>() / l.len() as f64
                };
                (release.distribution[target], lambda)
            }
            Err(MechanismError::ChargeRefused(_)) => {
                // The budget is spent: nothing private is released, the public
                // model answers (it reads no private data).
                self.result.stopped += 1;
                (ensemble.public()[target], 0.0)
            }
            Err(e) => return Err(e.into()),
        };
        self.block_nll -= p.ln();
        self.block_len += 1;
        self.result.queries += 1;
        self.result.lambda_trace.push(lambda);
        if matches!(
            self.mechanism,
            Mechanism::Pmixed(_) | Mechanism::Adapmixed(_) | Mechanism::Submix(_)
        ) {
            let spent = self.spent()?.unwrap_or(f64::INFINITY);
            self.result.spent_trace.push(spent);
        }
        self.result.seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    pub(crate) fn end_block(&mut self) {
        let ppl = (self.block_nll / self.block_len as f64).exp();
        self.result.block_perplexities.push(ppl);
        self.block_nll = 0.0;
        self.block_len = 0;
    }

    pub(crate) fn finish(mut self) -> Result<MechanismResult, BenchError> {
        let b = &self.result.block_perplexities;
        self.result.perplexity = b.iter().sum::<f64>() / b.len() as f64;
        self.result.spent_epsilon = self.spent()?;
        Ok(self.result)
    }
}

/// The SubMix order and per-part RDP budget for a target (ε, δ): the smallest
/// integer order α ≥ 2 whose budget `r` (Balle et al. 2020 conversion inverted)
/// keeps at least half of ε, then `r` shrunk until the accountant's own
/// conversion of `(α, r)` is ≤ ε as evaluated. SubMix's guarantee is `(α, r)`-RDP
/// for every part (submix.txt Prop. 3.1), so its ε is that conversion.
pub fn submix_budget(epsilon: f64, delta: f64) -> Result<(f64, f64), BenchError> {
    for alpha in 2..=256u32 {
        let a = f64::from(alpha);
        let mut r = epsilon - (-1.0 / a).ln_1p() + (delta.ln() + a.ln()) / (a - 1.0);
        if r < 0.5 * epsilon {
            continue;
        }
        for _ in 0..64 {
            let converted = RdpCurve::single(a, r)?.epsilon(delta)?.epsilon;
            if converted <= epsilon {
                return Ok((a, r));
            }
            r *= 1.0 - 1e-9;
        }
    }
    Err(BenchError::Config(format!(
        "no SubMix order up to 256 keeps half of ε = {epsilon} at δ = {delta}"
    )))
}

pub(crate) fn contenders(
    config: &ExperimentConfig,
    queries: u64,
    orders: &Orders,
) -> Result<Vec<Contender>, BenchError> {
    let n = config.members;
    let plan = &config.scoring;
    let delta = config.delta;
    let free = || Accounting::Free(Unbudgeted::new(orders.clone()));
    let mut out = vec![
        Contender::new(
            Mechanism::Public(PublicOnly),
            free(),
            "public",
            None,
            "p0 alone".into(),
            delta,
        ),
        Contender::new(
            Mechanism::Ensemble(NonPrivateEnsemble),
            free(),
            "ensemble",
            None,
            format!("mean of {n} members, no privacy"),
            delta,
        ),
    ];
    for &eps in &config.epsilons {
        let budget = || Budget::new(orders.clone(), eps, delta);
        let pmixed = PmixedConfig::calibrate(
            eps,
            delta,
            queries,
            plan.pmixed_q,
            n as u64,
            plan.pmixed_alpha_c,
            orders,
        )?;
        let parameters = format!(
            "α_c {}, radius {:.4e}, q {}, calibrated to {queries} queries",
            pmixed.alpha_c(),
            pmixed.radius(),
            pmixed.q()
        );
        out.push(Contender::new(
            Mechanism::Pmixed(Pmixed::new(pmixed)),
            Accounting::Budget(budget()?),
            "pmixed",
            Some(eps),
            parameters,
            delta,
        ));
        let (sigma, threshold, top_k) = plan.screen;
        let ada = AdapmixedConfig {
            alpha_c: plan.alpha_c,
            radius: plan.adapmixed_radius,
            sigma,
            threshold,
            top_k,
            data_dependent_orders: Some(plan.data_dependent_orders.clone()),
            ..AdapmixedConfig::default()
        };
        let parameters = format!(
            "α_c {}, radius {}, σ {sigma}, T {threshold}, k {top_k}, until the budget refuses",
            ada.alpha_c, ada.radius
        );
        out.push(Contender::new(
            Mechanism::Adapmixed(Adapmixed::new(ada)?),
            Accounting::Budget(budget()?),
            "adapmixed",
            Some(eps),
            parameters,
            delta,
        ));
        let (alpha, part_budget) = submix_budget(eps, delta)?;
        let beta = part_budget / queries as f64;
        out.push(Contender::new(
            Mechanism::Submix(SubMix::new(n / 2, alpha, beta, part_budget)?),
            // SubMix's guarantee is its part budgets at its one order α; the account only
            // records, so it holds that order alone (a charge curve at every default
            // order costs ~150 divergence passes per query, most at fractional orders).
            Accounting::Submix(Unbudgeted::new(Orders::new(vec![alpha])?)),
            "submix",
            Some(eps),
            format!(
                "{} parts, α {alpha}, part budget {part_budget:.4}, β {beta:.3e} (budget / queries)",
                n / 2
            ),
            delta,
        ));
    }
    Ok(out)
}

/// Scores every mechanism (and each DP-SGD model) on `eval`.
pub fn score_mechanisms(
    config: &ExperimentConfig,
    runner: &EnsembleRunner<Flex, Model<Flex>>,
    eval: &[Vec<u32>],
    trained: &TrainedMembers,
    progress: bool,
) -> Result<Vec<MechanismResult>, BenchError> {
    let n = config.members;
    let dp = trained.dp_sgd.len();
    if runner.num_members() != n + dp {
        return Err(BenchError::Config(format!(
            "the runner holds {} adapters, {n} members and {dp} DP-SGD models expected",
            runner.num_members()
        )));
    }
    let layout = RowLayout::public_and_members(n + dp);
    let queries: u64 = eval.iter().map(|b| b.len() as u64 - 1).sum();
    let orders = Orders::dp_accounting_default();
    let mut contenders = contenders(config, queries, &orders)?;
    let mut dp_nll = vec![(0.0f64, Vec::new()); dp];
    let mut rng = PrivacyRng::from_seed(config.seed);
    let bar = if progress {
        indicatif::ProgressBar::new(eval.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message("scoring held-out blocks");
    for block in eval {
        let steps = runner.score_block_full(&layout, block)?;
        for (i, rows) in steps.iter().enumerate() {
            let v = rows.vocab();
            let flat = rows.as_flat();
            let ensemble = Ensemble::new(
                Rows::LogProbF32(&flat[..v]),
                Rows::LogProbF32(&flat[v..(n + 1) * v]),
            )?;
            let target = block[i + 1] as usize;
            for c in &mut contenders {
                c.observe(&ensemble, target, &mut rng)?;
            }
            for (k, (nll, _)) in dp_nll.iter_mut().enumerate() {
                *nll -= f64::from(flat[(n + 1 + k) * v + target]);
            }
        }
        for c in &mut contenders {
            c.end_block();
        }
        for (nll, ppl) in &mut dp_nll {
            ppl.push((*nll / steps.len() as f64).exp());
            *nll = 0.0;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut results = contenders
        .into_iter()
        .map(Contender::finish)
        .collect::<Result<Vec<_>, _>>()?;
    for ((target, _, spent), (_, ppl)) in trained.dp_sgd.iter().zip(dp_nll) {
        results.push(MechanismResult {
            mechanism: "dp-sgd".into(),
            target_epsilon: Some(*target),
            perplexity: ppl.iter().sum::<f64>() / ppl.len() as f64,
            block_perplexities: ppl,
            queries,
            private_answers: queries,
            screened: 0,
            stopped: 0,
            spent_epsilon: Some(*spent),
            spent_trace: Vec::new(),
            lambda_trace: Vec::new(),
            parameters: format!(
                "{} steps, expected batch {}, clip 1, LoRA as the members",
                config.dp_sgd_steps, config.dp_sgd_batch
            ),
            seconds: 0.0,
        });
    }
    Ok(results)
}
