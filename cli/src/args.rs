//! Command-line arguments (clap derive): the subcommands' arguments and the groups
//! they share. The command tree that gathers them is in `command.rs`, above this
//! module and the subcommands' own modules.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// `privmix ledger …`. LEDGER is a ledger file, or a PostgreSQL ledger as a
/// `postgres://user@host/db` URL (its password, if any, is never printed).
#[derive(Debug, Subcommand)]
pub enum LedgerAction {
    /// Budget, number of charges, ε spent (in total and by tenant), protected set.
    Show {
        /// The ledger: a file path or a postgres:// URL.
        ledger: String,
        /// δ at which to report ε (default: the budget's δ, else 1e-5).
        #[arg(long)]
        delta: Option<f64>,
        /// Print one JSON object (budget, spent ε at δ, charges, per-tenant spending,
        /// protected set, format) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check every record without changing anything: a file's checksums and sequence;
    /// a PostgreSQL ledger's sequence, counters and totals against its charges.
    Verify {
        /// The ledger: a file path or a postgres:// URL.
        ledger: String,
    },
    /// Every record as one JSON object a line on stdout (the header first).
    Export {
        /// The ledger: a file path or a postgres:// URL.
        ledger: String,
    },
    /// Set a new budget, recorded in the ledger with the time (the budget's history
    /// is kept); the only way a budget changes. A budget below what is already spent
    /// is refused.
    Raise {
        /// The ledger: a file path or a postgres:// URL.
        ledger: String,
        /// The new budget's ε.
        #[arg(long)]
        epsilon: f64,
        /// The new budget's δ (default: the current budget's δ, else 1e-5).
        #[arg(long)]
        delta: Option<f64>,
    },
    /// Set a tenant's own budget in a PostgreSQL ledger, recorded with the time (its
    /// history is kept): every replica checks each of the tenant's charges against it
    /// (with the members' total budget). A budget below what the tenant has spent is
    /// refused.
    TenantBudget {
        /// The ledger: a postgres:// URL.
        ledger: String,
        /// The tenant (as the API keys file names it).
        #[arg(long)]
        tenant: String,
        /// The budget's ε.
        #[arg(long)]
        epsilon: f64,
        /// The budget's δ (default: the ledger's budget's δ, else 1e-5).
        #[arg(long)]
        delta: Option<f64>,
    },
}

/// The burn backend that runs the models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The CPU (burn-flex): always built in.
    Flex,
    /// A GPU through wgpu (Vulkan; Mesa lavapipe without one): cargo feature `wgpu`.
    Wgpu,
    /// An NVIDIA GPU through CUDA: cargo feature `cuda`.
    Cuda,
}

impl BackendKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

/// The private mechanisms and baselines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MechanismKind {
    /// PMixED (Flemings et al.): Poisson-subsampled members mixed with the public model
    /// inside a Rényi ball; data-independent charge.
    Pmixed,
    /// AdaPMixED: PMixED with noisy screening and data-dependent accounting.
    Adapmixed,
    /// SubMix (Ginart et al.): pairs of members per part (adapters 2k, 2k+1 form part k).
    Submix,
    /// The public model alone (no private data read; charges 0).
    Public,
    /// The non-private average of the members: NO privacy guarantee, never charged to a
    /// ledger (requires --no-privacy).
    Ensemble,
}

impl MechanismKind {
    /// The name used on the command line and in ledger labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pmixed => "pmixed",
            Self::Adapmixed => "adapmixed",
            Self::Submix => "submix",
            Self::Public => "public",
            Self::Ensemble => "ensemble",
        }
    }
}

