//! Properties of the user-level partition, for every corpus and seed:
//! disjoint and covering, deterministic, balanced (heaviest − lightest part ≤
//! largest user; same for the two halves of a part), halves inside parts,
//! and the manifest reproduces the partition.

use std::collections::HashSet;

use privmix_ensemble::data::{Corpus, DataError, Partition, PartitionConfig};
use proptest::prelude::*;

fn corpus_from(sizes: &[usize]) -> Corpus {
    Corpus::from_pairs(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (format!("user{i:03}"), "x".repeat(s))),
    )
    .unwrap()
}

fn config() -> impl Strategy<Value = (Vec<usize>, PartitionConfig)> {
    (
        prop::collection::vec(1usize..2000, 1..60),
        1usize..12,
        0.0f64..0.5,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(sizes, parts, f, halves, seed)| {
            (
                sizes,
                PartitionConfig {
                    parts,
                    held_out_fraction: f,
                    halves,
                    seed,
                },
            )
        })
}

proptest! {
    #[test]
    fn partition_properties((sizes, cfg) in config()) {
        let corpus = corpus_from(&sizes);
        let n = corpus.len();
        let held = (cfg.held_out_fraction * n as f64).floor() as usize;
        let result = Partition::new(&corpus, &cfg);
        let p = match result {
            Err(DataError::FewerUsersThanParts { users, parts }) => {
                prop_assert_eq!(users, n - held);
                prop_assert!(users < parts);
                return Ok(());
            }
            Err(DataError::HalfTooSmall { part, users }) => {
                prop_assert!(cfg.halves && users < 2);
                let plain = Partition::new(&corpus, &PartitionConfig { halves: false, ..cfg.clone() }).unwrap();
                prop_assert_eq!(plain.parts()[part].users.len(), users);
                return Ok(());
            }
            other => other.unwrap(),
        };
        // Deterministic.
        prop_assert_eq!(&Partition::new(&corpus, &cfg).unwrap(), &p);
        // Disjoint and covering.
        let mut seen = HashSet::new();
        prop_assert_eq!(p.held_out().len(), held);
        for u in p.held_out().iter().chain(p.parts().iter().flat_map(|q| q.users.iter())) {
            prop_assert!(seen.insert(u.clone()), "{} twice", u);
        }
        prop_assert_eq!(seen.len(), n);
        // Balanced: heaviest − lightest ≤ largest user placed in a part.
        let size = |u: &String| corpus.get(u).unwrap().text.len() as u64;
        let largest = p.parts().iter().flat_map(|q| q.users.iter()).map(size).max().unwrap();
        let loads: Vec<u64> = p.parts().iter().map(|q| q.users.iter().map(size).sum()).collect();
        for (q, &l) in p.parts().iter().zip(&loads) {
            prop_assert!(!q.users.is_empty());
            prop_assert_eq!(q.size, l);
        }
        prop_assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= largest);
        // Halves: a partition of their part, non-empty, balanced within it.
        for q in p.parts() {
            match &q.halves {
                None => prop_assert!(!cfg.halves),
                Some(h) => {
                    prop_assert!(cfg.halves);
                    let mut a: Vec<&String> = h[0].users.iter().chain(&h[1].users).collect();
                    let mut b: Vec<&String> = q.users.iter().collect();
                    a.sort();
                    b.sort();
                    prop_assert_eq!(a, b);
                    prop_assert!(!h[0].users.is_empty() && !h[1].users.is_empty());
                    let big = q.users.iter().map(size).max().unwrap();
                    prop_assert!(h[0].size.abs_diff(h[1].size) <= big);
                }
            }
        }
        // Placement agrees, and the manifest rebuilds the same partition.
        for (k, q) in p.parts().iter().enumerate() {
            for u in &q.users {
                prop_assert_eq!(p.placement(u).unwrap().unwrap().0, k);
            }
        }
        let back = Partition::from_manifest(&p.to_manifest()).unwrap();
        prop_assert_eq!(back.parts(), p.parts());
        prop_assert_eq!(back.held_out(), p.held_out());
        back.check_corpus(&corpus).unwrap();
    }

    /// The partition depends on the set of users, not on their order.
    #[test]
    fn order_of_users_does_not_matter((sizes, cfg) in config(), rot in 0usize..60) {
        let corpus = corpus_from(&sizes);
        let mut users = corpus.users().to_vec();
        let k = rot % users.len();
        users.rotate_left(k);
        let rotated = Corpus::new(users).unwrap();
        let a = Partition::new(&corpus, &cfg).map(|p| (p.parts().to_vec(), p.held_out().to_vec()));
        let b = Partition::new(&rotated, &cfg).map(|p| (p.parts().to_vec(), p.held_out().to_vec()));
        prop_assert_eq!(a, b);
    }
}
