//! The private corpus, its user-level partition and the token blocks of each
//! member and of the evaluation.

use privmix_ensemble::data::{
    Corpus, Partition, PartitionConfig, UserUnit, load_shakespeare, token_blocks,
};
use privmix_models::Tokenizer;

use super::config::ExperimentConfig;
use crate::error::BenchError;

/// The blocks every stage reads.
#[derive(Debug, Clone)]
pub struct ExperimentData {
    /// Users in the corpus.
    pub users: usize,
    /// Users held out (never trained on).
    pub held_out_users: usize,
    /// Member `2k + h`'s users: half `h` of part `k`.
    pub member_users: Vec<Vec<String>>,
    /// Member `i`'s training blocks.
    pub members: Vec<Vec<Vec<u32>>>,
    /// The held-out blocks scored by every mechanism.
    pub eval: Vec<Vec<u32>>,
}

/// Parses `play`, `speaker` or `block:<bytes>`.
pub fn parse_user_unit(s: &str) -> Result<UserUnit, BenchError> {
    match s {
        "play" => Ok(UserUnit::Play),
        "speaker" => Ok(UserUnit::Speaker),
        _ => match s.strip_prefix("block:").map(str::parse::<usize>) {
            Some(Ok(chars)) if chars > 0 => Ok(UserUnit::Block { chars }),
            _ => Err(BenchError::Config(format!(
                "user unit {s:?}: expected play, speaker or block:<bytes>"
            ))),
        },
    }
}

/// Loads the corpus, partitions it and cuts the blocks (see the module docs of
/// [`super`] for the member layout).
pub fn prepare_data(
    config: &ExperimentConfig,
    tokenizer: &Tokenizer,
) -> Result<ExperimentData, BenchError> {
    let unit = parse_user_unit(&config.user_unit)?;
    let corpus = load_shakespeare(&config.corpus_dir, unit)?;
    prepare_from_corpus(config, tokenizer, &corpus)
}

/// [`prepare_data`] on a corpus already loaded.
pub fn prepare_from_corpus(
    config: &ExperimentConfig,
    tokenizer: &Tokenizer,
    corpus: &Corpus,
) -> Result<ExperimentData, BenchError> {
    let partition = Partition::new(
        corpus,
        &PartitionConfig {
            parts: config.members / 2,
            held_out_fraction: config.held_out_fraction,
            halves: true,
            seed: config.seed,
        },
    )?;
    let mut member_users = Vec::with_capacity(config.members);
    for part in partition.parts() {
        let halves = part.halves.as_ref().ok_or_else(|| {
            BenchError::Config("the partition was asked for halves but has none".into())
        })?;
        for half in halves {
            member_users.push(half.users.clone());
        }
    }
    let mut members = Vec::with_capacity(member_users.len());
    for (i, users) in member_users.iter().enumerate() {
        let blocks = token_blocks(tokenizer, corpus, users, config.block, None)?;
        if blocks.is_empty() {
            return Err(BenchError::Config(format!(
                "member {i} has no complete block of {} tokens: use a smaller block or fewer members",
                config.block
            )));
        }
        members.push(blocks);
    }
    let held = token_blocks(tokenizer, corpus, partition.held_out(), config.block, None)?;
    if held.len() < config.eval_blocks || config.eval_blocks == 0 {
        return Err(BenchError::Config(format!(
            "{} evaluation blocks asked for, {} held-out blocks of {} tokens exist",
            config.eval_blocks,
            held.len(),
            config.block
        )));
    }
    // Evenly spaced over the held-out users' text, not just the first user's.
    let eval = (0..config.eval_blocks)
        .map(|i| held[i * held.len() / config.eval_blocks].clone())
        .collect();
    Ok(ExperimentData {
        users: corpus.len(),
        held_out_users: partition.held_out().len(),
        member_users,
        members,
        eval,
    })
}