/// The model, the members and the mechanism (shared by `generate` and `score`).
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// Base model: a Hugging Face folder (config.json + safetensors) or a GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) of one
    /// member; repeat for every member.
    #[arg(long = "adapter")]
    pub adapters: Vec<PathBuf>,
    /// tokenizer.json to use (default: the GGUF's own vocabulary, or tokenizer.json in the
    /// model folder).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// GGUF models with Q4_1/Q8_0 weights: multiply them by activations rounded to 8 bits per
    /// block of 32, as llama.cpp's CPU kernels do (about 3× the multiply-adds per second, so a
    /// step with many members costs much less; logits move by llama.cpp's own rounding).
    /// Default: f32 activations, which match an f32 forward to summation order.
    #[arg(long)]
    pub int8_activations: bool,
    /// Hold the members' LoRA factors in f16: half their memory and half the bytes each step
    /// reads for them; each entry (of B after its scale is folded in) is rounded to f16 once.
    /// Default: f32, the adapters' own values.
    #[arg(long)]
    pub f16_factors: bool,
    /// Hold the KV cache's keys and values in f16 (llama.cpp's default cache type): half its
    /// memory and half the bytes each step reads from it; each entry is rounded to f16 when
    /// appended. Default: f32.
    #[arg(long)]
    pub f16_kv: bool,
    /// Print the execution plan after loading (to stderr): which block operations run
    /// decode and prefill steps, which CPU kernels compute the products, where the KV
    /// cache lives, and the precision of the cache and of the LoRA factors.
    #[arg(long)]
    pub verbose: bool,
    /// Where the models run: flex (the CPU), wgpu (a GPU through Vulkan; privmix built
    /// with the cargo feature `wgpu`) or cuda (an NVIDIA GPU; cargo feature `cuda`).
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: BackendKind,
    /// Temperature T > 0 of EACH model's next-token distribution, the public model's
    /// and every member's, applied BEFORE the mechanism: log-probabilities divided by T,
    /// then renormalised per row. Every guarantee holds unchanged: a member's tempered
    /// distribution is a function of that member alone, and the mechanisms' charges
    /// hold for any member distributions. The mechanism's output distribution is not
    /// tempered (its guarantee is for the distribution it outputs).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// The mechanism.
    #[arg(long, value_enum, default_value = "pmixed")]
    pub mechanism: MechanismKind,
    /// Mechanism parameters.
    #[command(flatten)]
    pub params: MechanismParams,
}

/// Parameters of the mechanisms (each names the mechanisms it applies to).
#[derive(Debug, Args, Clone)]
pub struct MechanismParams {
    /// PMixED/AdaPMixED: enforcement order α_c of the λ projections (PMixED's bound is finite
    /// up to α_c²/(2α_c − 1)).
    #[arg(long, default_value_t = 36.0)]
    pub alpha_c: f64,
    /// PMixED/AdaPMixED/SubMix: radius b of the projections toward the public model
    /// (default PMixED and SubMix: the largest radius whose --max-tokens queries fit the
    /// budget, and AdaPMixED the same, its member filter then fitting the whole run to the
    /// budget).
    #[arg(long)]
    pub radius: Option<f64>,
    /// PMixED: Poisson sampling probability q of each member.
    #[arg(long, default_value_t = 1.0)]
    pub q: f64,
    /// AdaPMixED: screening noise σ.
    #[arg(long, default_value_t = 1e-2)]
    pub sigma: f64,
    /// AdaPMixED: screening threshold T.
    #[arg(long, default_value_t = 4.5)]
    pub threshold: f64,
    /// AdaPMixED: top-k of the public distribution the screening looks at.
    #[arg(long, default_value_t = 60)]
    pub top_k: usize,
    /// SubMix: Rényi order α of the pair test between a part's two halves (the paper's Eq. 2).
    #[arg(long, default_value_t = 2.0)]
    pub submix_alpha: f64,
    /// SubMix: bound β of the pair test (default: --epsilon over --max-tokens, the paper's
    /// heuristic).
    #[arg(long)]
    pub beta: Option<f64>,
}

