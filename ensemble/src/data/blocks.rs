//! Fixed-length training blocks: a part's users tokenised and cut into
//! blocks of `len` tokens. Kept apart from partitioning, so that partition
//! tests need no model.

use privmix_models::Tokenizer;

use super::corpus::Corpus;
use super::error::DataError;

/// Token blocks of exactly `len` ids each, cut from the given users' texts
/// one user at a time (a block never mixes two users, so removing a user
/// removes whole blocks); each user's last incomplete block is dropped.
/// Texts are encoded without special tokens; with `bos`, every block starts
/// with that id followed by `len − 1` text tokens.
///
/// Errors: `len < 2` ([`DataError::BadParameter`]: a block needs an input and
/// a target), a user not in `corpus` ([`DataError::ManifestMismatch`]), a
/// tokenizer failure ([`DataError::Tokenizer`]).
pub fn token_blocks(
    tokenizer: &Tokenizer,
    corpus: &Corpus,
    users: &[String],
    len: usize,
    bos: Option<u32>,
) -> Result<Vec<Vec<u32>>, DataError> {
    let mut out = Vec::new();
    for id in users {
        let user = corpus.get(id).ok_or_else(|| {
            DataError::ManifestMismatch(format!("user {id:?} is not in the corpus"))
        })?;
        let ids = tokenizer
            .encode(&user.text, false)
            .map_err(|e| DataError::Tokenizer(e.to_string()))?;
        out.extend(cut_blocks(&ids, len, bos)?);
    }
    Ok(out)
}

/// `ids` cut into consecutive blocks of `len` (with `bos` first in each,
/// then `len − 1` ids); the incomplete tail is dropped. `len < 2` is a
/// [`DataError::BadParameter`].
pub fn cut_blocks(ids: &[u32], len: usize, bos: Option<u32>) -> Result<Vec<Vec<u32>>, DataError> {
    if len < 2 {
        return Err(DataError::BadParameter {
            name: "len",
            message: format!("block length {len} < 2"),
        });
    }
    let body = len - usize::from(bos.is_some());
    Ok(ids
        .chunks_exact(body)
        .map(|c| bos.into_iter().chain(c.iter().copied()).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_length_and_keep_order() {
        let ids: Vec<u32> = (0..10).collect();
        assert_eq!(
            cut_blocks(&ids, 4, None).unwrap(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(
            cut_blocks(&ids, 4, Some(99)).unwrap(),
            vec![vec![99, 0, 1, 2], vec![99, 3, 4, 5], vec![99, 6, 7, 8]]
        );
        assert!(cut_blocks(&ids, 1, None).is_err());
    }
}
