//! DPS-MOZO as a step API over a source of in-context-learning logits, its +On and +Off
//! workflows (Flemings et al., "Differentially Private In-context Learning via Sampling
//! Few-shot Mixed with Zero-shot Outputs", arXiv 2501.19287, §4, Alg. 2–3), and the ICL
//! baselines (zero-shot, few-shot).
//!
//! Privacy unit, adjacency and what may be published: see [`DpsMozo`].

use privmix_accountant::{Orders, RdpCurve};

use crate::dps_mozo::{DpsMozoConfig, draw_demonstrations, mixed_output, support};
use crate::driver::{Generation, run_steps};
use crate::{
    Account, Diagnostics, IclOutput, MechanismError, PrivacyRng, PublicReason, StepOutcome,
    sample_log_index,
};

/// Where an ICL mechanism gets its logits: one language model prompted with the query
/// and the tokens generated so far (`context`), either alone (zero-shot) or after one
/// private demonstration (one-shot). Rows are full-vocabulary logits; −∞ is allowed
/// (a zero probability), NaN and +∞ are errors.
///
/// Premise of DPS-MOZO's guarantee (one demonstration is the privacy unit): the
/// one-shot row of demonstration `demo` is a function of that demonstration and the
/// public context alone — a batched forward must not let rows interact — and the
/// zero-shot row of the public context alone. The `drawn` indices `prepare` receives
/// are private (which demonstrations were used): never log or publish them.
pub trait IclSource {
    /// |D|: how many private demonstrations there are.
    fn demonstrations(&self) -> usize;
    /// Called once per step, before any logits of that step are asked for, with the
    /// demonstrations drawn (empty for zero-shot decoding) and the context: a source
    /// backed by a model can compute every row of the step in one batched forward.
    /// The default does nothing.
    fn prepare(&mut self, drawn: &[usize], context: &[u32]) -> Result<(), MechanismError> {
        let _ = (drawn, context);
        Ok(())
    }
    /// Logits of the zero-shot prompt `context` (public: no private data in it).
    fn zero_shot_logits(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError>;
    /// Logits of the one-shot prompt: demonstration `demo` followed by `context`.
    fn one_shot_logits(&mut self, demo: usize, context: &[u32])
    -> Result<Vec<f64>, MechanismError>;
}

/// A mechanism that generates one token from an [`IclSource`] (DPS-MOZO and the ICL
/// baselines). Same contract as [`crate::EnsembleMechanism`]: the account accepts the
/// charge before the token is drawn; a refused charge releases nothing.
pub trait IclMechanism {
    /// One token after `context`.
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError>;

