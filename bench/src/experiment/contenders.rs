//! The contenders of one evaluation: each mechanism with its own account, run
//! over the queries in order ([`Contender::observe`]), and the per-ε set of them
//! ([`contenders`]) that the perplexity table and the canary audit both score.

use std::time::Instant;

use privmix_accountant::{AccountantError, Budget, Orders, RdpCurve, smallest_feasible};
use privmix_mechanisms::baselines::{
    Gnmax, NonPrivateEnsemble, PublicOnly, SubsampleAggregateLaplace,
};
use privmix_mechanisms::step_loop::settle_charged;
use privmix_mechanisms::{
    Account, Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, MechanismError, Pmixed,
    PmixedConfig, PrivacyRng, PublicReason, Release, RunBudget, SubMix, Unbudgeted,
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
    /// exp(mean NLL) over all the queries (the papers' perplexity).
    pub perplexity: f64,
    /// Each block's perplexity.
    pub block_perplexities: Vec<f64>,
    /// Whether each query's true token was the mode of the released
    /// distribution (greedy decoding would emit it).
    #[serde(default)]
    pub greedy_hits: Vec<bool>,
    /// AdaPMixED: ε at δ of the noisy screening alone over all the queries.
    #[serde(default)]
    pub screening_epsilon: Option<f64>,
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
    /// Scored by its induced law ([`super::induced`]), charged its curve.
    SaLaplace(SubsampleAggregateLaplace, RdpCurve),
    /// Scored by the SubMix paper's bound on its induced law, charged its curve.
    Gnmax(Gnmax, RdpCurve),
}

pub(crate) struct Contender {
    result: MechanismResult,
    mechanism: Mechanism,
    accounting: Accounting,
    delta: f64,
    block_nll: f64,
    block_len: usize,
    total_nll: f64,
    members: usize,
    /// Each query is a deployment of its own (the `B = 1` rows): the reported
    /// ε is one query's, not the sum over queries.
    single_query: bool,
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
                greedy_hits: Vec::new(),
                screening_epsilon: None,
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
            total_nll: 0.0,
            members: 0,
            single_query: false,
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
            Mechanism::SaLaplace(_, curve) | Mechanism::Gnmax(_, curve) => {
                // Charged exactly as `release` charges; the score is the
                // induced law's, which needs no draw.
                account.charge(curve, "prediction baseline")?;
                return Ok(Release {
                    distribution: Vec::new(),
                    charge: curve.clone(),
                    diagnostics: Default::default(),
                });
            }
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
        // The step loop: each contender's account commits its charge as it steps, so
        // the release is settled with nothing pending; a refusal answers publicly.
        let (p, lambda) = match settle_charged(self.release(ensemble, rng))? {
            Some(release) => {
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
                match &self.mechanism {
                    Mechanism::SaLaplace(m, _) => {
                        let (p, mode) = super::induced::sa_laplace(ensemble, m.scale(), target)?;
                        self.result.greedy_hits.push(mode);
                        (p, 0.0)
                    }
                    Mechanism::Gnmax(m, _) => {
                        let (p, mode) = super::induced::gnmax_bound(ensemble, m.sigma(), target)?;
                        self.result.greedy_hits.push(mode);
                        (p, 0.0)
                    }
                    _ => {
                        let d = &release.distribution;
                        self.result.greedy_hits.push(is_mode(d, target));
                        (d[target], lambda)
                    }
                }
            }
            None => {
                // The budget is spent: nothing private is released, the public
                // model answers (it reads no private data).
                self.result.stopped += 1;
                self.result
                    .greedy_hits
                    .push(is_mode(ensemble.public(), target));
                (ensemble.public()[target], 0.0)
            }
        };
        self.block_nll -= p.ln();
        self.total_nll -= p.ln();
        self.block_len += 1;
        self.result.queries += 1;
        self.result.lambda_trace.push(lambda);
        if !self.single_query
            && matches!(
                self.mechanism,
                Mechanism::Pmixed(_)
                    | Mechanism::Adapmixed(_)
                    | Mechanism::Submix(_)
                    | Mechanism::SaLaplace(..)
                    | Mechanism::Gnmax(..)
            )
        {
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
        self.result.perplexity = (self.total_nll / self.result.queries.max(1) as f64).exp();
        self.result.spent_epsilon = self.spent()?;
        if self.single_query
            && let Mechanism::SaLaplace(_, curve) | Mechanism::Gnmax(_, curve) = &self.mechanism
        {
            let eps = curve.epsilon(self.delta)?.epsilon;
            self.result.spent_epsilon = eps.is_finite().then_some(eps);
        }
        if let Mechanism::Adapmixed(m) = &self.mechanism
            && m.config().radius > 0.0
        {
            // (With radius 0 every answer is the public row whatever the
            // screening decides, so nothing is charged for it.)
            let orders = Orders::dp_accounting_default();
            let screening = m
                .config()
                .screening_cost(&orders, self.members)?
                .self_compose(self.result.private_answers + self.result.screened);
            let eps = screening.epsilon(self.delta)?.epsilon;
            self.result.screening_epsilon = eps.is_finite().then_some(eps);
        }
        Ok(self.result)
    }
}

