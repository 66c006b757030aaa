//! Loading the base model, tokenizer and members, building the mechanism, and
//! running model code on the burn backend the command line asks for.

use std::path::Path;

use burn::backend::Flex;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_accountant::{Orders, RdpCurve};
use privmix_ensemble::lora::{LoraAdapter, LoraBase};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_ensemble::stacked::FactorPrecision;
use privmix_mechanisms::baselines::{NonPrivateEnsemble, PublicOnly};
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, EnsembleMechanism, Pmixed, PmixedConfig, RunBudget, SubMix,
    SubmixConfig,
};
use privmix_models::gguf::GgufFile;
use privmix_models::{
    ChatTemplate, DecodeProducts, KvPrecision, LanguageModel, LoadOptions, Model, ModelBackend,
    Tokenizer,
};

use crate::args::{BackendKind, MechanismKind, MechanismParams, ModelArgs};
use crate::error::CliError;

/// Model code generic over the burn backend, run by [`with_backend`] on the one
/// picked at run time (a trait because a closure cannot be generic over a type).
pub trait BackendFn<R> {
    /// Runs on backend `B`, whose device [`with_backend`] opened.
    fn run<B: ModelBackend>(self, device: B::Device) -> Result<R, CliError>;
}

/// Runs `f` on the backend `kind` names, opening its device once: burn-flex on
/// the CPU, wgpu (the device opened by `privmix_models::open_wgpu_device`) or
/// CUDA's default device. A backend this binary was built without is a
/// [`CliError::BackendNotBuilt`] naming the cargo feature that builds it in.
pub fn with_backend<R>(kind: BackendKind, f: impl BackendFn<R>) -> Result<R, CliError> {
    match kind {
        BackendKind::Flex => f.run::<Flex>(Default::default()),
        BackendKind::Wgpu => run_wgpu(f),
        BackendKind::Cuda => run_cuda(f),
    }
}

