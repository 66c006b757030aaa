//! Loading the base model, tokenizer and members, and building the mechanism.

use std::path::Path;

use burn::backend::Flex;
use privmix_accountant::Orders;
use privmix_ensemble::lora::{LoraAdapter, LoraBase};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_ensemble::stacked::FactorPrecision;
use privmix_mechanisms::baselines::{NonPrivateEnsemble, PublicOnly};
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, EnsembleMechanism, Pmixed, PmixedConfig, SubMix, SubmixConfig,
};
use privmix_models::gguf::GgufFile;
use privmix_models::{DecodeProducts, KvPrecision, LanguageModel, Model, Tokenizer};

use crate::args::{MechanismKind, MechanismParams, ModelArgs};
use crate::error::CliError;

/// The CPU backend every command runs on.
pub type Backend = Flex;

/// The base model with its members.
pub type Runner = EnsembleRunner<Backend, Model<Backend>>;

/// Loads the base model and every adapter (each checked against the model's shapes).
pub fn load_runner(args: &ModelArgs) -> Result<Runner, CliError> {
    let device = Default::default();
    let model = if args.int8_activations {
        if args.model.is_dir() {
            return Err(CliError::arg(
                "--int8-activations",
                "applies to GGUF files (quantised weights); the model is a folder",
            ));
        }
        Model::<Backend>::load_gguf_with(&args.model, DecodeProducts::Int8Activations, &device)
    } else {
        Model::<Backend>::load(&args.model, &device)
    }
    .map_err(|source| CliError::Model {
        path: args.model.clone(),
        source,
    })?;
    let base = model.base_shapes().map_err(|source| CliError::Adapter {
        path: args.model.clone(),
        source,
    })?;
    let mut adapters = Vec::with_capacity(args.adapters.len());
    for path in &args.adapters {
        let adapter =
            LoraAdapter::load_peft(path, &base, &device).map_err(|source| CliError::Adapter {
                path: path.clone(),
                source,
            })?;
        adapters.push(adapter);
    }
    let precision = if args.f16_factors {
        FactorPrecision::F16
    } else {
        FactorPrecision::F32
    };
    let kv = if args.f16_kv {
        KvPrecision::F16
    } else {
        KvPrecision::F32
    };
    Ok(EnsembleRunner::with_precision(model, &adapters, precision)?.with_kv_precision(kv))
}

/// The tokenizer: `--tokenizer`, else the GGUF's vocabulary, else the folder's tokenizer.json.
/// `Ok(None)` when there is none (the caller then needs token ids).
pub fn load_tokenizer(args: &ModelArgs) -> Result<Option<Tokenizer>, CliError> {
    let tok_err = |e: privmix_models::ModelError| CliError::Tokenizer(e.to_string());
    if let Some(path) = &args.tokenizer {
        return Tokenizer::from_file(path).map(Some).map_err(tok_err);
    }
    if args.model.is_dir() {
        let file = args.model.join("tokenizer.json");
        if file.is_file() {
            return Tokenizer::from_file(file).map(Some).map_err(tok_err);
        }
        return Ok(None);
    }
    let gguf = GgufFile::open(&args.model).map_err(|e| CliError::Model {
        path: args.model.clone(),
        source: e.into(),
    })?;
    Tokenizer::from_gguf(&gguf).map(Some).map_err(tok_err)
}

/// Checks that the tokenizer's ids fit the model's vocabulary.
pub fn check_vocab(tokenizer: &Tokenizer, runner: &Runner, path: &Path) -> Result<(), CliError> {
    let model_vocab = runner.model().vocab_size();
    if tokenizer.vocab_size() > model_vocab {
        return Err(CliError::Tokenizer(format!(
            "the tokenizer has {} tokens but the model {} has a vocabulary of {model_vocab}",
            tokenizer.vocab_size(),
            path.display()
        )));
    }
    Ok(())
}