/// Whether `target` holds the largest mass of `d` (ties count as a hit only
/// for the first index, as greedy decoding breaks them).
fn is_mode(d: &[f64], target: usize) -> bool {
    let mut best = 0;
    for (i, &v) in d.iter().enumerate() {
        if v > d[best] {
            best = i;
        }
    }
    best == target
}

/// The prediction baselines' noise for `queries` queries within (ε, δ): the
/// smallest S&A-Laplace scale and GNMax σ whose `queries`-fold composition
/// converts to at most ε at δ (each checked feasible as evaluated).
fn baseline_noise(
    eps: f64,
    delta: f64,
    queries: u64,
    members: usize,
    vocab: usize,
    orders: &Orders,
) -> Result<(SubsampleAggregateLaplace, Gnmax), BenchError> {
    let fits = |curve: RdpCurve| -> Result<bool, AccountantError> {
        Ok(curve.self_compose(queries).epsilon(delta)?.epsilon <= eps)
    };
    let scale = smallest_feasible("S&A-Laplace scale", 1e12, |b| {
        let m =
            SubsampleAggregateLaplace::new(b).map_err(|_| AccountantError::InvalidParameter {
                name: "scale",
                value: b,
                reason: "not a Laplace scale",
            })?;
        let curve =
            m.curve(orders, members, vocab)
                .map_err(|_| AccountantError::InvalidParameter {
                    name: "scale",
                    value: b,
                    reason: "no curve",
                })?;
        fits(curve)
    })?;
    let sigma = smallest_feasible("GNMax sigma", 1e12, |s| {
        let m = Gnmax::new(s).map_err(|_| AccountantError::InvalidParameter {
            name: "sigma",
            value: s,
            reason: "not a noise scale",
        })?;
        let curve = m
            .curve(orders)
            .map_err(|_| AccountantError::InvalidParameter {
                name: "sigma",
                value: s,
                reason: "no curve",
            })?;
        fits(curve)
    })?;
    Ok((SubsampleAggregateLaplace::new(scale)?, Gnmax::new(sigma)?))
}

/// Every mechanism at every target ε, each with its own account, calibrated to
/// `queries` queries; `vocab` is the model's vocabulary (the S&A sensitivity
/// depends on it); `baselines` adds S&A-Laplace and GNMax, calibrated to the
/// run and to a single query (`B = 1`, the SubMix paper's Fig. 2 end point: each
/// query scored as a deployment of its own, so no budget runs across queries).
pub(crate) fn contenders(
    config: &ExperimentConfig,
    queries: u64,
    vocab: usize,
    baselines: bool,
    orders: &Orders,
) -> Result<Vec<Contender>, BenchError> {
    let mut out = mixing_contenders(config, queries, orders)?;
    if baselines {
        let n = config.members;
        let delta = config.delta;
        for &eps in &config.epsilons {
            for (b, name_sa, name_gn) in [
                (queries, "sa-laplace", "gnmax"),
                (1, "sa-laplace (B=1)", "gnmax (B=1)"),
            ] {
                let (sa, gn) = baseline_noise(eps, delta, b, n, vocab, orders)?;
                let calibrated = if b == 1 {
                    "calibrated to 1 query".to_string()
                } else {
                    format!("calibrated to {b} queries")
                };
                let rows = [
                    (
                        Mechanism::SaLaplace(sa, sa.curve(orders, n, vocab)?),
                        name_sa,
                        format!(
                            "Laplace scale {:.4e} on the mean of {n} members, {calibrated}",
                            sa.scale()
                        ),
                    ),
                    (
                        Mechanism::Gnmax(gn, gn.curve(orders)?),
                        name_gn,
                        format!(
                            "σ {:.4e} on the votes of {n} members, {calibrated}",
                            gn.sigma()
                        ),
                    ),
                ];
                for (mechanism, name, parameters) in rows {
                    // One query is a deployment of its own: no budget runs across queries.
                    let accounting = if b == 1 {
                        Accounting::Free(Unbudgeted::new(orders.clone()))
                    } else {
                        Accounting::Budget(Budget::new(orders.clone(), eps, delta)?)
                    };
                    let mut c =
                        Contender::new(mechanism, accounting, name, Some(eps), parameters, delta);
                    c.single_query = b == 1;
                    out.push(c);
                }
            }
        }
    }
    for c in &mut out {
        c.members = config.members;
    }
    Ok(out)
}

