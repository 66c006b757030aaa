//! `privmix serve`: private completions over an OpenAI-compatible HTTP API.
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions` (streamed as server-sent
//!   events or not), `GET /v1/models`, `GET /health`.
//! - Every request is answered by the configured mechanism over the base model and
//!   its members; concurrent requests are decoded together in one batched forward
//!   (requests × rows), joining and leaving at step boundaries (`engine.rs`).
//! - Every token is charged to the ledger store before it is sent: the embedded file
//!   ledger, or PostgreSQL (`--ledger postgres://…`) shared by several replicas.
//! - API keys (`--api-keys`) name tenants, each with an optional budget of its own
//!   besides the members' total; a spent budget answers 429.
//!
//! Timing: how long a step takes depends on the private data (solver evaluations,
//! λ = 1 shortcuts, AdaPMixED's screening, SubMix's stopping, fallbacks), and a client
//! sees when each token arrives; the ledger does not charge for that channel.
//! `--step-time-ms N` closes it for each request's own tokens (`pace.rs`): step k's
//! output is released at `start + (k + 1)·N`, `start` being when the request's first
//! step started, and a step not done by its deadline ends the request there with
//! `finish_reason: "step_overran"`, its charged token withheld (as
//! `privmix generate --step-time-ms` does). What stays visible with it:
//!
//! - when a request's first step starts: request arrival, prefill (a function of the
//!   prompt) and the queue — which waits on the other requests' steps, whose
//!   durations depend on the private data (the schedule hides a request's own work,
//!   not how long it waited behind other tenants' work);
//! - whether, and at which deadline, a request overran (pick N with a margin over the
//!   slowest step at the load served, `--max-batch` requests decoded together);
//! - the server's aggregate behaviour (throughput, latency of `/health`, CPU load) to
//!   anyone who can measure it.
//!
//! Errors that leave the process (HTTP bodies, server-sent events, stderr) name the
//! kind of problem only, never a private value (`MechanismError::public_description`).

mod admission;
mod api;
mod detok;
mod draw;
mod engine;
#[cfg(test)]
mod engine_refusal_tests;
mod http;
mod job;
mod keys;
mod pace;
mod phases;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use clap::Args;
use tokio::sync::Semaphore;

use privmix_models::{ChatTemplate, ModelBackend, Tokenizer};

use crate::args::ModelArgs;
use crate::error::CliError;
use crate::ledger_store::LedgerStore;
use crate::setup::{
    BackendFn, Runner, check_vocab, load_chat_template, load_runner, load_tokenizer, with_backend,
};

pub use api::Limits;

/// `privmix serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model, members and mechanism.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The ledger every token is charged to: a file (created if absent, with --epsilon)
    /// or a PostgreSQL URL (`postgres://user@host/db`) that several replicas share.
    #[arg(long)]
    pub ledger: String,
    /// Budget ε of a new ledger (required to create one); for an existing ledger it may
    /// only repeat the recorded budget.
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// Budget δ of a new ledger (default 1e-5).
    #[arg(long)]
    pub delta: Option<f64>,
    /// With a PostgreSQL ledger: reserve the budget N charges at a time (a budget lease,
    /// recorded as spent) and spend it locally, instead of taking the ledger's lock at
    /// every step. What a lease has not spent when the server stops or crashes stays
    /// counted as spent.
    #[arg(long, value_name = "N")]
    pub lease_charges: Option<u64>,
    /// ε (at the ledger's δ) one request of --max-tokens tokens is calibrated to: fixes
    /// PMixED's and SubMix's radius and AdaPMixED's filter, data-independently.
    #[arg(long, default_value_t = 1.0)]
    pub request_epsilon: f64,
    /// Largest `max_tokens` a request may ask for (and its default).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u64,
    /// Largest prompt, in tokens.
    #[arg(long, default_value_t = 2048)]
    pub max_prompt_tokens: usize,
    /// Most requests decoded together in one batched forward.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Prompt tokens prefilled per step at most, counted once per row (a request's
    /// prompt length times its rows: public model and members): prompts that fit are
    /// prefilled together, a longer one in chunks over several steps, so that an
    /// arrival holds the running requests' next token back by at most this much work.
    #[arg(long, default_value_t = admission::PREFILL_ROW_TOKENS)]
    pub prefill_budget: usize,
    /// Most requests in flight (decoding or queued); more get 503.
    #[arg(long, default_value_t = 64)]
    pub max_concurrent: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// The API keys file (JSON: {"keys": [{"key", "tenant", "epsilon"?, "delta"?}]}).
    #[arg(long, required_unless_present = "no_auth")]
    pub api_keys: Option<PathBuf>,
    /// Serve without API keys: anyone who can reach the port spends the budget.
    #[arg(long, conflicts_with = "api_keys")]
    pub no_auth: bool,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// The model id clients name (default: the model file's stem).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Release each request's tokens on a fixed schedule: step k's output at k + 1
    /// periods of this many ms after the request's first step started, whatever the
    /// step computed; a step not done by its deadline ends the request there
    /// (`finish_reason: "step_overran"`, its charged token withheld).
    #[arg(long, value_name = "MS")]
    pub step_time_ms: Option<u64>,
    /// Print, every few seconds to stderr, where the decode loop's time goes
    /// (admission, mechanisms, ledger commits, detokenising, joining and leaving the
    /// batch, the forward). These timings depend on the members' data and are not
    /// charged: for benchmarks with members that are not private. Refused unless
    /// --unsafe-uncharged-timings is given too, and refused with --api-keys.
    #[arg(long)]
    pub phase_timings: bool,
    /// Declare that the members hold no private data (random or public adapters), so
    /// that --phase-timings may print timings no budget is charged for.
    #[arg(long)]
    pub unsafe_uncharged_timings: bool,
    /// Multiply a GGUF's Q4_1/Q8_0 weights by f32 activations. The server's default is
    /// `--int8-activations` (llama.cpp's own scheme, held to llama.cpp's outputs by the
    /// agreement tests), which costs a step with many rows a fraction of the time.
    #[arg(long, conflicts_with = "int8_activations")]
    pub f32_activations: bool,
    /// Hold the KV cache in f32. The server's default is `--f16-kv` (llama.cpp's default
    /// cache type): half the cache's memory and bytes read per step.
    #[arg(long, conflicts_with = "f16_kv")]
    pub f32_kv: bool,
}

