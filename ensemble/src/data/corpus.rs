//! A corpus of users: each user one text. The unit of privacy of the whole
//! pipeline is the user — partitioning never splits a user between parts.

use std::collections::HashSet;

use super::error::DataError;

/// One user's contribution: an id unique in its corpus and the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserText {
    /// Unique id (e.g. `hamlet`, `hamlet/Ham`, `hamlet#0003`).
    pub id: String,
    /// All of the user's text.
    pub text: String,
}

impl UserText {
    /// The user's weight for balancing parts: the text's length in bytes.
    pub fn size(&self) -> u64 {
        self.text.len() as u64
    }
}

/// A non-empty list of users with unique ids and non-empty texts, in the
/// order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus {
    users: Vec<UserText>,
}

impl Corpus {
    /// A corpus from `(user id, text)` pairs.
    ///
    /// Errors: no pair ([`DataError::EmptyCorpus`]), an id given twice
    /// ([`DataError::DuplicateUser`]), an empty text ([`DataError::EmptyUser`]).
    pub fn from_pairs<I, S, T>(pairs: I) -> Result<Self, DataError>
    where
        I: IntoIterator<Item = (S, T)>,
        S: Into<String>,
        T: Into<String>,
    {
        let users: Vec<UserText> = pairs
            .into_iter()
            .map(|(id, text)| UserText {
                id: id.into(),
                text: text.into(),
            })
            .collect();
        Self::new(users)
    }

    /// A corpus from users, checked as in [`Corpus::from_pairs`].
    pub fn new(users: Vec<UserText>) -> Result<Self, DataError> {
        if users.is_empty() {
            return Err(DataError::EmptyCorpus);
        }
        let mut seen = HashSet::with_capacity(users.len());
        for u in &users {
            if u.text.is_empty() {
                return Err(DataError::EmptyUser(u.id.clone()));
            }
            if !seen.insert(u.id.as_str()) {
                return Err(DataError::DuplicateUser(u.id.clone()));
            }
        }
        Ok(Self { users })
    }

    /// The users, in the order given.
    pub fn users(&self) -> &[UserText] {
        &self.users
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Always false (a corpus has at least one user); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The user with id `id`.
    pub fn get(&self, id: &str) -> Option<&UserText> {
        self.users.iter().find(|u| u.id == id)
    }

    /// Total text size in bytes.
    pub fn total_size(&self) -> u64 {
        self.users.iter().map(UserText::size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_corpora() {
        let none: Vec<(String, String)> = vec![];
        assert_eq!(Corpus::from_pairs(none), Err(DataError::EmptyCorpus));
        assert_eq!(
            Corpus::from_pairs([("a", "x"), ("a", "y")]),
            Err(DataError::DuplicateUser("a".into()))
        );
        assert_eq!(
            Corpus::from_pairs([("a", "x"), ("b", "")]),
            Err(DataError::EmptyUser("b".into()))
        );
        let c = Corpus::from_pairs([("a", "xy"), ("b", "z")]).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.total_size(), 3);
        assert_eq!(c.get("b").unwrap().text, "z");
    }
}