fn mixing_contenders(
    config: &ExperimentConfig,
    queries: u64,
    orders: &Orders,
) -> Result<Vec<Contender>, BenchError> {
    let n = config.members;
    let plan = &config.scoring;
    let delta = config.delta;
    let mut out = reference_contenders(config, orders);
    for &eps in &config.epsilons {
        let budget = || Budget::new(orders.clone(), eps, delta);
        let run = RunBudget {
            epsilon: eps,
            delta,
            queries,
            spent: None,
            orders,
        };
        out.push(pmixed_contender(
            config,
            eps,
            queries,
            plan.pmixed_alpha_c,
            orders,
        )?);
        let (sigma, threshold, top_k) = plan.screen;
        let ada = run.adapmixed(
            n,
            AdapmixedConfig {
                alpha_c: plan.alpha_c,
                sigma,
                threshold,
                top_k,
                ..AdapmixedConfig::default()
            },
            None,
        )?;
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
        let beta = run.submix_beta(None);
        let submix = run.submix(n, 2.0, None, plan.pmixed_alpha_c)?;
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

/// The public model and the non-private ensemble, for the studies' reference
/// rows ([`super::studies`]).
pub(crate) fn reference_contenders(config: &ExperimentConfig, orders: &Orders) -> Vec<Contender> {
    let free = || Accounting::Free(Unbudgeted::new(orders.clone()));
    let n = config.members;
    let mut out = vec![
        Contender::new(
            Mechanism::Public(PublicOnly),
            free(),
            "public",
            None,
            "p0 alone".into(),
            config.delta,
        ),
        Contender::new(
            Mechanism::Ensemble(NonPrivateEnsemble),
            free(),
            "ensemble",
            None,
            format!("mean of {n} members, no privacy"),
            config.delta,
        ),
    ];
    for c in &mut out {
        c.members = n;
    }
    out
}

/// PMixED at target `eps` with enforcement order `alpha_c`, its radius
/// calibrated to `queries` queries (a row of the studies).
pub(crate) fn pmixed_contender(
    config: &ExperimentConfig,
    eps: f64,
    queries: u64,
    alpha_c: f64,
    orders: &Orders,
) -> Result<Contender, BenchError> {
    let n = config.members;
    let pmixed = RunBudget {
        epsilon: eps,
        delta: config.delta,
        queries,
        spent: None,
        orders,
    }
    .pmixed(n, config.scoring.pmixed_q, alpha_c)?;
    let parameters = format!(
        "α_c {}, radius {:.4e}, q {}, calibrated to {queries} queries",
        pmixed.alpha_c(),
        pmixed.radius(),
        pmixed.q()
    );
    let mut c = Contender::new(
        Mechanism::Pmixed(Pmixed::new(pmixed)),
        Accounting::Budget(Budget::new(orders.clone(), eps, config.delta)?),
        "pmixed",
        Some(eps),
        parameters,
        config.delta,
    );
    c.members = n;
    Ok(c)
}

/// The mechanism name of PMixED run at the radius its paper's own accounting
/// allows: a diagnostic, not a DP guarantee.
pub const PMIXED_PAPER: &str = "pmixed (paper's accounting, not a DP guarantee)";

/// PMixED at the radius b = β·α_c that the paper's own accounting allows for
/// `queries` queries within (ε, δ): β from [`super::paper_accounting::paper_beta`]
/// (the paper's per-query bound at every order of `orders`, converted at the
/// best one, as the paper's accountant does), enforced at the main table's α_c.
/// That bound is not proven for a constraint at one order, so the row is a
/// diagnostic of how much of PMixED's gap the accounting makes: it runs
/// without a budget, and its spent ε is what the proven bound charges for the
/// same radius. With members subsampled (q < 1) β is still the unsubsampled
/// one, below what the paper's amplified accounting would allow.
pub(crate) fn pmixed_paper_contender(
    config: &ExperimentConfig,
    eps: f64,
    queries: u64,
    orders: &Orders,
) -> Result<Contender, BenchError> {
    let n = config.members;
    let alpha_c = config.scoring.pmixed_alpha_c;
    let good = super::paper_accounting::paper_beta(eps, config.delta, queries, n as u64, orders)?;
    let pmixed = PmixedConfig::new(alpha_c, good * alpha_c, config.scoring.pmixed_q)?;
    let parameters = format!(
        "α_c {alpha_c}, radius {:.4e} = β·α_c with β {good:.4e}: the paper's bound at every \
         order, converted at the best, for {queries} queries within ε {eps}; spent ε is the \
         proven bound's",
        pmixed.radius()
    );
    let mut c = Contender::new(
        Mechanism::Pmixed(Pmixed::new(pmixed)),
        Accounting::Free(Unbudgeted::new(orders.clone())),
        PMIXED_PAPER,
        Some(eps),
        parameters,
        config.delta,
    );
    c.members = n;
    Ok(c)
}

impl Contender {
    /// Queries observed so far.
    pub(crate) fn queries(&self) -> u64 {
        self.result.queries
    }
}