impl ServeArgs {
    /// The model arguments the server loads with: its precision defaults
    /// (`--int8-activations` for a GGUF file, `--f16-kv`) unless opted out of.
    pub fn model_args(&self) -> crate::args::ModelArgs {
        let mut model = self.model.clone();
        if !self.f32_activations && model.model.is_file() {
            model.int8_activations = true;
        }
        if !self.f32_kv {
            model.f16_kv = true;
        }
        model
    }
}

/// Runs `privmix serve` until SIGINT or SIGTERM, then drains in-flight requests.
pub fn run(args: &ServeArgs) -> Result<(), CliError> {
    check_args(args)?;
    let keys = match &args.api_keys {
        Some(path) => Some(keys::ApiKeys::load(path)?),
        None => None,
    };
    let protected = crate::protected::protected_set(&args.model.adapters)?;
    let mut store =
        crate::ledger_store::open_store(&args.ledger, &protected, args.epsilon, args.delta)
            .map_err(|e| CliError::arg("--ledger", e.to_string()))?;
    // A PostgreSQL ledger holds its tenants' budgets (`privmix ledger tenant-budget`),
    // so that every replica enforces the same ones: a keys file may not give others.
    if let (Some(keys), true) = (
        &keys,
        crate::ledger_store::postgres::is_postgres_url(&args.ledger),
    ) && keys.has_budgets()
    {
        return Err(CliError::arg(
            "--api-keys",
            "gives tenants budgets, but a PostgreSQL ledger holds its tenants' budgets: set them with `privmix ledger tenant-budget URL --tenant NAME --epsilon E` and remove epsilon/delta from the keys file",
        ));
    }
    if let Some(n) = args.lease_charges {
        store
            .use_leases(n)
            .map_err(|e| CliError::arg("--lease-charges", e.to_string()))?;
    }
    let delta = store
        .budget()
        .map_or(crate::ledger_common::DEFAULT_DELTA, |b| b.delta());

    with_backend(
        args.model.backend,
        Serving {
            args,
            model: args.model_args(),
            keys,
            store,
            delta,
        },
    )
}

