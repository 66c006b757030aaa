//! Typed errors of corpus loading, partitioning and tokenisation.

use thiserror::Error;

/// Everything that can go wrong building a corpus of users, partitioning it,
/// reading a partition manifest back or cutting training blocks.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum DataError {
    /// The corpus has no user.
    #[error("empty corpus: no user")]
    EmptyCorpus,
    /// A user's text is empty (a user without text cannot be balanced or trained on).
    #[error("user {0:?} has no text")]
    EmptyUser(String),
    /// Two users share one id.
    #[error("user id {0:?} appears twice")]
    DuplicateUser(String),
    /// After the held-out split, fewer users remain than parts asked for.
    #[error("{users} users (after the held-out split) cannot fill {parts} parts")]
    FewerUsersThanParts {
        /// Users left for the parts.
        users: usize,
        /// Parts asked for.
        parts: usize,
    },
    /// A part has no user (read from a manifest, or zero parts asked for).
    #[error("part {0} has no user")]
    EmptyPart(usize),
    /// SubMix halves asked for, but a part has fewer than two users, so one
    /// half would be empty.
    #[error("part {part} has {users} user(s): it cannot be split into two non-empty halves")]
    HalfTooSmall {
        /// The part.
        part: usize,
        /// Its users.
        users: usize,
    },
    /// A parameter is out of range (held-out fraction outside `[0, 1)`, zero
    /// block length, ...).
    #[error("bad parameter {name}: {message}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A manifest does not describe the corpus it is applied to, or is
    /// internally inconsistent.
    #[error("manifest does not match: {0}")]
    ManifestMismatch(String),
    /// A file could not be read or written.
    #[error("I/O error on {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// A manifest is not JSON of the expected shape.
    #[error("invalid manifest {path}: {message}")]
    Json {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl DataError {
    pub(crate) fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}
