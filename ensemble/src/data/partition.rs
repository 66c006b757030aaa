//! User-level partition of a corpus into N disjoint parts (one fine-tuned
//! member each), SubMix halves inside each part, and a held-out split.
//!
//! Guarantee: every user of the corpus lands in exactly one place (held out,
//! or one part and — with halves — one half of that part), so a member
//! trained on one part never sees another part's users. This is what makes
//! the ensemble mechanisms' per-member privacy argument (PMixED, SubMix:
//! a user changes at most one member / one part) apply at the user level.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;

use super::corpus::Corpus;
use super::error::DataError;

/// How to partition: part count, held-out fraction, SubMix halves, seed.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionConfig {
    /// Number of parts N (≥ 1).
    pub parts: usize,
    /// Fraction of users held out (in `[0, 1)`): the first `⌊f·users⌋`
    /// users of the seeded shuffle.
    pub held_out_fraction: f64,
    /// Split each part into two halves (SubMix).
    pub halves: bool,
    /// Seed of the ChaCha20 shuffle.
    pub seed: u64,
}

impl PartitionConfig {
    /// `parts` parts, nothing held out, no halves.
    pub fn new(parts: usize, seed: u64) -> Self {
        Self {
            parts,
            held_out_fraction: 0.0,
            halves: false,
            seed,
        }
    }
}

/// One part: its users in assignment order, their total size, and the
/// SubMix halves when asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// User ids, in the order they were assigned.
    pub users: Vec<String>,
    /// Total text size of the users, in bytes.
    pub size: u64,
    /// The two halves (each a non-empty subset, together the part's users).
    pub halves: Option<[Half; 2]>,
}

/// One SubMix half of a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Half {
    /// User ids.
    pub users: Vec<String>,
    /// Total text size in bytes.
    pub size: u64,
}

/// A user-level partition: N parts and the held-out users.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub(crate) config: PartitionConfig,
    pub(crate) parts: Vec<Part>,
    pub(crate) held_out: Vec<String>,
    /// Every user's size, for manifests and checks (id, bytes), in corpus order.
    pub(crate) sizes: Vec<(String, u64)>,
}

/// Balancing class of a size: ⌊4·log₂ size⌋ (sizes rounded down to a power
/// of 2^(1/4)), in integers so that it is the same on every platform. Users
/// of 2³² bytes or more share one class (the class only orders the greedy
/// assignment; the balance bound holds for any order).
fn size_class(size: u64) -> u32 {
    let s = u128::from(size.clamp(1, u64::from(u32::MAX)));
    127 - (s * s * s * s).leading_zeros()
}

/// Greedy placement of `items` (id, size) into `bins` bins: each item, in
/// order, goes to the lightest bin (ties: fewer items, then lower index).
///
/// Invariant (by induction over items): heaviest − lightest ≤ the largest
/// item placed, since the bin that grows was the lightest before it grew.
fn greedy(items: &[(String, u64)], bins: usize) -> Vec<(Vec<String>, u64)> {
    let mut out: Vec<(Vec<String>, u64)> = vec![(Vec::new(), 0); bins];
    for (id, size) in items {
        let k = (0..bins)
            .min_by_key(|&k| (out[k].1, out[k].0.len(), k))
            .unwrap_or(0);
        out[k].0.push(id.clone());
        out[k].1 += size;
    }
    out
}

