//! The private corpus as users: loading (Shakespeare plays with a chosen
//! user unit, or any list of `(user id, text)`), user-level partition into
//! N disjoint parts with SubMix halves and a held-out split (or by a seeded
//! hash of the user id), the partition manifest, and tokenisation into
//! fixed-length training blocks.

mod blocks;
mod corpus;
mod error;
mod hashed;
mod manifest;
mod partition;
mod shakespeare;

pub use blocks::{cut_blocks, token_blocks};
pub use corpus::{Corpus, UserText};
pub use error::DataError;
pub use hashed::{HASH_PARTITION_RULE, hash_member, hash_partition};
pub use manifest::{MANIFEST_FILE, MANIFEST_FORMAT, Manifest, ManifestEntry};
pub use partition::{Half, Part, Partition, PartitionConfig};
pub use shakespeare::{POEMS, UserUnit, load_shakespeare, play_users};
