//! Hash partition of users into N members: user `u` goes to member
//! `H(seed ‖ u) mod N`, with `H` the first 8 bytes of SHA-256 read as a
//! big-endian integer.
//!
//! Unlike [`super::Partition`] (a seeded shuffle balanced by size, where one
//! user's placement depends on every other user), a user's member here is a
//! function of the seed, the user id and N alone: anyone holding the seed can
//! recompute it, and adding or removing a user moves no one else. Each user
//! lands in exactly one member, which is what the ensemble mechanisms'
//! per-member privacy argument needs ("Differentially Private Next-Token
//! Prediction of Large Language Models", arXiv 2403.15638; "Submix: Practical
//! Private Prediction for Large-Scale Language Models", arXiv 2201.00971).

use sha2::{Digest, Sha256};

use super::corpus::Corpus;
use super::error::DataError;

/// The rule [`hash_member`] applies, in words, for manifests.
pub const HASH_PARTITION_RULE: &str =
    "member = int_be(sha256(le64(seed) || utf8(user))[0..8]) mod members";

/// The member of `user` among `members` (≥ 1) under `seed`: the first 8 bytes
/// of SHA-256 over the seed's 8 little-endian bytes followed by the id's UTF-8
/// bytes, as a big-endian integer, modulo `members` (a bias below
/// `members / 2⁶⁴`). `members == 0` is a [`DataError::BadParameter`].
pub fn hash_member(seed: u64, user: &str, members: usize) -> Result<usize, DataError> {
    if members == 0 {
        return Err(DataError::BadParameter {
            name: "members",
            message: "at least one member".into(),
        });
    }
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(user.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Ok((u64::from_be_bytes(first) % members as u64) as usize)
}

/// Every user of `corpus` placed by [`hash_member`]: one list of user ids per
/// member, each sorted by id.
///
/// Errors: `members == 0` ([`DataError::BadParameter`]), a member that gets
/// no user ([`DataError::EmptyPart`], naming the first such member; another
/// seed or fewer members is the remedy).
pub fn hash_partition(
    corpus: &Corpus,
    seed: u64,
    members: usize,
) -> Result<Vec<Vec<String>>, DataError> {
    let mut out: Vec<Vec<String>> = vec![Vec::new(); members.max(1)];
    for u in corpus.users() {
        out[hash_member(seed, &u.id, members)?].push(u.id.clone());
    }
    for (k, users) in out.iter_mut().enumerate() {
        if users.is_empty() {
            return Err(DataError::EmptyPart(k));
        }
        users.sort();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against an independent computation (Python's hashlib):
    /// `d = sha256(struct.pack('<Q', 7) + b'alice').digest();
    /// int.from_bytes(d[:8], 'big') % 5` is 2, and `% 1000003` is 351568.
    #[test]
    fn known_value() {
        assert_eq!(hash_member(7, "alice", 5).unwrap(), 2);
        assert_eq!(hash_member(7, "alice", 1_000_003).unwrap(), 351_568);
        assert_eq!(hash_member(7, "alice", 1).unwrap(), 0);
        assert!(hash_member(7, "alice", 0).is_err());
    }

    #[test]
    fn every_user_in_exactly_one_member_and_stable_under_additions() {
        let pairs: Vec<(String, String)> = (0..40).map(|i| (format!("u{i}"), "x".into())).collect();
        let corpus = Corpus::from_pairs(pairs.clone()).unwrap();
        let parts = hash_partition(&corpus, 3, 4).unwrap();
        let mut all: Vec<&String> = parts.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 40);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 40);
        // One more user moves no one.
        let mut more = pairs;
        more.push(("new".into(), "y".into()));
        let bigger = hash_partition(&Corpus::from_pairs(more).unwrap(), 3, 4).unwrap();
        for (k, users) in parts.iter().enumerate() {
            for u in users {
                assert!(bigger[k].contains(u));
            }
        }
        // Another seed gives another partition.
        assert_ne!(hash_partition(&corpus, 4, 4).unwrap(), parts);
    }

    #[test]
    fn an_empty_member_is_an_error() {
        let corpus = Corpus::from_pairs([("only", "x")]).unwrap();
        assert_eq!(
            hash_partition(&corpus, 0, 2),
            Err(DataError::EmptyPart(1 - hash_member(0, "only", 2).unwrap()))
        );
    }
}
