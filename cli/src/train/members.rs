//! Fine-tuning the N members together ([`JointTrainer`]: one batched pass
//! over the shared base per step, each member's rows through its own
//! factors), each resumable from its checkpoint folder
//! `checkpoints/member-NNN/` (the trainer's checkpoints resume to the
//! bit-identical trajectory), and the manifest once all are done.

use std::collections::BTreeMap;

use burn::backend::Flex;
use privmix_ensemble::data::{Corpus, HASH_PARTITION_RULE, hash_partition};
use privmix_ensemble::lora::{LoraAdapter, LoraConfig};
use privmix_ensemble::train::{AdamWConfig, JointTrainer, TrainConfig, Trainer};
use privmix_models::Model;

use super::args::TrainArgs;
use super::card::member_card;
use super::driver::{
    fmt_loss, open, stopped, training_failed, write_adapter, write_card, write_manifest,
};
use super::error::TrainCmdError;
use super::manifest::{
    MemberRecord, PartitionRecord, RunKind, data_hash, derive_seed, read_json, write_json_atomic,
};
use super::prepared::{CHECKPOINTS, Prepared, TrainBackend, shard_blocks, split_holdout};
use crate::error::CliError;

/// A member this run trains: what its record needs beside the trainer.
struct Pending {
    k: usize,
    name: String,
    tokens: u64,
    train_blocks: usize,
    held_out_blocks: usize,
    total: usize,
    train_seed: u64,
    /// Its [`DONE_FILE`].
    done: std::path::PathBuf,
}

/// Written into a member's checkpoint folder once its PEFT folder and card are
/// complete: its record, so that a rerun skips it.
const DONE_FILE: &str = "done.json";

/// The users of `corpus` by member: `sha256(seed ‖ user) mod members`.
pub(crate) fn partition(
    corpus: &Corpus,
    seed: u64,
    members: usize,
) -> Result<Vec<Vec<String>>, CliError> {
    hash_partition(corpus, seed, members).map_err(|source| {
        TrainCmdError::Data {
            what: format!(
                "partitioning {} users into {members} members with --seed {seed} (a member without users needs another --seed or fewer --members)",
                corpus.len()
            ),
            source,
        }
        .into()
    })
}

/// The adapter's configuration from the flags: PEFT's defaults otherwise,
/// `fan_in_fan_out` set for GPT-2's `Conv1D` projections as PEFT sets it.
pub(crate) fn lora_config(p: &Prepared) -> Result<LoraConfig, CliError> {
    let c = &p.config;
    let targets: Vec<&str> = c.target_modules.iter().map(String::as_str).collect();
    let mut lora = LoraConfig::new(c.rank, c.alpha, &targets)
        .map_err(|e| CliError::arg("--target-modules", e.to_string()))?;
    lora.lora_dropout = c.dropout;
    lora.base_model_name_or_path = Some(p.base.name.clone());
    lora.fan_in_fan_out = targets
        .iter()
        .any(|t| matches!(*t, "c_attn" | "c_proj" | "c_fc"));
    lora.validate()
        .map_err(|e| CliError::arg("--dropout", e.to_string()))?;
    Ok(lora)
}

/// The trainer's configuration for member `k` with `train_blocks` training
/// blocks (the step count from `--epochs` when `--steps` is not given).
fn train_config(
    p: &Prepared,
    args: &TrainArgs,
    k: usize,
    train_blocks: usize,
    held_out: bool,
) -> Result<TrainConfig, CliError> {
    let c = &p.config;
    let per_step = c.batch_size.min(train_blocks) * c.grad_accum;
    let total = c
        .steps
        .unwrap_or_else(|| (c.epochs * train_blocks as f64 / per_step as f64).ceil() as usize)
        .max(1);
    let tenth = total.div_ceil(10).max(1);
    let eval_every = if held_out {
        c.eval_every.unwrap_or(tenth)
    } else {
        0
    };
    let mut t = TrainConfig::new(lora_config(p)?, total, derive_seed(c.seed, "train", k));
    t.learning_rate = c.learning_rate;
    t.warmup_steps = c.warmup_steps;
    t.batch_size = c.batch_size;
    t.grad_accum = c.grad_accum;
    t.adamw = AdamWConfig {
        weight_decay: c.weight_decay,
        ..AdamWConfig::default()
    };
    t.eval_every = eval_every;
    t.eval_blocks = c.eval_blocks;
    t.patience = c.patience;
    t.checkpoint_every =
        args.checkpoint_every
            .unwrap_or(if eval_every > 0 { eval_every } else { tenth });
    t.progress = true;
    Ok(t)
}