/// `privmix generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model, members and mechanism.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, conflicts_with_all = ["prompt_ids", "prompt_file"])]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids (no tokenizer needed).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt_file")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Read the prompts from a file, or from standard input with `-`: its whole text is
    /// one prompt, or with --jsonl each line is a JSON object, {"prompt": "…"} or
    /// {"messages": [{"role": "…", "content": "…"}, …]} (messages need --chat). The
    /// prompts are answered in turn by the model loaded once; with --json each line
    /// carries its prompt's index ("prompt", from 0).
    #[arg(long, value_name = "PATH|-")]
    pub prompt_file: Option<PathBuf>,
    /// --prompt-file holds JSON lines, one prompt a line (see --prompt-file).
    #[arg(long, requires = "prompt_file")]
    pub jsonl: bool,
    /// Render each prompt with the tokenizer's chat template (a prompt text as one user
    /// turn, {"messages": …} as the conversation; the assistant's turn then opened), as
    /// transformers' apply_chat_template does. The template comes from the folder of
    /// --tokenizer, else the model folder (chat_template.jinja or tokenizer_config.json),
    /// else the GGUF's tokenizer.chat_template.
    #[arg(long)]
    pub chat: bool,
    /// Maximum number of tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Do not stop at the end-of-turn ids. By default, with a tokenizer, generation stops
    /// at them: generation_config.json's eos_token_id beside the tokenizer, else
    /// tokenizer_config.json's eos_token; a GGUF's eos, eot and eom ids.
    #[arg(long)]
    pub no_stop: bool,
    /// The privacy ledger: a file path, or a PostgreSQL ledger as a postgres:// URL
    /// (shared with `privmix serve` replicas). Created if absent (with --epsilon),
    /// recording the sha256 of every --adapter's weights: a ledger only charges for the
    /// adapter set it was created for.
    #[arg(long)]
    pub ledger: Option<String>,
    /// Budget ε of a new ledger (required to create one). For an existing ledger it may
    /// only repeat the recorded budget: raise it explicitly with `privmix ledger raise`.
    /// With --no-privacy: the ε the mechanism is calibrated to (default 8).
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// Budget δ of a new ledger (default 1e-5); for an existing one it may only repeat
    /// the recorded δ.
    #[arg(long)]
    pub delta: Option<f64>,
    /// Run without a ledger: the output is NOT private and is marked so ("private":
    /// false). Needed by the non-private ensemble and by seeded runs.
    #[arg(long)]
    pub no_privacy: bool,
    /// Seed the sampler: an experiment (a known seed makes every draw predictable), so it
    /// needs --no-privacy and is refused with --ledger.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Release token k at k·N ms after the first step starts (N > 0), whatever the step
    /// computed, so that release times do not depend on the private data; a step that
    /// misses its deadline ends the run with an error and its (charged) token withheld.
    #[arg(long, value_name = "N")]
    pub step_time_ms: Option<u64>,
    /// Print JSON lines on stdout: one per token (prompt, index, token, text, epsilon,
    /// delta, private), then a summary per prompt.
    #[arg(long)]
    pub json: bool,
}

/// `privmix score`.
#[derive(Debug, Args)]
pub struct ScoreArgs {
    /// Model, members and mechanism.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score, or `-` for standard input: its whole text is one text,
    /// or with --jsonl each line is a JSON object, {"prompt": "…"} or {"messages": […]}
    /// (messages need --chat), each scored apart and reported with its index ("prompt").
    #[arg(long, alias = "prompt-file", value_name = "PATH|-")]
    pub text: PathBuf,
    /// --text holds JSON lines, one text a line (see --text).
    #[arg(long)]
    pub jsonl: bool,
    /// Render each text with the tokenizer's chat template before scoring it (a text as
    /// one user turn, {"messages": …} as the conversation; no assistant turn opened).
    #[arg(long)]
    pub chat: bool,
    /// Tokens per block (perplexity is exp(mean NLL) per block, then the mean over blocks).
    #[arg(long, default_value_t = 512)]
    pub block: usize,
    /// Score at most this many blocks.
    #[arg(long)]
    pub max_blocks: Option<usize>,
    /// Budget ε the mechanism is calibrated to (PMixED's and SubMix's radius, AdaPMixED's filter).
    #[arg(long, default_value_t = 8.0)]
    pub epsilon: f64,
    /// δ at which the ε of the queries is reported.
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// Compute a perplexity over private adapters anyway: NOT private, marked so
    /// ("private": false). Required for every mechanism but `public`.
    #[arg(long)]
    pub no_privacy: bool,
    /// Seed the member draws (reproducible evaluation): an experiment, needs
    /// --no-privacy.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print each text's result as one JSON object a line (with its index, "prompt").
    #[arg(long)]
    pub json: bool,
}