    /// A short name for ledgers and reports.
    fn name(&self) -> &'static str;
}

/// The logits of one step: the zero-shot row, the drawn demonstrations, their rows.
type Fetched = (Vec<f64>, Vec<usize>, Vec<Vec<f64>>);

/// Draws the demonstrations and fetches the logits.
fn fetch(
    source: &mut dyn IclSource,
    context: &[u32],
    n_shots: usize,
    rng: &mut PrivacyRng,
) -> Result<Fetched, MechanismError> {
    let drawn = draw_demonstrations(source.demonstrations(), n_shots, rng)?;
    source.prepare(&drawn, context)?;
    let zero = source.zero_shot_logits(context)?;
    let rows = drawn
        .iter()
        .map(|&d| source.one_shot_logits(d, context))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((zero, drawn, rows))
}

/// The body DPS-MOZO and the few-shot baseline share: draw demonstrations, build
/// the (mixed, when `private`) normalised product, then charge and sample.
#[allow(clippy::too_many_arguments)]
fn draw_mix_release(
    config: &DpsMozoConfig,
    private: bool,
    charge: RdpCurve,
    label: &str,
    source: &mut dyn IclSource,
    context: &[u32],
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<StepOutcome, MechanismError> {
    let (zero, drawn, rows) = fetch(source, context, config.n_shots(), rng)?;
    let refs: Vec<&[f64]> = rows.iter().map(Vec::as_slice).collect();
    let out = mixed_output(config, &zero, &refs, private)?;
    let diagnostics = Diagnostics {
        lambdas: out.lambdas.clone(),
        drawn,
        solver_evaluations: out.solver_evaluations,
        ..Diagnostics::default()
    };
    release(&out, charge, label, diagnostics, rng, account)
}

/// Charges, then samples a token from `out`.
fn release(
    out: &IclOutput,
    charge: RdpCurve,
    label: &str,
    diagnostics: Diagnostics,
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<StepOutcome, MechanismError> {
    account.charge(&charge, label)?;
    let j = sample_log_index(&out.log_probs, rng)?;
    Ok(StepOutcome {
        token: out.support[j],
        charge,
        diagnostics,
    })
}

/// DPS-MOZO (+On when its tokens answer queries; +Off through
/// [`generate_dp_demonstrations`]).
///
/// Guarantee: each token is charged [`DpsMozoConfig::token_charge`] — ε-DP for a fixed
/// subset with ε = 4b plus a proven f64 slack (`dps_mozo_charge`), as RDP
/// `min(ε, αε²/2)`, amplified by sampling `n_shots` of |D| without
/// replacement — for replace-one adjacency of the private demonstration set (proof in
/// `src/dps_mozo/proof.md`). The charge is data-independent, so a
/// calibrated radius ([`crate::calibrate_radius`]) fixes the total for n_test · T_max
/// tokens in advance.
///
/// - Privacy unit: one private demonstration. Adjacency: replace-one — D and D' have the
///   same size and differ in one demonstration, whose one-shot logits may change
///   arbitrarily at every context (the premise on [`IclSource`]). |D| is public: it sets
///   the sampling rate and hence the ε reported. Add/remove adjacency is not claimed.
/// - Published: the tokens and the ε charged. Not covered, never to be published: the
///   step's [`Diagnostics`] (`drawn`, `lambdas`, solver counts) and the output
///   distribution, which are functions of the private set.
/// - With a stop token the guarantee is still the `max_tokens`-fold charge (a fixed
///   horizon); the account's total after an early stop is what was charged.
/// - The guarantee is for the law the token is actually drawn from: `sample_log_index`
///   draws exactly in proportion to stated f64 weights, and the charge's slack covers
///   their rounding (`src/dps_mozo/proof.md`, "The realised per-token ε").
///
/// `tests/integration/verify_dps_mozo.rs` checks this exactly, transcript by transcript, for +On
/// and +Off (vocabularies ≤ 4, ≤ 3 tokens, orders 1.5–32, both directions).
#[derive(Debug, Clone)]
pub struct DpsMozo {
    config: DpsMozoConfig,
    cached: Option<(Orders, usize, RdpCurve)>,
}

impl DpsMozo {
    /// A DPS-MOZO mechanism with `config`.
    pub fn new(config: DpsMozoConfig) -> Self {
        Self {
            config,
            cached: None,
        }
    }

    /// Its parameters.
    pub fn config(&self) -> &DpsMozoConfig {
        &self.config
    }

    /// The per-token charge at `orders` for a set of `dataset_size` demonstrations
    /// (computed once per order set and size).
    pub fn charge(
        &mut self,
        orders: &Orders,
        dataset_size: usize,
    ) -> Result<RdpCurve, MechanismError> {
        if let Some((o, n, c)) = &self.cached
            && o == orders
            && *n == dataset_size
        {
            return Ok(c.clone());
        }
        let c = self.config.token_charge(orders, dataset_size)?;
        self.cached = Some((orders.clone(), dataset_size, c.clone()));
        Ok(c)
    }
}

impl IclMechanism for DpsMozo {
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        let charge = self.charge(account.orders(), source.demonstrations())?;
        draw_mix_release(
            &self.config,
            true,
            charge,
            "dps-mozo",
            source,
            context,
            rng,
            account,
        )
    }

    fn name(&self) -> &'static str {
        "dps-mozo"
    }
}

/// Non-private few-shot baseline: the normalised product of the drawn demonstrations'
/// one-shot distributions on the same top-k support, without mixing (every λ = 1).
/// It offers no privacy, and is charged +∞ at every order — honestly.
#[derive(Debug, Clone)]
pub struct FewShotProduct {
    config: DpsMozoConfig,
}

impl FewShotProduct {
    /// Uses `config`'s `n_shots` and `top_k` (its radius is ignored).
    pub fn new(config: DpsMozoConfig) -> Self {
        Self { config }
    }
}

impl IclMechanism for FewShotProduct {
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        let orders = account.orders().clone();
        let charge = RdpCurve::new(orders.clone(), vec![f64::INFINITY; orders.len()])?;
        draw_mix_release(
            &self.config,
            false,
            charge,
            "few-shot",
            source,
            context,
            rng,
            account,
        )
    }

