//! The private corpus, its partition into members, and the held-out blocks.
//!
//! **Privacy unit.** `record`: one training block of `block` tokens (the unit of
//! the papers' tables); a user (`play`, `speaker`, `block:<bytes>`): all of one
//! user's text. **Assignment.** Each unit goes to member
//! `hash(seed ‖ id) mod N` ([`hash_member`]): a unit's member is a function of
//! its own id, so adding or removing one unit changes exactly one member's
//! data and no other placement. That is the neighbour relation every ensemble
//! mechanism's changed-member charge covers, so the ensemble rows and the
//! DP-SGD rows (add/remove one unit) protect the same unit under the same
//! adjacency. SubMix's part k is members 2k and 2k + 1.
//!
//! **Held-out text.** Whole plays chosen by a keyed hash of their names are
//! held out; no unit of them is trained on. Their blocks are shuffled by the
//! seed and dealt in disjoint runs: `eval_blocks` per repetition, then the
//! validation blocks.

use privmix_ensemble::data::{
    Corpus, UserUnit, cut_blocks, hash_member, load_shakespeare, token_blocks,
};
use privmix_models::Tokenizer;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;

use super::config::ExperimentConfig;
use crate::error::BenchError;

/// Keys the held-out choice apart from the member assignment.
const HELD_OUT_KEY: u64 = 0x4845_4c44_4f55_5421;
/// Keys the training-record cap apart from the member assignment.
const CAP_KEY: u64 = 0x4341_5052_4543_4f52;

/// What one privacy unit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivacyUnit {
    /// One training block.
    Record,
    /// One user of the plays.
    User(UserUnit),
}

impl PrivacyUnit {
    /// How the report names it.
    pub fn describe(&self) -> String {
        match self {
            Self::Record => "one training record (a block of tokens)".into(),
            Self::User(UserUnit::Play) => "one user = one play".into(),
            Self::User(UserUnit::Speaker) => "one user = one speaker of one play".into(),
            Self::User(UserUnit::Block { chars }) => {
                format!("one user = one piece of ≥ {chars} bytes of a play")
            }
        }
    }
}

/// The blocks every stage reads.
#[derive(Debug, Clone)]
pub struct ExperimentData {
    /// The privacy unit.
    pub unit: PrivacyUnit,
    /// Units trained on (records or users).
    pub units: usize,
    /// Plays held out.
    pub held_out_plays: Vec<String>,
    /// Member `i`'s training blocks.
    pub members: Vec<Vec<Vec<u32>>>,
    /// Seed `s`'s held-out blocks, disjoint across seeds.
    pub eval: Vec<Vec<Vec<u32>>>,
    /// Held-out validation blocks, disjoint from every seed's.
    pub validation: Vec<Vec<u32>>,
    /// The long deployment's blocks (empty when none is asked for): they answer
    /// exactly `long_queries` queries and hold no validation block.
    pub long: Vec<Vec<u32>>,
}

impl ExperimentData {
    /// Every training block, member by member.
    pub fn all_records(&self) -> Vec<Vec<u32>> {
        self.members.iter().flatten().cloned().collect()
    }
}

/// Parses `record`, `play`, `speaker` or `block:<bytes>`.
pub fn parse_unit(s: &str) -> Result<PrivacyUnit, BenchError> {
    match s {
        "record" => Ok(PrivacyUnit::Record),
        "play" => Ok(PrivacyUnit::User(UserUnit::Play)),
        "speaker" => Ok(PrivacyUnit::User(UserUnit::Speaker)),
        _ => match s.strip_prefix("block:").map(str::parse::<usize>) {
            Some(Ok(chars)) if chars > 0 => Ok(PrivacyUnit::User(UserUnit::Block { chars })),
            _ => Err(BenchError::Config(format!(
                "privacy unit {s:?}: expected record, play, speaker or block:<bytes>"
            ))),
        },
    }
}

/// Loads the plays, holds some out, assigns the units and cuts the blocks.
pub fn prepare_data(
    config: &ExperimentConfig,
    tokenizer: &Tokenizer,
) -> Result<ExperimentData, BenchError> {
    let unit = parse_unit(&config.user_unit)?;
    let plays = load_shakespeare(&config.corpus_dir, UserUnit::Play)?;
    let users = match unit {
        PrivacyUnit::Record => None,
        PrivacyUnit::User(u) => Some(load_shakespeare(&config.corpus_dir, u)?),
    };
    prepare_from_corpus(config, tokenizer, &plays, users.as_ref(), unit)
}

/// The play a unit id belongs to (ids are `play`, `play/Speaker`, `play#k`).
fn play_of(id: &str) -> &str {
    id.split(['/', '#']).next().unwrap_or(id)
}