/// The checks of `serve`'s arguments made before anything is opened or loaded.
///
/// `--phase-timings` prints step durations that depend on the members' data (the
/// mechanisms' solvers and shortcuts) and that no ledger charges for: nothing derived
/// from private data may leave the process uncharged. So the option is refused
/// ([`CliError::Argument`] naming it) unless the operator declares the members not
/// private with `--unsafe-uncharged-timings` (a benchmark with random or public
/// adapters), and always on a server with API keys, whose tenants each spend a budget
/// of the members' privacy.
fn check_args(args: &ServeArgs) -> Result<(), CliError> {
    if args.phase_timings && !args.unsafe_uncharged_timings {
        return Err(CliError::arg(
            "--phase-timings",
            "prints step timings that depend on the members' data and are charged to no \
             budget; give --unsafe-uncharged-timings too to declare the members hold no \
             private data",
        ));
    }
    if args.phase_timings && args.api_keys.is_some() {
        return Err(CliError::arg(
            "--phase-timings",
            "cannot be used with --api-keys: the printed step timings depend on the \
             members' data and are not charged to any budget (use it with --no-auth, \
             on members that are not private)",
        ));
    }
    if args.max_batch == 0 || args.max_concurrent == 0 || args.max_tokens == 0 {
        return Err(CliError::arg(
            "--max-batch/--max-concurrent/--max-tokens",
            "must be at least 1",
        ));
    }
    if args.prefill_budget == 0 {
        return Err(CliError::arg(
            "--prefill-budget",
            "must be at least 1 (row-tokens of prompt per step)",
        ));
    }
    if args.step_time_ms == Some(0) {
        return Err(CliError::arg(
            "--step-time-ms",
            "must be at least 1 (ms between released tokens)",
        ));
    }
    if !(args.request_epsilon.is_finite() && args.request_epsilon > 0.0) {
        return Err(CliError::arg("--request-epsilon", "must be finite and > 0"));
    }
    if args.model.mechanism == crate::args::MechanismKind::Ensemble {
        return Err(CliError::arg(
            "--mechanism",
            "the non-private ensemble cannot be served: every served token is charged",
        ));
    }
    Ok(())
}

/// Everything `serve` prepared before the model loads, run on the chosen backend.
struct Serving<'a> {
    args: &'a ServeArgs,
    /// The model arguments with the server's precision defaults.
    model: crate::args::ModelArgs,
    keys: Option<keys::ApiKeys>,
    store: Box<dyn LedgerStore>,
    delta: f64,
}

impl BackendFn<()> for Serving<'_> {
    fn run<B: ModelBackend>(self, device: B::Device) -> Result<(), CliError> {
        let Serving {
            args,
            model,
            keys,
            mut store,
            delta,
        } = self;
        let runner = load_runner::<B>(&model, &device)?;
        let tokenizer = load_tokenizer(&model)?.ok_or(CliError::NoTokenizer)?;
        check_vocab(&tokenizer, &runner, &model.model)?;
        // A model without a chat template still serves /v1/completions.
        let chat = load_chat_template(&model).map_err(|e| e.to_string());
        let stop_ids = tokenizer.stop_ids().to_vec();
        let model_name = args.model_name.clone().unwrap_or_else(|| {
            args.model
                .model
                .file_stem()
                .map_or_else(|| "privmix".into(), |s| s.to_string_lossy().into_owned())
        });
        let limits = Limits {
            model: model_name,
            max_tokens: args.max_tokens,
            max_prompt_tokens: args.max_prompt_tokens,
        };
        let config = engine::EngineConfig {
            mechanism: args.model.mechanism,
            params: args.model.params.clone(),
            request_epsilon: args.request_epsilon,
            max_tokens: args.max_tokens,
            max_batch: args.max_batch,
            prefill_budget: args.prefill_budget,
            stop_ids,
            delta,
            paced: args.step_time_ms.is_some(),
            phase_timings: args.phase_timings,
        };
        serve(
            args,
            keys,
            store.as_mut(),
            &runner,
            tokenizer,
            chat,
            limits,
            &config,
        )
    }
}