    fn name(&self) -> &'static str {
        "few-shot"
    }
}

/// Zero-shot baseline: samples the zero-shot distribution truncated to its top-k. It
/// reads no private demonstration, so it is charged zero.
#[derive(Debug, Clone, Copy)]
pub struct ZeroShot {
    top_k: usize,
}

impl ZeroShot {
    /// Keeps the `top_k` ≥ 1 most likely tokens.
    pub fn new(top_k: usize) -> Result<Self, MechanismError> {
        if top_k == 0 {
            return Err(MechanismError::InvalidParameter {
                name: "top_k",
                value: 0.0,
                reason: "at least one index must be kept",
            });
        }
        Ok(Self { top_k })
    }

    /// The output for `zero_shot` logits: the softmax on the top-k support.
    pub fn output(&self, zero_shot: &[f64]) -> Result<IclOutput, MechanismError> {
        let support = support(zero_shot, self.top_k)?;
        let l0 = privmix_mixing::gather(zero_shot, &support)?;
        Ok(IclOutput {
            log_probs: privmix_mixing::log_softmax(&l0)?,
            support,
            lambdas: Vec::new(),
            solver_evaluations: 0,
        })
    }
}

impl IclMechanism for ZeroShot {
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        zero_shot_step(
            |z| self.output(z),
            "zero-shot",
            source,
            context,
            rng,
            account,
        )
    }

    fn name(&self) -> &'static str {
        "zero-shot"
    }
}