#[cfg(feature = "wgpu")]
fn run_wgpu<R>(f: impl BackendFn<R>) -> Result<R, CliError> {
    let device = privmix_models::open_wgpu_device().map_err(|source| CliError::Device {
        backend: BackendKind::Wgpu.name(),
        source,
    })?;
    f.run::<burn::backend::Wgpu>(device)
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu<R>(_f: impl BackendFn<R>) -> Result<R, CliError> {
    Err(CliError::BackendNotBuilt {
        backend: BackendKind::Wgpu.name(),
        feature: "wgpu",
    })
}

#[cfg(feature = "cuda")]
fn run_cuda<R>(f: impl BackendFn<R>) -> Result<R, CliError> {
    f.run::<burn::backend::Cuda>(Default::default())
}

#[cfg(not(feature = "cuda"))]
fn run_cuda<R>(_f: impl BackendFn<R>) -> Result<R, CliError> {
    Err(CliError::BackendNotBuilt {
        backend: BackendKind::Cuda.name(),
        feature: "cuda",
    })
}

/// The base model with its members, on backend `B`.
pub type Runner<B> = EnsembleRunner<B, Model<B>>;

/// A spinner on stderr saying what is loading (drawn only on a terminal).
fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// Loads the base model and every adapter (each checked against the model's
/// shapes) on `device`, with a spinner naming what is loading.
pub fn load_runner<B: ModelBackend>(
    args: &ModelArgs,
    device: &B::Device,
) -> Result<Runner<B>, CliError> {
    let bar = spinner(format!(
        "loading {} on {}",
        args.model.display(),
        args.backend.name()
    ));
    let result = load_runner_inner(args, device, &bar);
    bar.finish_and_clear();
    result
}

fn load_runner_inner<B: ModelBackend>(
    args: &ModelArgs,
    device: &B::Device,
    bar: &ProgressBar,
) -> Result<Runner<B>, CliError> {
    let model = if args.int8_activations {
        if args.model.is_dir() {
            return Err(CliError::arg(
                "--int8-activations",
                "applies to GGUF files (quantised weights); the model is a folder",
            ));
        }
        Model::<B>::load(
            LoadOptions::path(&args.model, device).decode_products(DecodeProducts::Int8Activations),
        )
    } else {
        Model::<B>::load(LoadOptions::path(&args.model, device))
    }
    .map_err(|source| CliError::Model {
        path: args.model.clone(),
        source,
    })?;
    if args.verbose {
        bar.suspend(|| {
            eprintln!("{}", model.plan());
            eprintln!(
                "  KV cache entries: {}; LoRA factors: {}",
                if args.f16_kv { "f16" } else { "f32" },
                if args.f16_factors { "f16" } else { "f32" },
            );
        });
    }
    let base = model.base_shapes().map_err(|source| CliError::Adapter {
        path: args.model.clone(),
        source,
    })?;
    let mut adapters = Vec::with_capacity(args.adapters.len());
    for (i, path) in args.adapters.iter().enumerate() {
        bar.set_message(format!(
            "loading adapter {}/{}: {}",
            i + 1,
            args.adapters.len(),
            path.display()
        ));
        let adapter =
            LoraAdapter::load_peft(path, &base, device).map_err(|source| CliError::Adapter {
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
    bar.set_message("stacking the members' factors");
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

/// The chat template for `--chat`, from where the tokenizer comes from: the
/// folder of `--tokenizer`, else the model folder (`chat_template.jinja` or
/// `tokenizer_config.json`'s `chat_template`), else the GGUF's
/// `tokenizer.chat_template`.
pub fn load_chat_template(args: &ModelArgs) -> Result<ChatTemplate, CliError> {
    let chat_err = |source| CliError::ChatTemplate { source };
    if let Some(path) = &args.tokenizer {
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        return ChatTemplate::from_hf_folder(dir).map_err(chat_err);
    }
    if args.model.is_dir() {
        return ChatTemplate::from_hf_folder(&args.model).map_err(chat_err);
    }
    let gguf = GgufFile::open(&args.model).map_err(|e| CliError::Model {
        path: args.model.clone(),
        source: e.into(),
    })?;
    ChatTemplate::from_gguf(&gguf).map_err(chat_err)
}

/// Checks that the tokenizer's ids fit the model's vocabulary.
pub fn check_vocab<B: ModelBackend>(
    tokenizer: &Tokenizer,
    runner: &Runner<B>,
    path: &Path,
) -> Result<(), CliError> {
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
    /// What the account has already spent: the run is calibrated so that this
    /// curve composed with the run's fits (ε, δ), not the whole budget (RDP
    /// composes order by order, so what is left is not ε minus the spent ε).
    /// Its orders are the run's. `None`: nothing spent.
    pub spent: Option<&'a RdpCurve>,
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
) -> Result<(Box<dyn EnsembleMechanism + Send>, RowLayout), CliError> {
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
                None => calibrate_pmixed(plan, p.q)?,
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
            let screening = AdapmixedConfig {
                alpha_c: p.alpha_c,
                sigma: p.sigma,
                threshold: p.threshold,
                top_k: p.top_k,
                ..AdapmixedConfig::default()
            };
            let config = run_budget(plan).adapmixed(n, screening, p.radius)?;
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
            let config = match p.radius {
                Some(radius) => {
                    let beta = run_budget(plan).submix_beta(p.beta);
                    SubmixConfig::new(n / 2, p.submix_alpha, beta, p.alpha_c, radius)?
                }
                None => calibrate_submix(plan)?,
            };
            let pairs: Vec<(usize, usize)> = (0..n / 2).map(|k| (2 * k, 2 * k + 1)).collect();
            (
                Box::new(SubMix::new(config)),
                RowLayout::submix_pairs(&pairs),
            )
        }
    })
}

/// The plan's budget, the one input of every calibration
/// ([`privmix_mechanisms::RunBudget`]: the rules live there, shared with the
/// benchmark).
fn run_budget<'a>(plan: &MechanismPlan<'a>) -> RunBudget<'a> {
    RunBudget {
        epsilon: plan.epsilon,
        delta: plan.delta,
        queries: plan.queries.max(1),
        spent: plan.spent,
        orders: plan.orders,
    }
}

/// SubMix over `members / 2` pairs, its radius calibrated to the plan's budget
/// (after what the account has spent, when it has).
fn calibrate_submix(plan: &MechanismPlan<'_>) -> Result<SubmixConfig, CliError> {
    let p = plan.params;
    Ok(run_budget(plan).submix(plan.members, p.submix_alpha, p.beta, p.alpha_c)?)
}

/// The radius [`build_mechanism`] calibrates for `plan` when none is given
/// (PMixED, AdaPMixED, SubMix; `None` for the others): a function of the plan
/// alone, so that a server calibrates once and builds every request's mechanism
/// with `--radius` set to it.
pub fn calibrated_radius(plan: &MechanismPlan<'_>) -> Result<Option<f64>, CliError> {
    let p = plan.params;
    let n = plan.members;
    if p.radius.is_some() || n == 0 {
        return Ok(p.radius);
    }
    Ok(match plan.kind {
        MechanismKind::Pmixed => Some(calibrate_pmixed(plan, p.q)?.radius()),
        MechanismKind::Adapmixed => Some(calibrate_pmixed(plan, 1.0)?.radius()),
        MechanismKind::Submix if n >= 2 && n.is_multiple_of(2) => {
            Some(calibrate_submix(plan)?.radius())
        }
        _ => None,
    })
}

/// PMixED's largest radius for the plan's queries (members Poisson-sampled at
/// `q`): after the plan's spent curve when there is one.
fn calibrate_pmixed(plan: &MechanismPlan<'_>, q: f64) -> Result<PmixedConfig, CliError> {
    Ok(run_budget(plan).pmixed(plan.members, q, plan.params.alpha_c)?)
}
