//! The README.md model card written beside each adapter: what it saw, how it
//! was trained and how it may be released.

use std::fmt::Write;

use privmix_ensemble::data::HASH_PARTITION_RULE;

use super::manifest::{BaseModel, DpSgdRecord, MemberRecord, RunConfig};

/// The papers the mechanisms and the baseline come from.
const PAPERS: &str = "- PMixED: \"Differentially Private Next-Token Prediction of Large Language Models\", arXiv 2403.15638
- AdaPMixED: \"Adaptively Private Next-Token Prediction of Large Language Models\", arXiv 2410.02016
- SubMix: \"Submix: Practical Private Prediction for Large-Scale Language Models\", arXiv 2201.00971
- DP-SGD: \"Deep Learning with Differential Privacy\", arXiv 1607.00133
- LoRA: \"LoRA: Low-Rank Adaptation of Large Language Models\", arXiv 2106.09685
";

fn optional<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "none".to_string(), |v| v.to_string())
}

fn loss(v: Option<f64>) -> String {
    v.map_or_else(
        || "not measured".to_string(),
        |v| format!("{v:.4} nats/token"),
    )
}

/// The training section shared by both kinds of card.
fn training(config: &RunConfig, base: &BaseModel) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Base model\n");
    let _ = writeln!(s, "- `base_model_name_or_path`: `{}`", base.name);
    let _ = writeln!(s, "- identity: `{}`\n", base.sha256);
    let _ = writeln!(s, "## Training configuration\n");
    let _ = writeln!(
        s,
        "- LoRA: rank {}, alpha {}, dropout {}, target modules {}",
        config.rank,
        config.alpha,
        config.dropout,
        config.target_modules.join(", ")
    );
    let _ = writeln!(
        s,
        "- AdamW: learning rate {} (linear warmup {} steps, then linear decay to 0), weight decay {}",
        config.learning_rate, config.warmup_steps, config.weight_decay
    );
    let _ = writeln!(
        s,
        "- blocks of {} tokens{}, batch {}, gradient accumulation {}",
        config.block_size,
        config
            .bos
            .map_or_else(String::new, |b| format!(" (each starting with BOS {b})")),
        config.batch_size,
        config.grad_accum
    );
    match config.steps {
        Some(n) => {
            let _ = writeln!(s, "- steps: {n}");
        }
        None => {
            let _ = writeln!(s, "- epochs: {}", config.epochs);
        }
    }
    let _ = writeln!(
        s,
        "- held-out fraction {} (by block), evaluation every {} steps on at most {} blocks, patience {}",
        config.holdout,
        config
            .eval_every
            .map_or_else(|| "a tenth of the run's".to_string(), |n| n.to_string()),
        config.eval_blocks,
        optional(config.patience)
    );
    s
}

/// The card of one member.
pub fn member_card(
    record: &MemberRecord,
    members: usize,
    config: &RunConfig,
    base: &BaseModel,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# privmix member {:03}\n", record.index);
    let _ = writeln!(
        s,
        "A LoRA adapter (PEFT format) fine-tuned by `privmix train` on one of {members} disjoint shards of a private corpus.\n"
    );
    let _ = writeln!(
        s,
        "**Contains private data — release only through privmix.** These weights are a function of the users below and carry no privacy guarantee of their own. Serve them only through a private mechanism (`privmix generate` or `privmix serve` with PMixED, AdaPMixED or SubMix, every token charged to a ledger); never publish the adapter or this folder.\n"
    );
    let _ = writeln!(s, "## What it saw\n");
    let _ = writeln!(
        s,
        "- users: {} (user-level partition: each user's data is in exactly one member)",
        record.users
    );
    let _ = writeln!(
        s,
        "- tokens: {} ({} training blocks, {} held-out blocks)",
        record.tokens, record.train_blocks, record.held_out_blocks
    );
    let _ = writeln!(
        s,
        "- partition: seed {}, `{HASH_PARTITION_RULE}` = {} (the users are listed in the run's manifest.json)",
        config.seed, record.index
    );
    let _ = writeln!(s, "- data hash: `{}`\n", record.data_sha256);
    s.push_str(&training(config, base));
    let _ = writeln!(s, "\n## Result\n");
    let _ = writeln!(
        s,
        "- steps: {} of {}{}; the adapter is the one at step {}",
        record.steps,
        record.total_steps,
        if record.stopped_early {
            " (early stopping)"
        } else {
            ""
        },
        record.adapter_step
    );
    let _ = writeln!(s, "- training seed: {}", record.train_seed);
    let _ = writeln!(s, "- last training loss: {}", loss(record.train_loss));
    let _ = writeln!(s, "- held-out loss: {}", loss(record.held_out_loss));
    let _ = writeln!(s, "- weights: `{}`\n", record.adapter_sha256);
    let _ = writeln!(s, "## References\n\n{PAPERS}");
    s
}

/// The card of the DP-SGD adapter. It holds nothing computed from the data
/// beyond what DP-SGD's analysis treats as public (block counts, the steps,
/// q, σ): no data hash (anyone holding a candidate dataset could test it) and
/// no loss.
pub fn dp_sgd_card(record: &DpSgdRecord, config: &RunConfig, base: &BaseModel) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# privmix DP-SGD adapter\n");
    let _ = writeln!(
        s,
        "A LoRA adapter (PEFT format) fine-tuned by `privmix train --dp-sgd` on a whole private corpus with DP-SGD: per-example gradient clipping and Gaussian noise, sampling and noise drawn from the operating system's entropy.\n"
    );
    let _ = writeln!(
        s,
        "**Guarantee: (ε, δ) = ({}, {}) with respect to adding or removing one training block** ({} tokens); a user with k blocks is covered at the group-privacy level of k blocks, not at ε. ε asked for: {}. The adapter may be used without a private mechanism; the run's manifest.json (user list, data hashes) is private and is not part of a release.\n",
        record.epsilon, record.delta, config.block_size, record.target_epsilon
    );
    let _ = writeln!(s, "## DP-SGD\n");
    let _ = writeln!(
        s,
        "- steps {}, Poisson sampling rate q = {}, noise multiplier σ = {}, clip norm C = {}",
        record.steps, record.sampling_rate, record.noise_multiplier, record.clip_norm
    );
    let _ = writeln!(
        s,
        "- accounting: the Poisson-subsampled Gaussian over the steps, ε the smaller of the \
         privacy-loss-distribution and RDP accountants' bounds, rounded up"
    );
    let _ = writeln!(
        s,
        "- training blocks: {}; held out (never trained on): {}\n",
        record.train_blocks, record.held_out_blocks
    );
    s.push_str(&training(config, base));
    let _ = writeln!(s, "- weights: `{}`\n", record.adapter_sha256);
    let _ = writeln!(s, "## References\n\n{PAPERS}");
    s
}
