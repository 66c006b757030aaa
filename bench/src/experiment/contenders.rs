//! The contenders of one evaluation: each mechanism with its own account, run
//! over the queries in order ([`Contender::observe`]), and the per-ε set of them
//! ([`contenders`]) that the perplexity table and the canary audit both score.

use std::time::Instant;

use privmix_accountant::{Budget, Orders};
use privmix_mechanisms::baselines::{NonPrivateEnsemble, PublicOnly};
use privmix_mechanisms::{
    Account, Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, MechanismError, Pmixed,
    PmixedConfig, PrivacyRng, PublicReason, Release, SubMix, SubmixConfig, Unbudgeted,
};

use serde::{Deserialize, Serialize};

use super::config::ExperimentConfig;
use crate::error::BenchError;

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
}

enum Mechanism {
    Public(PublicOnly),
    Ensemble(NonPrivateEnsemble),
    Pmixed(Pmixed),
    Adapmixed(Box<Adapmixed>),
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
            Accounting::Free(u) => u,
        };
        let mechanism: &mut dyn EnsembleMechanism = match &mut self.mechanism {
            Mechanism::Public(m) => m,
            Mechanism::Ensemble(m) => m,
            Mechanism::Pmixed(m) => m,
            Mechanism::Adapmixed(m) => m.as_mut(),
            Mechanism::Submix(m) => m,
        };
        mechanism.release(ensemble, rng, account)
    }

    /// ε spent so far at δ (None: infinite).
    fn spent(&self) -> Result<Option<f64>, BenchError> {
        let eps = match (&self.accounting, &self.mechanism) {
            (Accounting::Budget(b), _) => b.spent_epsilon(self.delta)?.epsilon,
            (Accounting::Free(u), _) => u.spent().epsilon(self.delta)?.epsilon,
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
        // The radius PMixED would get for the same budget and queries without
        // subsampling (the paper's 3.6 spends a member's whole filter in one query).
        let radius =
            PmixedConfig::calibrate(eps, delta, queries, 1.0, n as u64, plan.alpha_c, orders)?
                .radius();
        let ada = AdapmixedConfig {
            alpha_c: plan.alpha_c,
            radius,
            sigma,
            threshold,
            top_k,
            ..AdapmixedConfig::default()
        }
        .with_calibrated_filter(eps, delta, n, orders)?;
        let parameters = format!(
            "α_c {}, radius {}, σ {sigma}, T {threshold}, k {top_k}, member filter calibrated to the whole run",
            ada.alpha_c, ada.radius
        );
        out.push(Contender::new(
            Mechanism::Adapmixed(Box::new(Adapmixed::new(ada)?)),
            Accounting::Budget(budget()?),
            "adapmixed",
            Some(eps),
            parameters,
            delta,
        ));
        let beta = eps / queries as f64;
        let submix = SubmixConfig::calibrate(
            eps,
            delta,
            queries,
            n / 2,
            2.0,
            beta,
            plan.pmixed_alpha_c,
            orders,
        )?;
        out.push(Contender::new(
            Mechanism::Submix(SubMix::new(submix)),
            Accounting::Budget(budget()?),
            "submix",
            Some(eps),
            format!(
                "{} parts, pair test α 2, β {beta:.3e} (ε / queries), α_c {}, radius {:.4e}, calibrated to {queries} queries",
                n / 2,
                submix.alpha_c(),
                submix.radius()
            ),
            delta,
        ));
    }
    Ok(out)
}