/// [`prepare_data`] on corpora already loaded: `plays` one user per play,
/// `users` the corpus of the user unit (None for records).
pub fn prepare_from_corpus(
    config: &ExperimentConfig,
    tokenizer: &Tokenizer,
    plays: &Corpus,
    users: Option<&Corpus>,
    unit: PrivacyUnit,
) -> Result<ExperimentData, BenchError> {
    let n = config.members;
    if n == 0 {
        return Err(BenchError::Config("no member".into()));
    }
    let f = config.held_out_fraction;
    if !(f > 0.0 && f < 1.0) {
        return Err(BenchError::Config(format!(
            "held-out fraction {f}: expected a value in (0, 1)"
        )));
    }
    const SCALE: usize = 1 << 20;
    let mut held_out = Vec::new();
    for p in plays.users() {
        if (hash_member(config.seed ^ HELD_OUT_KEY, &p.id, SCALE)? as f64) < f * SCALE as f64 {
            held_out.push(p.id.clone());
        }
    }
    if held_out.is_empty() || held_out.len() == plays.len() {
        return Err(BenchError::Config(format!(
            "held-out fraction {f} holds out {} of {} plays: choose another seed or fraction",
            held_out.len(),
            plays.len()
        )));
    }
    let is_held = |id: &str| held_out.iter().any(|h| h == play_of(id));

    // (id, blocks) of every trainable unit.
    let mut units: Vec<(String, Vec<Vec<u32>>)> = Vec::new();
    match users {
        None => {
            for p in plays.users().iter().filter(|p| !is_held(&p.id)) {
                let ids = tokenizer.encode(&p.text, false)?;
                for (k, b) in cut_blocks(&ids, config.block, None)?
                    .into_iter()
                    .enumerate()
                {
                    units.push((format!("{}#{k:05}", p.id), vec![b]));
                }
            }
        }
        Some(corpus) => {
            for u in corpus.users().iter().filter(|u| !is_held(&u.id)) {
                let blocks = token_blocks(
                    tokenizer,
                    corpus,
                    std::slice::from_ref(&u.id),
                    config.block,
                    None,
                )?;
                if !blocks.is_empty() {
                    units.push((u.id.clone(), blocks));
                }
            }
        }
    }
    if let Some(cap) = config.max_records {
        // Units in the order of a keyed hash of their ids, each taken when it
        // still fits the cap: the choice reads no content beyond the units'
        // sizes.
        let mut keyed = units
            .into_iter()
            .map(|u| Ok((hash_member(config.seed ^ CAP_KEY, &u.0, usize::MAX)?, u)))
            .collect::<Result<Vec<_>, BenchError>>()?;
        keyed.sort_by(|a, b| (a.0, &a.1.0).cmp(&(b.0, &b.1.0)));
        let mut total = 0;
        let mut filled = vec![false; n];
        let mut passed = Vec::new();
        units = Vec::new();
        for (_, u) in keyed {
            if total + u.1.len() <= cap {
                total += u.1.len();
                filled[hash_member(config.seed, &u.0, n)?] = true;
                units.push(u);
            } else {
                passed.push(u);
            }
        }
        // Large units (users) can leave a member without data under the cap:
        // such a member takes the first unit passed over that hashes to it, so
        // the cap may be exceeded by a few units.
        for u in passed {
            let member = hash_member(config.seed, &u.0, n)?;
            if !filled[member] {
                filled[member] = true;
                units.push(u);
            }
        }
        units.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let mut members: Vec<Vec<Vec<u32>>> = vec![Vec::new(); n];
    for (id, blocks) in &units {
        members[hash_member(config.seed, id, n)?].extend(blocks.iter().cloned());
    }
    if let Some(i) = members.iter().position(Vec::is_empty) {
        return Err(BenchError::Config(format!(
            "member {i} got no block of {} tokens from {} units: use fewer members, more records \
             or a smaller block",
            config.block,
            units.len()
        )));
    }

    let mut pool = token_blocks(tokenizer, plays, &held_out, config.block, None)?;
    pool.shuffle(&mut ChaCha20Rng::seed_from_u64(config.seed ^ HELD_OUT_KEY));
    let needed = config.seeds * config.eval_blocks + config.validation_blocks;
    if config.seeds == 0 || config.eval_blocks == 0 || pool.len() < needed {
        return Err(BenchError::Config(format!(
            "{} seeds × {} evaluation blocks + {} validation blocks asked for; the held-out plays \
             give {} blocks of {} tokens",
            config.seeds,
            config.eval_blocks,
            config.validation_blocks,
            pool.len(),
            config.block
        )));
    }
    let eval = pool
        .chunks(config.eval_blocks)
        .take(config.seeds)
        .map(<[Vec<u32>]>::to_vec)
        .collect();
    let start = config.seeds * config.eval_blocks;
    let validation = pool[start..start + config.validation_blocks].to_vec();
    let long = long_deployment_blocks(
        config.long_queries,
        pool[..start]
            .iter()
            .chain(&pool[start + config.validation_blocks..]),
    )?;
    Ok(ExperimentData {
        unit,
        units: units.len(),
        held_out_plays: held_out,
        members,
        eval,
        validation,
        long,
    })
}

/// The first blocks of `pool` that answer exactly `queries` queries (a block of
/// n tokens answers n − 1), the last one cut short as needed.
fn long_deployment_blocks<'a>(
    queries: u64,
    pool: impl Iterator<Item = &'a Vec<u32>>,
) -> Result<Vec<Vec<u32>>, BenchError> {
    let mut left = queries;
    let mut blocks = Vec::new();
    let mut available = 0u64;
    for block in pool {
        if left == 0 {
            break;
        }
        let answers = (block.len() as u64).saturating_sub(1);
        available += answers;
        if answers == 0 {
            continue;
        }
        let take = answers.min(left);
        blocks.push(block[..take as usize + 1].to_vec());
        left -= take;
    }
    if left > 0 {
        return Err(BenchError::Config(format!(
            "a long deployment of {queries} queries asked for; the held-out blocks outside \
             the validation ones answer {available}"
        )));
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::config::{ScoringPlan, TrainingPlan};
    use privmix_ensemble::data::Corpus;

    fn config(members: usize, cap: usize) -> ExperimentConfig {
        ExperimentConfig {
            model: "unused".into(),
            tokenizer: None,
            corpus_dir: "unused".into(),
            user_unit: "speaker".into(),
            cache_dir: "unused".into(),
            results_dir: "unused".into(),
            members,
            held_out_fraction: 0.3,
            block: 16,
            eval_blocks: 1,
            seeds: 1,
            validation_blocks: 1,
            long_queries: 0,
            max_records: Some(cap),
            training: TrainingPlan {
                rank: 1,
                alpha: 2.0,
                targets: Vec::new(),
                epochs: 1.0,
                batch: 1,
                learning_rate: 1e-3,
            },
            dp_sgd: None,
            prediction_baselines: false,
            epsilons: vec![1.0],
            delta: 1e-5,
            scoring: ScoringPlan::default(),
            seed: 1,
            canary: None,
            fine_tuned: false,
            training_per_seed: false,
            member_learning_rates: Vec::new(),
            training_seed_offset: 0,
            studies: None,
        }
    }

    /// Speakers of very different sizes: under a small cap the large ones do not
    /// fit, and some member would get nothing.
    #[test]
    fn a_record_cap_leaves_no_member_without_data() {
        let tokenizer = Tokenizer::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../cli/tests/fixtures/tokenizer/tokenizer.json"),
        )
        .unwrap();
        let play_ids: Vec<String> = (0..12).map(|p| format!("play{p}")).collect();
        let mut plays = Vec::new();
        let mut speakers = Vec::new();
        for (p, id) in play_ids.iter().enumerate() {
            let mut text = String::new();
            for k in 0..6 {
                // 40 to 400 bytes: 2 to 24 blocks of 16 bytes.
                let line = format!("{id} speaker {k} says something. ").repeat(1 + (p + k) % 10);
                speakers.push((format!("{id}/S{k}"), line.clone()));
                text.push_str(&line);
            }
            plays.push((id.clone(), text));
        }
        let plays = Corpus::from_pairs(plays).unwrap();
        let speakers = Corpus::from_pairs(speakers).unwrap();
        let unit = PrivacyUnit::User(UserUnit::Speaker);
        let mut filled = 0;
        for (members, cap) in [(8, 20), (16, 30), (4, 8)] {
            let c = config(members, cap);
            let data = prepare_from_corpus(&c, &tokenizer, &plays, Some(&speakers), unit).unwrap();
            assert!(
                data.members.iter().all(|m| !m.is_empty()),
                "{members} members, cap {cap}"
            );
            let blocks: usize = data.members.iter().map(Vec::len).sum();
            if blocks > cap {
                filled += 1;
            }
        }
        // The cap alone left a member empty in some setting: the rule was needed.
        assert!(filled > 0);
    }

    fn pool() -> Vec<Vec<u32>> {
        (0..4u32)
            .map(|b| (0..5).map(|t| 10 * b + t).collect())
            .collect()
    }

    #[test]
    fn a_long_deployment_answers_exactly_its_queries() {
        let pool = pool();
        // Blocks of 5 tokens answer 4 queries each: 10 = 4 + 4 + 2.
        let long = long_deployment_blocks(10, pool.iter()).unwrap();
        assert_eq!(
            long,
            vec![pool[0].clone(), pool[1].clone(), vec![20, 21, 22]]
        );
        let answered: usize = long.iter().map(|b| b.len() - 1).sum();
        assert_eq!(answered, 10);
        assert_eq!(long_deployment_blocks(8, pool.iter()).unwrap().len(), 2);
        assert!(long_deployment_blocks(0, pool.iter()).unwrap().is_empty());
    }

    #[test]
    fn a_long_deployment_the_pool_cannot_fill_is_refused() {
        let pool = pool();
        let e = long_deployment_blocks(17, pool.iter())
            .unwrap_err()
            .to_string();
        assert!(e.contains("17 queries") && e.contains("answer 16"), "{e}");
    }
}
