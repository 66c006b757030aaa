//! The identity of the adapter set a run loads: the sha256 of each member's
//! weight file (`adapter_model.safetensors`), as the ledger's protected set.
//!
//! Only the members' weights are hashed. They are what holds the private data;
//! the base model is public, and the adapter's configuration only says how the
//! weights are applied. Hashing the base model too would let the same private
//! adapters be charged to a fresh ledger just by loading another copy or format
//! of the same base model (a GGUF instead of a folder), which is the bypass the
//! protected set exists to stop. A different file of weights is a different
//! identity, so a retrained or edited adapter gets a new ledger (printed when
//! created); the check catches mistakes, not an operator set on evading it.

use std::io::Read;
use std::path::{Path, PathBuf};

use privmix_accountant::ProtectedSet;
use privmix_ensemble::lora::ADAPTER_WEIGHTS;
use sha2::{Digest, Sha256};

use crate::error::CliError;

/// `sha256:<hex>` of the adapter folder's weight file.
pub fn adapter_identity(adapter: &Path) -> Result<String, CliError> {
    let file = adapter.join(ADAPTER_WEIGHTS);
    let failed = |source| CliError::AdapterWeights {
        path: adapter.to_path_buf(),
        file: file.clone(),
        source,
    };
    let mut input = std::fs::File::open(&file).map_err(failed)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = input.read(&mut buf).map_err(failed)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// The protected set of `adapters`; two adapters with identical weights are
/// refused ([`CliError::DuplicateAdapter`]): one member's data counted twice
/// breaks the mechanisms' per-member bounds.
pub fn protected_set(adapters: &[PathBuf]) -> Result<ProtectedSet, CliError> {
    let mut ids: Vec<String> = Vec::with_capacity(adapters.len());
    for (i, path) in adapters.iter().enumerate() {
        let id = adapter_identity(path)?;
        if let Some(j) = ids.iter().position(|other| *other == id) {
            return Err(CliError::DuplicateAdapter {
                first: adapters[j].clone(),
                second: adapters[i].clone(),
                identity: id,
            });
        }
        ids.push(id);
    }
    ProtectedSet::new(ids).map_err(|e| CliError::arg("--adapter", e.to_string()))
}
