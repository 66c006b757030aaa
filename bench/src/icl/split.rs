//! How the kept nouns are dealt out to the seeds of the ICL experiment and to the
//! repetitions of the membership-inference attack.
//!
//! Seed s is one independent deployment (DPS-MOZO, arXiv:2501.19287, §5: "each
//! experiment over five seeds, each running on n_test test examples"): its own test
//! queries, its own private demonstrations D and its own public inputs. One seeded
//! shuffle of the nouns lays out, in order, the test queries of every seed (disjoint
//! blocks, so the 5 × n_test queries are 5 × n_test different nouns) and then the
//! example sets of every attack repetition (disjoint blocks, App. D.1.3: "different
//! random selections of D_test in each repetition"). Each seed then draws its D and
//! its public inputs — disjoint from each other — from the nouns no test query and
//! no attack example uses, by a shuffle of its own; the private sets of two seeds are
//! independent draws and may share nouns, as two deployments' data may.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;

use crate::error::BenchError;

/// The sizes a split is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitSizes {
    /// Seeds (deployments).
    pub seeds: usize,
    /// Test queries per seed.
    pub test_queries: usize,
    /// Private demonstrations |D| per seed.
    pub private_demos: usize,
    /// Public inputs per seed (DPS-MOZO+Off).
    pub public_inputs: usize,
    /// Repetitions of the membership-inference attack.
    pub mia_repetitions: usize,
    /// Examples m per repetition.
    pub mia_examples: usize,
}

/// One seed's nouns, as indices into the kept nouns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSplit {
    /// Its test queries.
    pub queries: Vec<usize>,
    /// Its private demonstrations D.
    pub private: Vec<usize>,
    /// Its public inputs.
    pub public: Vec<usize>,
}

/// The whole split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// One entry per seed.
    pub seeds: Vec<SeedSplit>,
    /// One example set per attack repetition.
    pub mia: Vec<Vec<usize>>,
}