/// What a mechanism needs to be built.
pub struct MechanismPlan<'a> {
    /// Which mechanism.
    pub kind: MechanismKind,
    /// Its parameters.
    pub params: &'a MechanismParams,
    /// Number of member adapters loaded.
    pub members: usize,
    /// Budget ε the data-independent parameters are calibrated to.
    pub epsilon: f64,
    /// Budget δ.
    pub delta: f64,
    /// Expected number of queries (tokens) the budget must cover.
    pub queries: u64,
    /// The account's orders.
    pub orders: &'a Orders,
}

/// The mechanism and the row layout its ensemble needs (row 0 the public model).
pub fn build_mechanism(
    plan: &MechanismPlan<'_>,
) -> Result<(Box<dyn EnsembleMechanism>, RowLayout), CliError> {
    let p = plan.params;
    let n = plan.members;
    let need_members = |min: usize| {
        if n < min {
            Err(CliError::arg(
                "--adapter",
                format!(
                    "{} needs at least {min} member adapter(s), {n} given",
                    plan.kind.name()
                ),
            ))
        } else {
            Ok(())
        }
    };
    let all = RowLayout::public_and_members(n);
    Ok(match plan.kind {
        MechanismKind::Public => (Box::new(PublicOnly), RowLayout::public_and_members(0)),
        MechanismKind::Ensemble => {
            need_members(1)?;
            (Box::new(NonPrivateEnsemble), all)
        }
        MechanismKind::Pmixed => {
            need_members(1)?;
            let config = match p.radius {
                Some(radius) => PmixedConfig::new(p.alpha_c, radius, p.q)?,
                None => PmixedConfig::calibrate(
                    plan.epsilon,
                    plan.delta,
                    plan.queries.max(1),
                    p.q,
                    n as u64,
                    p.alpha_c,
                    plan.orders,
                )?,
            };
            (Box::new(Pmixed::new(config)), all)
        }
        MechanismKind::Adapmixed => {
            need_members(1)?;
            // The filter budget is calibrated so that the whole run, however many
            // tokens it answers, fits the budget ε at δ.
            // Default radius: PMixED's for the same budget and queries, so that a run of
            // --max-tokens worst-case queries fits; members that stay nearer p₀ spend
            // less and answer longer. (The paper's 3.6 spends a filter in one query.)
            let radius = match p.radius {
                Some(r) => r,
                None => PmixedConfig::calibrate(
                    plan.epsilon,
                    plan.delta,
                    plan.queries.max(1),
                    1.0,
                    n as u64,
                    p.alpha_c,
                    plan.orders,
                )?
                .radius(),
            };
            let config = AdapmixedConfig {
                alpha_c: p.alpha_c,
                radius,
                sigma: p.sigma,
                threshold: p.threshold,
                top_k: p.top_k,
                ..AdapmixedConfig::default()
            }
            .with_calibrated_filter(plan.epsilon, plan.delta, n, plan.orders)?;
            (Box::new(Adapmixed::new(config)?), all)
        }
        MechanismKind::Submix => {
            need_members(2)?;
            if !n.is_multiple_of(2) {
                return Err(CliError::arg(
                    "--adapter",
                    format!(
                        "submix needs two adapters (halves) per part; {n} is odd (pass adapters of part k as the 2k-th and (2k+1)-th)"
                    ),
                ));
            }
            let beta = p.beta.unwrap_or(plan.epsilon / plan.queries.max(1) as f64);
            let config = match p.radius {
                Some(radius) => SubmixConfig::new(n / 2, p.submix_alpha, beta, p.alpha_c, radius)?,
                None => SubmixConfig::calibrate(
                    plan.epsilon,
                    plan.delta,
                    plan.queries.max(1),
                    n / 2,
                    p.submix_alpha,
                    beta,
                    p.alpha_c,
                    plan.orders,
                )?,
            };
            let pairs: Vec<(usize, usize)> = (0..n / 2).map(|k| (2 * k, 2 * k + 1)).collect();
            (
                Box::new(SubMix::new(config)),
                RowLayout::submix_pairs(&pairs),
            )
        }
    })
}