impl Partition {
    /// Partitions `corpus` (design in `notes/corpus-notes.md`): users sorted by
    /// id, shuffled by ChaCha20 seeded with `config.seed`; the first
    /// `⌊held_out_fraction · users⌋` are held out; the rest, ordered by size
    /// class largest first (shuffled order within a class), go one by one to
    /// the lightest part; halves are filled the same way inside each part.
    ///
    /// Guarantees: parts (and halves) are disjoint and, with the held-out
    /// users, cover the corpus; the result depends only on the corpus's set
    /// of users and sizes and on `config`; heaviest − lightest part ≤ the
    /// largest user (same for the two halves of a part).
    ///
    /// Errors: `parts == 0` or a fraction outside `[0, 1)`
    /// ([`DataError::BadParameter`]), fewer remaining users than parts
    /// ([`DataError::FewerUsersThanParts`]), halves of a one-user part
    /// ([`DataError::HalfTooSmall`]).
    pub fn new(corpus: &Corpus, config: &PartitionConfig) -> Result<Self, DataError> {
        if config.parts == 0 {
            return Err(DataError::BadParameter {
                name: "parts",
                message: "at least one part".into(),
            });
        }
        let f = config.held_out_fraction;
        if !(0.0..1.0).contains(&f) {
            return Err(DataError::BadParameter {
                name: "held_out_fraction",
                message: format!("{f} is not in [0, 1)"),
            });
        }
        let sizes: Vec<(String, u64)> = corpus
            .users()
            .iter()
            .map(|u| (u.id.clone(), u.size()))
            .collect();
        let mut order = sizes.clone();
        order.sort();
        order.shuffle(&mut ChaCha20Rng::seed_from_u64(config.seed));
        let held = (f * order.len() as f64).floor() as usize;
        let rest = order.split_off(held);
        let held_out: Vec<String> = order.into_iter().map(|(id, _)| id).collect();
        if rest.len() < config.parts {
            return Err(DataError::FewerUsersThanParts {
                users: rest.len(),
                parts: config.parts,
            });
        }
        let mut rest = rest;
        // Stable: the shuffled order survives within a class.
        rest.sort_by_key(|(_, s)| std::cmp::Reverse(size_class(*s)));
        let size_of = |id: &String| rest.iter().find(|(u, _)| u == id).map_or(0, |(_, s)| *s);
        let mut parts = Vec::with_capacity(config.parts);
        for (index, (users, size)) in greedy(&rest, config.parts).into_iter().enumerate() {
            if users.is_empty() {
                return Err(DataError::EmptyPart(index));
            }
            let halves = if config.halves {
                if users.len() < 2 {
                    return Err(DataError::HalfTooSmall {
                        part: index,
                        users: users.len(),
                    });
                }
                let items: Vec<(String, u64)> =
                    users.iter().map(|u| (u.clone(), size_of(u))).collect();
                let mut h = greedy(&items, 2)
                    .into_iter()
                    .map(|(users, size)| Half { users, size });
                match (h.next(), h.next()) {
                    (Some(a), Some(b)) => Some([a, b]),
                    _ => None,
                }
            } else {
                None
            };
            parts.push(Part {
                users,
                size,
                halves,
            });
        }
        Ok(Self {
            config: config.clone(),
            parts,
            held_out,
            sizes,
        })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &PartitionConfig {
        &self.config
    }

    /// The parts, index = member.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The held-out users.
    pub fn held_out(&self) -> &[String] {
        &self.held_out
    }

    /// Where `user` is: `Some(None)` held out, `Some(Some((part, half)))`
    /// in a part (half `None` without halves), `None` if not in the corpus.
    pub fn placement(&self, user: &str) -> Option<Option<(usize, Option<usize>)>> {
        if self.held_out.iter().any(|u| u == user) {
            return Some(None);
        }
        for (k, p) in self.parts.iter().enumerate() {
            if p.users.iter().any(|u| u == user) {
                let half = p
                    .halves
                    .as_ref()
                    .and_then(|h| h.iter().position(|h| h.users.iter().any(|u| u == user)));
                return Some(Some((k, half)));
            }
        }
        None
    }

    /// Every user and its size in bytes, in corpus order.
    pub fn sizes(&self) -> &[(String, u64)] {
        &self.sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_quarter_powers_of_two() {
        assert_eq!(size_class(1), 0);
        assert_eq!(size_class(2), 4);
        // 2^(5/4) ≈ 2.38, 2^(6/4) ≈ 2.83, 2^(7/4) ≈ 3.36.
        assert_eq!(size_class(3), 6);
        assert_eq!(size_class(4), 8);
        assert_eq!(size_class(1 << 40), size_class(1 << 32));
    }

    #[test]
    fn typed_errors() {
        let c = Corpus::from_pairs([("a", "x"), ("b", "yy"), ("c", "zzz")]).unwrap();
        assert_eq!(
            Partition::new(&c, &PartitionConfig::new(4, 1)),
            Err(DataError::FewerUsersThanParts { users: 3, parts: 4 })
        );
        let mut cfg = PartitionConfig::new(2, 1);
        cfg.held_out_fraction = 0.5; // 1 held out, 2 left for 2 parts
        let p = Partition::new(&c, &cfg).unwrap();
        assert_eq!(p.held_out().len(), 1);
        cfg.halves = true;
        assert_eq!(
            Partition::new(&c, &cfg),
            Err(DataError::HalfTooSmall { part: 0, users: 1 })
        );
        cfg.held_out_fraction = 1.0;
        assert!(matches!(
            Partition::new(&c, &cfg),
            Err(DataError::BadParameter { .. })
        ));
        assert!(matches!(
            Partition::new(&c, &PartitionConfig::new(0, 1)),
            Err(DataError::BadParameter { .. })
        ));
    }
}
