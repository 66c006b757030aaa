//! What every integration test of the command line needs: a temporary folder, the
//! paths of the fixtures and a way to run the built `privmix` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh empty folder under the system temp dir, removed at drop (`tempfile`'s,
/// its name starting with `privmix-<tag>-` for whoever reads the temp dir).
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("privmix-{tag}-"))
            .tempdir()
            .expect("a temporary folder");
        Self(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `p` inside the folder.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.path().join(p)
    }
}

/// `rel`, relative to this crate's folder (`cli/`).
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The tiny Llama test model (vocabulary 256) of `privmix-models`.
pub fn llama() -> PathBuf {
    fixture("../models/tests/fixtures/hf/llama")
}

/// Runs the built `privmix` binary with `args` and waits for it.
pub fn privmix(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(args)
        .output()
        .expect("privmix runs")
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}
