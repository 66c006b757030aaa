//! What a crates.io user gets: every publishable crate packaged as `cargo publish`
//! would upload it (and its package built on its own), and every crate's examples
//! run as their docs say.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::workspace::{cargo_command, workspace_root};

/// The workspace members that are not published (`publish = false`).
const UNPUBLISHED: [&str; 2] = ["privmix-bench", "privmix-xtask"];

/// `cargo package` of every publishable crate, in dependency order (cargo orders
/// them and resolves each one's workspace dependencies against the packages made
/// before it), each verified by building the packaged sources on their own.
///
/// The verification builds use the workspace's dev-profile settings (passed as
/// `--config`, since a packaged manifest carries no profile), so the
/// dependencies already built for the tests are reused.
pub(crate) fn package() -> Result<(), String> {
    forget_unpacked_packages()?;
    let mut args = vec![
        "--config",
        "profile.dev.debug=\"line-tables-only\"",
        "--config",
        "profile.dev.package.\"*\".opt-level=2",
        "--config",
        "profile.dev.package.\"*\".debug=false",
        // The packaged crates themselves, built again from the temporary registry
        // as dependencies of the later ones: compiled, not optimised.
        "--config",
        "profile.dev.package.privmix-models.opt-level=0",
        "--config",
        "profile.dev.package.privmix-ensemble.opt-level=0",
        "package",
        "--workspace",
        // The tree must be clean for a real publish; CI packages its checkout,
        // and a developer's uncommitted files should not stop the check.
        "--allow-dirty",
    ];
    for crate_name in UNPUBLISHED {
        args.extend(["--exclude", crate_name]);
    }
    crate::workspace::cargo(&args)
}

/// Removes the copies of our packages that an earlier `cargo package` unpacked
/// from its temporary registry into `$CARGO_HOME/registry/src/<registry>/`.
///
/// Cargo unpacks a registry package once per name and version and reuses the
/// folder afterwards, so without this a second run would verify each crate
/// against its dependencies' sources as they were packaged the first time.
/// Only `privmix-*` folders outside crates.io's index are removed.
fn forget_unpacked_packages() -> Result<(), String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return Ok(());
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        if registry
            .file_name()
            .to_string_lossy()
            .starts_with("index.crates.io")
        {
            continue;
        }
        let Ok(packages) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for package in packages.flatten() {
            if package.file_name().to_string_lossy().starts_with("privmix") {
                std::fs::remove_dir_all(package.path())
                    .map_err(|e| format!("cannot remove {}: {e}", package.path().display()))?;
            }
        }
    }
    Ok(())
}

/// The arguments an example needs to run, by crate and example name; an example
/// not named here runs without arguments. Paths are from the workspace root.
fn example_arguments(root: &Path) -> BTreeMap<(&'static str, &'static str), Vec<String>> {
    let path = |p: &str| root.join(p).to_string_lossy().into_owned();
    let mut table = BTreeMap::new();
    // The speed measurement on the tiny GGUF test model, 8 prompt and 4 decoded tokens.
    table.insert(
        ("privmix-models", "speed"),
        vec![
            path("models/tests/fixtures/gguf/llama_q8_0.gguf"),
            "flex".into(),
            "8".into(),
            "4".into(),
        ],
    );
    // Two random members of the tiny Llama, written under target/.
    // Greedy generation with the tiny Llama and its byte tokenizer.
    table.insert(
        ("privmix-models", "generate"),
        vec![
            path("models/tests/fixtures/hf/llama"),
            path("cli/tests/fixtures/tokenizer/tokenizer.json"),
            "To be".into(),
            "8".into(),
        ],
    );
    table.insert(
        ("privmix-ensemble", "random_members"),
        vec![
            path("models/tests/fixtures/hf/llama"),
            path("target/ci-examples/random-members"),
            "2".into(),
        ],
    );
    table
}

/// Builds every example of every workspace crate (the test profile, so the tests'
/// build is reused) and runs each one, failing on the first that exits non-zero.
pub(crate) fn examples() -> Result<(), String> {
    let root = workspace_root();
    let built = build_examples()?;
    let arguments = example_arguments(&root);
    for (package, name, executable) in &built {
        let args = arguments
            .get(&(package.as_str(), name.as_str()))
            .cloned()
            .unwrap_or_default();
        eprintln!("xtask: example {package}/{name} {}", args.join(" "));
        let status = Command::new(executable)
            .args(&args)
            .current_dir(&root)
            .status()
            .map_err(|e| format!("could not start example {package}/{name}: {e}"))?;
        if !status.success() {
            return Err(format!("example {package}/{name} failed ({status})"));
        }
    }
    eprintln!("xtask: {} examples ran", built.len());
    Ok(())
}

/// `cargo build --workspace --examples --profile test`, returning each example's
/// package, name and executable from cargo's JSON messages.
fn build_examples() -> Result<Vec<(String, String, PathBuf)>, String> {
    eprintln!("xtask: cargo build --workspace --examples --profile test");
    let mut child = cargo_command()
        .args([
            "build",
            "--workspace",
            "--examples",
            "--profile",
            "test",
            "--message-format",
            "json-render-diagnostics",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start cargo build --examples: {e}"))?;
    let stdout = child.stdout.take().ok_or("cargo build gave no stdout")?;
    let mut built = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading cargo's messages: {e}"))?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let is_example = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "example"));
        let (Some(executable), true) = (message["executable"].as_str(), is_example) else {
            continue;
        };
        let package = message["package_id"]
            .as_str()
            .and_then(package_name)
            .ok_or_else(|| format!("cannot read the package of {line}"))?;
        let name = message["target"]["name"].as_str().unwrap_or_default();
        built.push((package, name.to_string(), PathBuf::from(executable)));
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo build: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo build --workspace --examples` failed ({status})"
        ));
    }
    built.sort();
    Ok(built)
}

/// The package name in a cargo package id: `path+file:///…/renyi#privmix-renyi@0.1.0`
/// (or `…#0.1.0` when the folder is the name).
fn package_name(id: &str) -> Option<String> {
    let (location, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _version)) => Some(name.to_string()),
        None => location.rsplit('/').next().map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::package_name;

    #[test]
    fn package_names_from_ids() {
        assert_eq!(
            package_name("path+file:///w/renyi#privmix-renyi@0.1.0").as_deref(),
            Some("privmix-renyi")
        );
        assert_eq!(
            package_name("path+file:///w/privmix#0.1.0").as_deref(),
            Some("privmix")
        );
    }
}
