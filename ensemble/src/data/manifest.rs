//! The partition manifest: user → part (and half), saved as JSON beside the
//! adapters so that an ensemble can be traced back to the users each member
//! saw, and reloaded to rebuild the same partition without re-running it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::corpus::Corpus;
use super::error::DataError;
use super::partition::{Half, Part, Partition, PartitionConfig};

/// File name of the manifest inside an ensemble directory.
pub const MANIFEST_FILE: &str = "partition.json";

/// Manifest format version written by this crate.
pub const MANIFEST_FORMAT: u32 = 1;

/// One user's line of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// User id.
    pub user: String,
    /// Text size in bytes when partitioned.
    pub size: u64,
    /// Part index; `None` for a held-out user.
    pub part: Option<usize>,
    /// Half (0 or 1) inside the part, when the partition has halves.
    pub half: Option<usize>,
}

/// A partition as JSON: its configuration and where each user went, in the
/// order users were assigned (held out first, then part by part).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// Shuffle seed.
    pub seed: u64,
    /// Part count.
    pub parts: usize,
    /// Held-out fraction.
    pub held_out_fraction: f64,
    /// Whether parts have SubMix halves.
    pub halves: bool,
    /// One entry per user.
    pub users: Vec<ManifestEntry>,
}

impl Partition {
    /// The manifest of this partition.
    pub fn to_manifest(&self) -> Manifest {
        let size: BTreeMap<&str, u64> = self.sizes.iter().map(|(u, s)| (u.as_str(), *s)).collect();
        let entry = |user: &String, part, half| ManifestEntry {
            user: user.clone(),
            size: size.get(user.as_str()).copied().unwrap_or(0),
            part,
            half,
        };
        let mut users: Vec<ManifestEntry> =
            self.held_out.iter().map(|u| entry(u, None, None)).collect();
        for (k, p) in self.parts.iter().enumerate() {
            for u in &p.users {
                let half = p
                    .halves
                    .as_ref()
                    .and_then(|h| h.iter().position(|h| h.users.contains(u)));
                users.push(entry(u, Some(k), half));
            }
        }
        Manifest {
            format: MANIFEST_FORMAT,
            seed: self.config.seed,
            parts: self.config.parts,
            held_out_fraction: self.config.held_out_fraction,
            halves: self.config.halves,
            users,
        }
    }

    /// The partition a manifest describes, checked: known format, unique
    /// users, part indices below `parts`, halves present exactly when the
    /// manifest says so and in `{0, 1}` ([`DataError::ManifestMismatch`]);
    /// no empty part ([`DataError::EmptyPart`]) or half ([`DataError::HalfTooSmall`]).
    pub fn from_manifest(m: &Manifest) -> Result<Self, DataError> {
        let bad = |s: String| Err(DataError::ManifestMismatch(s));
        if m.format != MANIFEST_FORMAT {
            return bad(format!("format {} (expected {MANIFEST_FORMAT})", m.format));
        }
        let mut seen = HashSet::new();
        let mut parts: Vec<Part> = (0..m.parts)
            .map(|_| Part {
                users: Vec::new(),
                size: 0,
                halves: m.halves.then(|| {
                    [0, 1].map(|_| Half {
                        users: Vec::new(),
                        size: 0,
                    })
                }),
            })
            .collect();
        let mut held_out = Vec::new();
        let mut sizes = Vec::with_capacity(m.users.len());
        for e in &m.users {
            if !seen.insert(e.user.as_str()) {
                return bad(format!("user {:?} listed twice", e.user));
            }
            sizes.push((e.user.clone(), e.size));
            let Some(k) = e.part else {
                if e.half.is_some() {
                    return bad(format!("held-out user {:?} has a half", e.user));
                }
                held_out.push(e.user.clone());
                continue;
            };
            let Some(p) = parts.get_mut(k) else {
                return bad(format!("user {:?} in part {k} of {}", e.user, m.parts));
            };
            p.users.push(e.user.clone());
            p.size += e.size;
            match (&mut p.halves, e.half) {
                (Some(h), Some(i)) if i < 2 => {
                    h[i].users.push(e.user.clone());
                    h[i].size += e.size;
                }
                (None, None) => {}
                _ => return bad(format!("user {:?}: half {:?}", e.user, e.half)),
            }
        }
        for (k, p) in parts.iter().enumerate() {
            if p.users.is_empty() {
                return Err(DataError::EmptyPart(k));
            }
            if let Some(h) = &p.halves
                && h.iter().any(|h| h.users.is_empty())
            {
                return Err(DataError::HalfTooSmall {
                    part: k,
                    users: p.users.len(),
                });
            }
        }
        Ok(Self {
            config: PartitionConfig {
                parts: m.parts,
                held_out_fraction: m.held_out_fraction,
                halves: m.halves,
                seed: m.seed,
            },
            parts,
            held_out,
            sizes,
        })
    }

