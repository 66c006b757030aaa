//! The arguments of `privmix train` (below the modules that read them).

use std::path::PathBuf;

use clap::Args;

/// `privmix train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The private data: JSON lines {"user": …, "text": …} (a file, or - for stdin), or a
    /// folder with one text file per user (the file name is the user id). A user's records
    /// are joined, in order, with a blank line between them.
    #[arg(long)]
    pub data: PathBuf,
    /// Base model: a Hugging Face folder (config.json + safetensors) or a GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// tokenizer.json to use (default: the GGUF's own vocabulary, or tokenizer.json in the
    /// model folder).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// base_model_name_or_path written into each adapter_config.json, e.g. the Hub name
    /// Python peft should load the base model by (default: --model as given).
    #[arg(long)]
    pub base_model_name: Option<String>,
    /// Output folder: member-000/ … (or dp-sgd/), manifest.json, and checkpoints/ while
    /// training. Rerunning with the same arguments continues an interrupted run.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of members N: users are partitioned into N disjoint shards, one LoRA each.
    #[arg(long, required_unless_present = "dp_sgd", conflicts_with = "dp_sgd")]
    pub members: Option<usize>,
    /// Seed of the partition (member = sha256(seed ‖ user) mod N), the held-out split,
    /// the adapters' initialisation and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of each member's blocks held out (never trained on) for the held-out loss,
    /// in [0, 1).
    #[arg(long, default_value_t = 0.1)]
    pub holdout: f64,
    /// LoRA rank r.
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// LoRA alpha (the update is scaled by alpha / r).
    #[arg(long, default_value_t = 16.0)]
    pub alpha: f64,
    /// LoRA dropout on the adapter's input during training, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Projections to adapt, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj; GPT-2: c_attn, c_proj, c_fc).
    #[arg(long, value_delimiter = ',', default_value = "q_proj,v_proj")]
    pub target_modules: Vec<String>,
    /// Peak learning rate of AdamW (linear warmup, then linear decay to 0).
    #[arg(long, default_value_t = 2e-4)]
    pub lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Optimizer steps per member (default: from --epochs).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Passes over each member's training blocks, when --steps is not given (DP-SGD: the
    /// expected number of passes, steps = epochs / q).
    #[arg(long, default_value_t = 1.0)]
    pub epochs: f64,
    /// Blocks per batch (DP-SGD: the expected Poisson batch, q = batch / blocks).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Batches whose gradients are averaged per optimizer step (not with --dp-sgd).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Tokens per training block (a block never mixes two users).
    #[arg(long, default_value_t = 512)]
    pub block_size: usize,
    /// Measure the held-out loss every N steps (default: a tenth of the run).
    #[arg(long, value_name = "N")]
    pub eval_every: Option<usize>,
    /// At most this many held-out blocks per evaluation.
    #[arg(long, default_value_t = 64)]
    pub eval_blocks: usize,
    /// Stop a member after this many evaluations in a row without a better held-out loss,
    /// and keep the best adapter.
    #[arg(long)]
    pub patience: Option<usize>,
    /// Save a checkpoint every N steps (default: at every evaluation, or every tenth of the
    /// run without one).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Stop every unfinished member (or the DP-SGD run) at step N and leave its checkpoint
    /// (an interrupted run); rerun without it to continue.
    #[arg(long, value_name = "N")]
    pub stop_at_step: Option<usize>,
    /// Train the DP-SGD baseline instead of members: one adapter on all the data, with
    /// per-example clipping and Gaussian noise calibrated to --epsilon.
    #[arg(long, requires = "epsilon")]
    pub dp_sgd: bool,
    /// DP-SGD: target ε (the noise multiplier is the smallest whose ε at --delta over the
    /// planned steps is at most this).
    #[arg(long, requires = "dp_sgd")]
    pub epsilon: Option<f64>,
    /// DP-SGD: δ (default 1e-5).
    #[arg(long, requires = "dp_sgd")]
    pub delta: Option<f64>,
    /// DP-SGD: per-example gradient clip norm C (default 1).
    #[arg(long, requires = "dp_sgd")]
    pub clip_norm: Option<f64>,
}