/// Trains every member not yet done; returns whether all are (then the
/// manifest is written), or `false` when `--stop-at-step` left some unfinished.
pub(crate) fn train(
    p: &Prepared,
    model: &Model<TrainBackend>,
    shards: &[Vec<String>],
    args: &TrainArgs,
) -> Result<bool, CliError> {
    let mut records: Vec<Option<MemberRecord>> = vec![None; shards.len()];
    let mut unfinished = 0;
    let mut pending = Vec::new();
    let mut trainers = Vec::new();
    for (k, users) in shards.iter().enumerate() {
        let name = format!("member-{k:03}");
        let checkpoints = p.out.join(CHECKPOINTS).join(&name);
        let done = checkpoints.join(DONE_FILE);
        if done.is_file() {
            let record: MemberRecord = read_json(&done)?;
            eprintln!("{name}: trained by an earlier run");
            records[k] = Some(record);
            continue;
        }
        let shard = shard_blocks(p, users, &name)?;
        let (train, held) = split_holdout(
            shard.blocks,
            p.config.holdout,
            derive_seed(p.config.seed, "holdout", k),
        );
        let (train_blocks, held_out_blocks) = (train.len(), held.len());
        let config = train_config(p, args, k, train_blocks, held_out_blocks > 0)?;
        let total = config.total_steps;
        let train_seed = config.seed;
        let every = config.checkpoint_every;
        trainers.push(open(
            &name,
            &checkpoints,
            every,
            total,
            |resume| match resume {
                Some(dir) => Trainer::<TrainBackend, _>::resume(model, train, held, config, dir),
                None => Trainer::<TrainBackend, _>::new(model, train, held, config),
            },
        )?);
        pending.push(Pending {
            k,
            name,
            tokens: shard.tokens,
            train_blocks,
            held_out_blocks,
            total,
            train_seed,
            done,
        });
    }
    // Every unfinished member in one batched step over the shared base.
    let names = pending
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let joint_fail = training_failed(&names);
    let (trainers, reports) = if trainers.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let mut joint = JointTrainer::new(trainers).map_err(&joint_fail)?;
        let reports = joint
            .run_until(args.stop_at_step.unwrap_or(usize::MAX))
            .map_err(&joint_fail)?;
        (joint.into_members(), reports)
    };
    for ((m, trainer), report) in pending.iter().zip(&trainers).zip(reports) {
        let (k, name, total) = (m.k, &m.name, m.total);
        let users = &shards[k];
        let fail = training_failed(name);
        if report.steps < total && !report.stopped_early {
            stopped(
                name,
                report.steps,
                total,
                &p.out.join(CHECKPOINTS).join(name),
            );
            unfinished += 1;
            continue;
        }
        // After early stopping the best held-out adapter is kept; a run that
        // went to the end keeps its last adapter.
        let (adapter, adapter_step, held_out_loss): (LoraAdapter<Flex>, usize, Option<f64>) =
            match (report.stopped_early, report.best) {
                (true, Some((step, loss))) => {
                    (trainer.best_adapter().map_err(&fail)?, step, Some(loss))
                }
                _ => (
                    trainer.adapter().map_err(&fail)?,
                    report.steps,
                    trainer.evaluate().map_err(&fail)?,
                ),
            };
        let (dir, adapter_sha256) = write_adapter(p, name, &adapter)?;
        let record = MemberRecord {
            index: k,
            path: name.clone(),
            adapter_sha256,
            users: users.len(),
            tokens: m.tokens,
            train_blocks: m.train_blocks,
            held_out_blocks: m.held_out_blocks,
            data_sha256: data_hash(users.iter().map(|u| {
                let text = p.corpus.get(u).map(|t| t.text.as_str()).unwrap_or_default();
                (u.as_str(), text)
            })),
            train_seed: m.train_seed,
            total_steps: total,
            steps: report.steps,
            stopped_early: report.stopped_early,
            adapter_step,
            train_loss: report.history.train_loss.last().copied(),
            held_out_loss,
        };
        write_card(
            &dir,
            &member_card(&record, shards.len(), &p.config, &p.base),
        )?;
        write_json_atomic(&m.done, &record)?;
        eprintln!(
            "{name}: {} users, {} tokens, {} training / {} held-out blocks; {} of {total} steps{}, training loss {}, held-out loss {}",
            record.users,
            record.tokens,
            m.train_blocks,
            m.held_out_blocks,
            record.steps,
            if record.stopped_early {
                " (early stopping)"
            } else {
                ""
            },
            fmt_loss(record.train_loss),
            fmt_loss(record.held_out_loss),
        );
        records[k] = Some(record);
    }
    if unfinished > 0 {
        eprintln!(
            "privmix: {unfinished} member(s) unfinished; rerun the same command without --stop-at-step to continue"
        );
        return Ok(false);
    }
    let mut assignment = BTreeMap::new();
    for (k, users) in shards.iter().enumerate() {
        for u in users {
            assignment.insert(u.clone(), k);
        }
    }
    let partition = PartitionRecord {
        seed: p.config.seed,
        members: shards.len(),
        hash: HASH_PARTITION_RULE.into(),
        users: assignment,
    };
    let members = records.into_iter().flatten().collect();
    let path = write_manifest(p, RunKind::Members, Some(partition), members, None)?;
    eprintln!(
        "privmix: {} members and {} written; they and the figures above (users, tokens, losses) are computed from the private data and are NOT private: release only through a private mechanism (privmix generate/serve)",
        shards.len(),
        path.display()
    );
    Ok(true)
}