/// Listens, runs the engine beside the HTTP server, and drains on shutdown.
#[allow(clippy::too_many_arguments)]
fn serve<B: ModelBackend>(
    args: &ServeArgs,
    keys: Option<keys::ApiKeys>,
    store: &mut dyn LedgerStore,
    runner: &Runner<B>,
    tokenizer: Tokenizer,
    chat: Result<ChatTemplate, String>,
    limits: Limits,
    config: &engine::EngineConfig,
) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| CliError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(args.listen))
        .map_err(|source| CliError::Io {
            what: format!("listening on {}", args.listen),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| CliError::Io {
        what: "reading the listening address".into(),
        source,
    })?;

    let (jobs, queue) = std::sync::mpsc::channel();
    let tokenizer = Arc::new(tokenizer);
    let state = Arc::new(http::AppState {
        jobs,
        tokenizer: Arc::clone(&tokenizer),
        chat,
        keys,
        limits,
        slots: Arc::new(Semaphore::new(args.max_concurrent)),
        mechanism: args.model.mechanism.name(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        counter: AtomicU64::new(0),
        step_time_ms: args.step_time_ms,
        delta: config.delta,
    });
    let app = http::router(state, args.max_body_bytes);
    eprintln!(
        "privmix: serving {} with {} over {} members on http://{local} (ledger {})",
        args.model.model.display(),
        args.model.mechanism.name(),
        runner.num_members(),
        store.describe()
    );

    let engine_store: &mut dyn LedgerStore = &mut *store;
    std::thread::scope(|scope| {
        let tokenizer = &*tokenizer;
        let engine =
            scope.spawn(move || engine::run(runner, tokenizer, engine_store, config, &queue));
        let served = runtime.block_on(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal())
                .await
        });
        // The router (and with it the queue's sender) is gone: the engine finishes the
        // requests it holds, then returns.
        let engine = engine
            .join()
            .map_err(|_| CliError::arg("serve", "the decode engine panicked"))?;
        served.map_err(|source| CliError::Io {
            what: "serving HTTP".into(),
            source,
        })?;
        engine?;
        Ok::<(), CliError>(())
    })?;
    // A clean stop: every step is committed and no token is released any more, so what
    // the budget leases did not spend can go back to the budget.
    store.close_leases()?;
    eprintln!("privmix: stopped; every released token is in the ledger");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    eprintln!("privmix: shutting down: draining in-flight requests");
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ServeArgs;
    use crate::error::CliError;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(model: &str, extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut args = vec!["serve", "--model", model, "--ledger", "l", "--no-auth"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).map(|c| c.serve)
    }

    /// A file standing in for a GGUF model (only its kind is looked at).
    fn gguf() -> String {
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml").to_string()
    }

    #[test]
    fn the_server_defaults_to_int8_activations_and_an_f16_cache() {
        let m = parse(&gguf(), &[]).unwrap().model_args();
        assert!(m.int8_activations && m.f16_kv);
        let m = parse(&gguf(), &["--f32-activations", "--f32-kv"])
            .unwrap()
            .model_args();
        assert!(!m.int8_activations && !m.f16_kv);
        // A model folder has no quantised weights to take 8-bit activations.
        let m = parse(env!("CARGO_MANIFEST_DIR"), &[]).unwrap().model_args();
        assert!(!m.int8_activations && m.f16_kv);
    }

    #[test]
    fn phase_timings_need_an_opt_in_and_no_api_keys() {
        let keys = [
            "--phase-timings",
            "--unsafe-uncharged-timings",
            "--api-keys",
            "keys.json",
        ];
        let args = Cli::try_parse_from(
            ["serve", "--model", &gguf(), "--ledger", "l"]
                .into_iter()
                .chain(keys),
        )
        .unwrap()
        .serve;
        match super::check_args(&args) {
            Err(CliError::Argument { flag, reason }) => {
                assert_eq!(flag, "--phase-timings");
                assert!(reason.contains("--api-keys"), "{reason}");
            }
            other => panic!("expected --phase-timings refused, got {other:?}"),
        }
        // Without keys (a benchmark's --no-auth server) the option is allowed with the
        // declaration that the members are not private, never without it; keys without
        // it are allowed too.
        let opted_in = ["--phase-timings", "--unsafe-uncharged-timings"];
        assert!(super::check_args(&parse(&gguf(), &opted_in).unwrap()).is_ok());
        match super::check_args(&parse(&gguf(), &["--phase-timings"]).unwrap()) {
            Err(CliError::Argument { flag, reason }) => {
                assert_eq!(flag, "--phase-timings");
                assert!(reason.contains("--unsafe-uncharged-timings"), "{reason}");
            }
            other => panic!("expected --phase-timings refused, got {other:?}"),
        }
        let args = Cli::try_parse_from(
            ["serve", "--model", &gguf(), "--ledger", "l"]
                .into_iter()
                .chain(["--api-keys", "keys.json"]),
        )
        .unwrap()
        .serve;
        assert!(super::check_args(&args).is_ok());
    }

    #[test]
    fn opting_out_conflicts_with_opting_in() {
        assert!(parse(&gguf(), &["--f32-kv", "--f16-kv"]).is_err());
        assert!(parse(&gguf(), &["--f32-activations", "--int8-activations"]).is_err());
        assert!(parse(&gguf(), &["--int8-activations", "--f16-kv"]).is_ok());
    }
}