/// A step that reads no private demonstration: `source` prepared for none, then a token
/// released from `output` of the zero-shot logits at `context`, charged zero under
/// `label` (the charge is accepted by `account` before the token is drawn). It is
/// public data alone, so the zero charge is exact. [`ZeroShot`] steps through it, and so
/// can any control built on the zero-shot row.
pub fn zero_shot_step(
    output: impl FnOnce(&[f64]) -> Result<IclOutput, MechanismError>,
    label: &str,
    source: &mut dyn IclSource,
    context: &[u32],
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<StepOutcome, MechanismError> {
    source.prepare(&[], context)?;
    let out = output(&source.zero_shot_logits(context)?)?;
    let diagnostics = Diagnostics {
        public_reason: Some(PublicReason::PublicOnly),
        ..Diagnostics::default()
    };
    let charge = RdpCurve::zero(account.orders().clone());
    release(&out, charge, label, diagnostics, rng, account)
}

/// Generates up to `max_tokens` tokens after the query `prompt` (stopping after
/// `stop_token`), each charged to `account` before it is appended (+On). The first error
/// ends generation with nothing more released.
pub fn generate_icl(
    mechanism: &mut dyn IclMechanism,
    source: &mut dyn IclSource,
    prompt: &[u32],
    max_tokens: usize,
    stop_token: Option<u32>,
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<Generation, MechanismError> {
    run_steps(prompt, max_tokens, stop_token, |context| {
        mechanism.step(source, context, rng, account)
    })
}

/// One demonstration generated by DPS-MOZO+Off: a public input and its DP output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpDemonstration {
    /// The public input (prompt tokens).
    pub input: Vec<u32>,
    /// The output generated for it by DPS-MOZO.
    pub output: Vec<u32>,
}

/// Demonstrations produced by DPS-MOZO+Off (Alg. 3, `Offline`): public inputs paired with
/// DP outputs. They can only be made by [`generate_dp_demonstrations`], which charged
/// every generated token; by post-processing (arXiv 2501.19287, Thm A.1) any later use
/// of them — as ordinary few-shot demonstrations, with any decoding, for any number of
/// queries — costs nothing more ([`DpFewShot`] charges zero). `tests/integration/verify_dps_mozo.rs`
/// checks that decoding reads only these (and the context) and that the law of the
/// demonstrations and the decoded tokens together stays within their cost.
#[derive(Debug, Clone, PartialEq)]
pub struct DpDemonstrations {
    demos: Vec<DpDemonstration>,
    cost: RdpCurve,
}

impl DpDemonstrations {
    /// The demonstrations.
    pub fn demonstrations(&self) -> &[DpDemonstration] {
        &self.demos
    }

    /// What generating them cost (the composition of every token's charge).
    pub fn cost(&self) -> &RdpCurve {
        &self.cost
    }
}

/// DPS-MOZO+Off, offline phase: for each public input, generates an output with
/// `mechanism` from the private demonstrations behind `source` (each token charged).
pub fn generate_dp_demonstrations(
    mechanism: &mut DpsMozo,
    source: &mut dyn IclSource,
    public_inputs: &[Vec<u32>],
    max_tokens: usize,
    stop_token: Option<u32>,
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<DpDemonstrations, MechanismError> {
    let mut cost = RdpCurve::zero(account.orders().clone());
    let mut demos = Vec::with_capacity(public_inputs.len());
    for input in public_inputs {
        let g = generate_icl(
            mechanism, source, input, max_tokens, stop_token, rng, account,
        )?;
        for step in &g.steps {
            cost = cost.compose(&step.charge)?;
        }
        demos.push(DpDemonstration {
            input: input.clone(),
            output: g.tokens,
        });
    }
    Ok(DpDemonstrations { demos, cost })
}

/// Logits of a prompt made of DP demonstrations followed by `context`: the online phase
/// of DPS-MOZO+Off (a function of public data and DP outputs only).
pub trait FewShotSource {
    /// Logits for the next token after `demos` then `context`.
    fn few_shot_logits(
        &mut self,
        demos: &[DpDemonstration],
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError>;
}

/// DPS-MOZO+Off, online phase: ordinary few-shot decoding (softmax on the top-k of the
/// logits) with [`DpDemonstrations`] in the prompt. Post-processing of DP outputs: every
/// token is charged zero.
#[derive(Debug, Clone)]
pub struct DpFewShot<'a> {
    demos: &'a DpDemonstrations,
    decode: ZeroShot,
}

impl<'a> DpFewShot<'a> {
    /// Decodes with `demos` in the prompt, keeping the `top_k` most likely tokens.
    pub fn new(demos: &'a DpDemonstrations, top_k: usize) -> Result<Self, MechanismError> {
        Ok(Self {
            demos,
            decode: ZeroShot::new(top_k)?,
        })
    }

    /// One token after `context`, charged zero.
    pub fn step(
        &self,
        source: &mut dyn FewShotSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        let logits = source.few_shot_logits(self.demos.demonstrations(), context)?;
        let out = self.decode.output(&logits)?;
        let charge = RdpCurve::zero(account.orders().clone());
        let diagnostics = Diagnostics {
            public_reason: Some(PublicReason::PublicOnly),
            ..Diagnostics::default()
        };
        release(&out, charge, "dp-few-shot", diagnostics, rng, account)
    }
}