/// The seed of seed `s`'s own randomness (its draw of D, its mechanisms' noise),
/// derived from the run's seed; seed 0 keeps the run's seed.
pub fn seed_of(run_seed: u64, s: usize) -> u64 {
    run_seed ^ (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Deals `nouns` kept nouns out as the module docs describe.
///
/// Errors: no seed or no test query per seed; fewer private demonstrations than
/// `n_shots`; more nouns asked for than kept.
pub fn split(
    nouns: usize,
    sizes: &SplitSizes,
    n_shots: usize,
    run_seed: u64,
) -> Result<Split, BenchError> {
    let s = sizes;
    if s.seeds == 0 || s.test_queries == 0 {
        return Err(BenchError::Config(format!(
            "the ICL experiment needs ≥ 1 seed and ≥ 1 test query per seed ({} seeds × {} queries)",
            s.seeds, s.test_queries
        )));
    }
    if s.private_demos < n_shots {
        return Err(BenchError::Config(format!(
            "{} private demonstrations cannot give {n_shots} shots",
            s.private_demos
        )));
    }
    let held = s.seeds * s.test_queries + s.mia_repetitions * s.mia_examples;
    let need = held + s.private_demos + s.public_inputs;
    if need > nouns {
        return Err(BenchError::Config(format!(
            "{need} nouns asked for ({} seeds × {} test queries, {} attack repetitions × {} \
             examples, then per seed {} private and {} public), {nouns} kept",
            s.seeds,
            s.test_queries,
            s.mia_repetitions,
            s.mia_examples,
            s.private_demos,
            s.public_inputs
        )));
    }
    let mut order: Vec<usize> = (0..nouns).collect();
    order.shuffle(&mut ChaCha20Rng::seed_from_u64(run_seed));
    let (tests, rest) = order.split_at(s.seeds * s.test_queries);
    let (attack, free) = rest.split_at(s.mia_repetitions * s.mia_examples);
    let seeds = tests
        .chunks(s.test_queries)
        .enumerate()
        .map(|(k, queries)| {
            let mut pool = free.to_vec();
            pool.shuffle(&mut ChaCha20Rng::seed_from_u64(seed_of(run_seed, k)));
            SeedSplit {
                queries: queries.to_vec(),
                private: pool[..s.private_demos].to_vec(),
                public: pool[s.private_demos..s.private_demos + s.public_inputs].to_vec(),
            }
        })
        .collect();
    let mia = if s.mia_examples == 0 {
        Vec::new()
    } else {
        attack
            .chunks(s.mia_examples)
            .map(<[usize]>::to_vec)
            .collect()
    };
    Ok(Split { seeds, mia })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const SIZES: SplitSizes = SplitSizes {
        seeds: 5,
        test_queries: 40,
        private_demos: 128,
        public_inputs: 4,
        mia_repetitions: 5,
        mia_examples: 41,
    };

    fn set(v: &[usize]) -> HashSet<usize> {
        v.iter().copied().collect()
    }

    #[test]
    fn sizes_are_as_asked() {
        let sp = split(2000, &SIZES, 4, 7).unwrap();
        assert_eq!(sp.seeds.len(), 5);
        assert_eq!(sp.mia.len(), 5);
        for s in &sp.seeds {
            assert_eq!(s.queries.len(), 40);
            assert_eq!(s.private.len(), 128);
            assert_eq!(s.public.len(), 4);
        }
        assert!(sp.mia.iter().all(|m| m.len() == 41));
        assert!(
            sp.seeds
                .iter()
                .flat_map(|s| s.queries.iter().chain(&s.private).chain(&s.public))
                .chain(sp.mia.iter().flatten())
                .all(|&i| i < 2000)
        );
    }

    #[test]
    fn queries_and_attack_sets_are_disjoint_and_kept_out_of_every_private_set() {
        let sp = split(2000, &SIZES, 4, 7).unwrap();
        let mut held = HashSet::new();
        for i in sp.seeds.iter().flat_map(|s| &s.queries) {
            assert!(held.insert(*i), "test query {i} in two seeds");
        }
        assert_eq!(held.len(), 200);
        for i in sp.mia.iter().flatten() {
            assert!(held.insert(*i), "attack example {i} used twice");
        }
        assert_eq!(held.len(), 200 + 205);
        for s in &sp.seeds {
            let (private, public) = (set(&s.private), set(&s.public));
            assert_eq!(private.len(), 128, "no repeated demonstration");
            assert!(private.is_disjoint(&public));
            assert!(private.is_disjoint(&held) && public.is_disjoint(&held));
        }
        // Independent draws: two seeds' private sets differ.
        assert_ne!(set(&sp.seeds[0].private), set(&sp.seeds[1].private));
    }

    #[test]
    fn the_split_is_a_function_of_the_seed() {
        assert_eq!(
            split(2000, &SIZES, 4, 7).unwrap(),
            split(2000, &SIZES, 4, 7).unwrap()
        );
        assert_ne!(
            split(2000, &SIZES, 4, 7).unwrap().seeds[0].queries,
            split(2000, &SIZES, 4, 8).unwrap().seeds[0].queries
        );
        assert_eq!(seed_of(7, 0), 7);
        assert_ne!(seed_of(7, 1), seed_of(7, 2));
    }

    #[test]
    fn impossible_sizes_are_errors() {
        // 200 + 205 + 128 + 4 = 537 nouns needed.
        assert!(split(537, &SIZES, 4, 1).is_ok());
        assert!(split(536, &SIZES, 4, 1).is_err());
        assert!(split(2000, &SIZES, 129, 1).is_err());
        let none = SplitSizes { seeds: 0, ..SIZES };
        assert!(split(2000, &none, 4, 1).is_err());
        let empty = SplitSizes {
            test_queries: 0,
            ..SIZES
        };
        assert!(split(2000, &empty, 4, 1).is_err());
        let no_attack = SplitSizes {
            mia_examples: 0,
            ..SIZES
        };
        assert!(split(2000, &no_attack, 4, 1).unwrap().mia.is_empty());
    }
}
