//! API keys: who may query the server, and each tenant's own budget.
//!
//! The keys file is JSON:
//!
//! ```json
//! {"keys": [
//!   {"key": "sk-alice-…", "tenant": "alice", "epsilon": 2.0, "delta": 1e-5},
//!   {"key": "sk-bob-…",   "tenant": "bob"}
//! ]}
//! ```
//!
//! A tenant without `epsilon` spends only from the members' total budget; one with it
//! also has its own. Several keys may name one tenant (they then share its budget, which
//! must be given the same way by each). Budgets here are for a file ledger: a PostgreSQL
//! ledger, shared by replicas, holds its tenants' budgets itself (`privmix ledger
//! tenant-budget`), and the server refuses a keys file that gives any. Keys are compared by their SHA-256 digests, in
//! constant time over the digest, so a key's bytes never steer a comparison.

use std::collections::HashMap;
use std::path::Path;

use privmix_accountant::PrivacyBudget;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::CliError;
use crate::ledger_store::Tenant;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    keys: Vec<KeyEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    key: String,
    tenant: String,
    #[serde(default)]
    epsilon: Option<f64>,
    #[serde(default)]
    delta: Option<f64>,
}

/// The accepted keys (by digest) and their tenants.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    by_digest: Vec<([u8; 32], Tenant)>,
}

impl ApiKeys {
    /// Reads and checks a keys file.
    pub fn load(path: &Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
            what: format!("reading the API keys file {}", path.display()),
            source,
        })?;
        Self::parse(&text)
            .map_err(|reason| CliError::arg("--api-keys", format!("{}: {reason}", path.display())))
    }

    /// Parses a keys file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeysFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if file.keys.is_empty() {
            return Err("no keys".into());
        }
        let mut budgets: HashMap<String, Option<PrivacyBudget>> = HashMap::new();
        let mut by_digest = Vec::with_capacity(file.keys.len());
        for (i, k) in file.keys.into_iter().enumerate() {
            if k.key.len() < 16 {
                return Err(format!("keys[{i}].key: a key needs at least 16 characters"));
            }
            if k.tenant.is_empty() || k.tenant.contains(';') || k.tenant.contains('=') {
                return Err(format!(
                    "keys[{i}].tenant: a tenant name is non-empty, without ';' or '='"
                ));
            }
            let budget = match (k.epsilon, k.delta) {
                (None, None) => None,
                (None, Some(_)) => return Err(format!("keys[{i}].delta without epsilon")),
                (Some(e), d) => Some(
                    PrivacyBudget::new(e, d.unwrap_or(crate::ledger_common::DEFAULT_DELTA))
                        .map_err(|e| format!("keys[{i}]: {e}"))?,
                ),
            };
            match budgets.get(&k.tenant) {
                Some(b) if *b != budget => {
                    return Err(format!(
                        "keys[{i}]: tenant {} is given two different budgets",
                        k.tenant
                    ));
                }
                _ => {
                    budgets.insert(k.tenant.clone(), budget);
                }
            }
            let digest: [u8; 32] = Sha256::digest(k.key.as_bytes()).into();
            if by_digest.iter().any(|(d, _)| *d == digest) {
                return Err(format!("keys[{i}].key: the same key is listed twice"));
            }
            by_digest.push((
                digest,
                Tenant {
                    name: k.tenant,
                    budget,
                },
            ));
        }
        Ok(Self { by_digest })
    }

    /// Whether any tenant is given its own budget.
    pub fn has_budgets(&self) -> bool {
        self.by_digest.iter().any(|(_, t)| t.budget.is_some())
    }

    /// The tenant of `key`, if it is accepted.
    pub fn tenant(&self, key: &str) -> Option<&Tenant> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = None;
        for (d, tenant) in &self.by_digest {
            // Constant time over the digest: every byte of every entry is compared.
            let diff = d.iter().zip(&digest).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(tenant);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_tenants_and_budgets() {
        let keys = ApiKeys::parse(
            r#"{"keys": [
                {"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "alice", "epsilon": 2.0},
                {"key": "sk-bbbbbbbbbbbbbbbb", "tenant": "bob"},
                {"key": "sk-cccccccccccccccc", "tenant": "alice", "epsilon": 2.0}
            ]}"#,
        )
        .unwrap();
        let a = keys.tenant("sk-aaaaaaaaaaaaaaaa").unwrap();
        assert_eq!(a.name, "alice");
        assert_eq!(a.budget.unwrap().epsilon(), 2.0);
        assert_eq!(a.budget.unwrap().delta(), 1e-5);
        assert!(keys.tenant("sk-bbbbbbbbbbbbbbbb").unwrap().budget.is_none());
        assert!(keys.tenant("sk-aaaaaaaaaaaaaaab").is_none());
        assert!(keys.tenant("").is_none());
    }

    #[test]
    fn bad_files_are_refused_with_the_entry() {
        for (text, needle) in [
            (r#"{"keys": []}"#, "no keys"),
            (
                r#"{"keys": [{"key": "short", "tenant": "a"}]}"#,
                "keys[0].key",
            ),
            (
                r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a;b"}]}"#,
                "keys[0].tenant",
            ),
            (
                r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a", "epsilon": -1}]}"#,
                "keys[0]",
            ),
            (
                r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a", "epsilon": 1},
                             {"key": "sk-bbbbbbbbbbbbbbbb", "tenant": "a", "epsilon": 2}]}"#,
                "two different budgets",
            ),
            (
                r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a"},
                             {"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "b"}]}"#,
                "twice",
            ),
            (
                r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a", "x": 1}]}"#,
                "unknown field",
            ),
        ] {
            let e = ApiKeys::parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