    /// Checks that this partition covers exactly `corpus`'s users with the
    /// same sizes ([`DataError::ManifestMismatch`] names the first difference).
    pub fn check_corpus(&self, corpus: &Corpus) -> Result<(), DataError> {
        let mine: BTreeMap<&str, u64> = self.sizes.iter().map(|(u, s)| (u.as_str(), *s)).collect();
        for u in corpus.users() {
            match mine.get(u.id.as_str()) {
                None => {
                    return Err(DataError::ManifestMismatch(format!(
                        "corpus user {:?} is not in the partition",
                        u.id
                    )));
                }
                Some(&s) if s != u.size() => {
                    return Err(DataError::ManifestMismatch(format!(
                        "user {:?} has {} bytes, the partition recorded {s}",
                        u.id,
                        u.size()
                    )));
                }
                Some(_) => {}
            }
        }
        if mine.len() != corpus.len() {
            return Err(DataError::ManifestMismatch(format!(
                "the partition has {} users, the corpus {}",
                mine.len(),
                corpus.len()
            )));
        }
        Ok(())
    }

    /// Writes the manifest to `dir/`[`MANIFEST_FILE`] (creating `dir`) and
    /// returns the file's path.
    pub fn save_manifest(&self, dir: impl AsRef<Path>) -> Result<PathBuf, DataError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
        let path = dir.join(MANIFEST_FILE);
        let text =
            serde_json::to_string_pretty(&self.to_manifest()).map_err(|e| DataError::Json {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        std::fs::write(&path, text).map_err(|e| DataError::io(&path, e))?;
        Ok(path)
    }

    /// Reads `dir/`[`MANIFEST_FILE`] back (checked as in [`Partition::from_manifest`]).
    pub fn load_manifest(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = dir.as_ref().join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| DataError::io(&path, e))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| DataError::Json {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_manifest(&m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Corpus {
        Corpus::from_pairs((0..9).map(|i| (format!("u{i}"), "x".repeat(i * 3 + 1)))).unwrap()
    }

    #[test]
    fn manifest_round_trips_through_json() {
        let cfg = PartitionConfig {
            parts: 3,
            held_out_fraction: 0.2,
            halves: true,
            seed: 7,
        };
        let p = Partition::new(&corpus(), &cfg).unwrap();
        let dir = std::env::temp_dir().join(format!("privmix-manifest-{}", std::process::id()));
        p.save_manifest(&dir).unwrap();
        let q = Partition::load_manifest(&dir).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(q.parts(), p.parts());
        assert_eq!(q.held_out(), p.held_out());
        assert_eq!(q.config(), p.config());
        q.check_corpus(&corpus()).unwrap();
        let other = Corpus::from_pairs([("u0", "x")]).unwrap();
        assert!(matches!(
            q.check_corpus(&other),
            Err(DataError::ManifestMismatch(_))
        ));
    }

    #[test]
    fn inconsistent_manifests_are_rejected() {
        let p = Partition::new(&corpus(), &PartitionConfig::new(3, 1)).unwrap();
        let mut m = p.to_manifest();
        m.parts = 4;
        assert_eq!(Partition::from_manifest(&m), Err(DataError::EmptyPart(3)));
        let mut m = p.to_manifest();
        m.users[0].part = Some(9);
        assert!(matches!(
            Partition::from_manifest(&m),
            Err(DataError::ManifestMismatch(_))
        ));
        let mut m = p.to_manifest();
        m.users.push(m.users[0].clone());
        assert!(matches!(
            Partition::from_manifest(&m),
            Err(DataError::ManifestMismatch(_))
        ));
    }
}
