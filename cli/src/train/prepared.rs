//! What the trainers (`members.rs`, `dp.rs`) share with the command that runs
//! them: the training backend, the run's folders, the data loaded and checked
//! before training, and how a shard is cut into blocks and split for held-out
//! loss. Below all of them.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use privmix_ensemble::data::{Corpus, DataError, cut_blocks};
use privmix_models::Tokenizer;
use rand::SeedableRng;
use rand::seq::index;
use rand_chacha::ChaCha20Rng;

use super::error::TrainCmdError;
use super::manifest::{BaseModel, Identity, RunConfig};
use crate::error::CliError;

/// The backend members are trained on (CPU, reverse-mode autodiff).
pub(crate) type TrainBackend = Autodiff<Flex>;

/// Folder of the run's checkpoints inside `--out`.
pub(crate) const CHECKPOINTS: &str = "checkpoints";
/// Written by the trainers into a checkpoint folder that holds a checkpoint.
pub(crate) const LATEST_FILE: &str = "latest";

/// Everything loaded and checked before training.
pub(crate) struct Prepared {
    pub corpus: Corpus,
    pub tokenizer: Tokenizer,
    pub config: RunConfig,
    pub base: BaseModel,
    pub tokenizer_identity: Identity,
    pub data_sha256: String,
    pub out: PathBuf,
}

/// A shard's users cut into blocks.
pub(crate) struct ShardBlocks {
    /// Tokens of the users' texts.
    pub tokens: u64,
    /// Blocks, user by user in id order.
    pub blocks: Vec<Vec<u32>>,
}

/// `users` (sorted ids of `corpus`) tokenised and cut into blocks of
/// `block_size` (each user's incomplete tail dropped, a block never spanning
/// two users).
pub(crate) fn shard_blocks(
    p: &Prepared,
    users: &[String],
    member: &str,
) -> Result<ShardBlocks, CliError> {
    let mut tokens = 0u64;
    let mut blocks = Vec::new();
    for id in users {
        let text = p
            .corpus
            .get(id)
            .map(|u| u.text.as_str())
            .unwrap_or_default();
        let ids = p
            .tokenizer
            .encode(text, false)
            .map_err(|e| TrainCmdError::Data {
                what: format!("tokenizing user {id:?}"),
                source: DataError::Tokenizer(e.to_string()),
            })?;
        tokens += ids.len() as u64;
        blocks.extend(
            cut_blocks(&ids, p.config.block_size, p.config.bos).map_err(|source| {
                TrainCmdError::Data {
                    what: "cutting blocks".into(),
                    source,
                }
            })?,
        );
    }
    if blocks.is_empty() {
        return Err(TrainCmdError::NoBlocks {
            member: member.to_string(),
            users: users.len(),
            tokens,
            block_size: p.config.block_size,
        }
        .into());
    }
    Ok(ShardBlocks { tokens, blocks })
}

/// `blocks` split into (training, held-out): `⌈fraction · n⌉` blocks, chosen
/// by a ChaCha20 stream seeded with `seed`, are held out, never all of them
/// (a single block is never held out); both keep their order.
pub(crate) fn split_holdout(
    blocks: Vec<Vec<u32>>,
    fraction: f64,
    seed: u64,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let n = blocks.len();
    let held = ((fraction * n as f64).ceil() as usize).min(n.saturating_sub(1));
    if held == 0 {
        return (blocks, Vec::new());
    }
    let mut chosen = vec![false; n];
    for i in index::sample(&mut ChaCha20Rng::seed_from_u64(seed), n, held) {
        chosen[i] = true;
    }
    let (mut train, mut out) = (Vec::new(), Vec::new());
    for (block, c) in blocks.into_iter().zip(chosen) {
        if c {
            out.push(block);
        } else {
            train.push(block);
        }
    }
    (train, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdout_takes_the_ceiling_and_never_everything() {
        let blocks: Vec<Vec<u32>> = (0..10).map(|i| vec![i, i]).collect();
        let (t, h) = split_holdout(blocks.clone(), 0.15, 3);
        assert_eq!((t.len(), h.len()), (8, 2));
        let mut all: Vec<Vec<u32>> = t.iter().chain(&h).cloned().collect();
        all.sort();
        assert_eq!(all, blocks);
        assert_eq!(split_holdout(blocks.clone(), 0.15, 3), (t, h));
        let (t, h) = split_holdout(blocks[..1].to_vec(), 0.5, 3);
        assert_eq!((t.len(), h.len()), (1, 0));
        let (t, h) = split_holdout(blocks.clone(), 0.0, 3);
        assert_eq!((t.len(), h.len()), (10, 0));
    }
}
