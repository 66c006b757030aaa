//! What a crates.io user gets: every publishable crate packaged as `cargo publish`
//! would upload it (and checked to build on its own from its packaged files), and
//! every crate's examples run as their docs say.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace::workspace_root;

/// The workspace members that are not published (`publish = false`).
const UNPUBLISHED: [&str; 2] = ["privmix-bench", "privmix-xtask"];

/// The publishable crates, in dependency order.
const PUBLISHED: [&str; 8] = [
    "privmix-simd",
    "privmix-renyi",
    "privmix-accountant",
    "privmix-mixing",
    "privmix-models",
    "privmix-ensemble",
    "privmix-mechanisms",
    "privmix",
];

/// What `cargo publish` would refuse, checked without building every crate again
/// from its package:
///
/// 1. `cargo package --workspace --no-verify` writes every publishable crate's
///    `.crate` as `cargo publish` would upload it: an invalid manifest, a path
///    dependency without a version or a missing readme or license fails here.
/// 2. Each crate is checked on its own (`cargo check -p <crate>`: its default
///    features, none unified from other members or from dev-dependencies), as a
///    packaged crate is built: a feature the crate needs but does not enable fails.
/// 3. Every source file that check read (rustc's dep-info: modules,
///    `include_str!`/`include_bytes!` files) must be one of the package's files
///    (`cargo package --list`): a file left out of the package fails.
///
/// Together these catch what `cargo package`'s verification build catches, except
/// errors only code generation or linking finds, which the workspace's own builds
/// of the same sources (tests, examples, the bench smoke) catch.
pub(crate) fn package() -> Result<(), String> {
    let mut args = vec!["package", "--workspace", "--no-verify", "--locked"];
    // The tree must be clean for a real publish; CI packages its checkout,
    // and a developer's uncommitted files should not stop the check.
    args.push("--allow-dirty");
    for crate_name in UNPUBLISHED {
        args.extend(["--exclude", crate_name]);
    }
    crate::workspace::cargo(&args)?;
    let root = workspace_root();
    let dirs = crate_dirs()?;
    for crate_name in PUBLISHED {
        let listed = package_files(crate_name)?;
        let dir = dirs
            .get(crate_name)
            .ok_or_else(|| format!("{crate_name} is not a workspace member"))?;
        let read = checked_sources(crate_name)?;
        let mut missing: Vec<String> = Vec::new();
        for source in &read {
            if !source.starts_with(&root) || source.starts_with(root.join("target")) {
                continue; // registry sources and build-script outputs
            }
            match source.strip_prefix(dir) {
                Ok(rel) if listed.contains(&rel.to_string_lossy().replace('\\', "/")) => {}
                _ => missing.push(source.display().to_string()),
            }
        }
        if !missing.is_empty() {
            return Err(format!(
                "{crate_name}: its build reads files its package leaves out (check `include`/\
                 `exclude` in its Cargo.toml): {}",
                missing.join(", ")
            ));
        }
        eprintln!(
            "xtask: {crate_name}: checked alone; its {} source files are all in its package",
            read.len()
        );
    }
    Ok(())
}

/// The files `cargo package` puts in a crate's package, relative to the crate.
fn package_files(crate_name: &str) -> Result<std::collections::BTreeSet<String>, String> {
    let output = crate::workspace::cargo_command()
        .args([
            "package",
            "--list",
            "--allow-dirty",
            "--locked",
            "-p",
            crate_name,
        ])
        .output()
        .map_err(|e| format!("could not start cargo package --list: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo package --list -p {crate_name}` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Every workspace member's folder by package name, from `cargo metadata`.
fn crate_dirs() -> Result<BTreeMap<String, PathBuf>, String> {
    let output = crate::workspace::cargo_command()
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .output()
        .map_err(|e| format!("could not start cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!("`cargo metadata` failed ({})", output.status));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cannot read cargo metadata's output: {e}"))?;
    Ok(metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let name = p["name"].as_str()?.to_string();
            let dir = Path::new(p["manifest_path"].as_str()?).parent()?;
            Some((name, dir.to_path_buf()))
        })
        .collect())
}

/// `cargo check -p <crate>` (its lib and binaries, its own features), returning every
/// source file rustc read for that crate's targets, from their dep-info files.
fn checked_sources(crate_name: &str) -> Result<Vec<PathBuf>, String> {
    let args = ["check", "-p", crate_name, "--locked"];
    let artifacts = crate::workspace::compiler_artifacts(&args)
        .map_err(|e| format!("{e}: {crate_name} does not build on its own"))?;
    let mut sources = Vec::new();
    let mut targets = 0;
    for m in artifacts {
        let ours = m["package_id"]
            .as_str()
            .and_then(crate::workspace::package_name)
            .is_some_and(|name| name == crate_name);
        if !ours {
            continue;
        }
        let Some(kinds) = m["target"]["kind"].as_array() else {
            continue;
        };
        if kinds.iter().any(|k| k == "custom-build") {
            continue;
        }
        for file in m["filenames"].as_array().into_iter().flatten() {
            let Some(rmeta) = file.as_str().map(Path::new) else {
                continue;
            };
            let stem = rmeta.file_stem().unwrap_or_default().to_string_lossy();
            let stem = stem.strip_prefix("lib").unwrap_or(&stem);
            let dep_info = rmeta.with_file_name(format!("{stem}.d"));
            sources.extend(dep_info_sources(&dep_info)?);
            targets += 1;
        }
    }
    if targets == 0 {
        return Err(format!(
            "`cargo check -p {crate_name}` reported no target of the crate"
        ));
    }
    sources.sort();
    sources.dedup();
    Ok(sources)
}

/// The prerequisites of a Makefile-style dep-info file (`out: src1 src2 …`, each
/// source also listed on its own line as `src:`), with `\ ` unescaped.
fn dep_info_sources(path: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the dep-info file {}: {e}", path.display()))?;
    let mut sources = Vec::new();
    for line in text.lines() {
        // `src:` lines with no prerequisites name each source once; `# env-dep:` lines
        // are comments.
        let Some(name) = line.strip_suffix(':') else {
            continue;
        };
        if !name.starts_with('#') {
            sources.push(PathBuf::from(name.replace("\\ ", " ")));
        }
    }
    Ok(sources)
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
    // Eight random members of the tiny Llama, written under target/ (serve_step's).
    table.insert(
        ("privmix-ensemble", "random_members"),
        vec![
            path("models/tests/fixtures/hf/llama"),
            path("target/ci-examples/random-members"),
            "8".into(),
        ],
    );
    // Decode steps of the server's configuration over those 8 members (run after
    // random_members: examples run in name order), at 1 and 2 requests, 1 step each.
    table.insert(
        ("privmix-ensemble", "serve_step"),
        vec![
            path("models/tests/fixtures/hf/llama"),
            path("target/ci-examples/random-members"),
            "1".into(),
            "2".into(),
        ],
    );
    table
}

/// Runs every example of every workspace crate, failing on the first that exits
/// non-zero. The examples are the ones `cargo xtask test`'s workspace test run built
/// (`cargo test` compiles every example): listing them with the same command and
/// `--no-run` builds nothing again.
pub(crate) fn examples() -> Result<(), String> {
    let root = workspace_root();
    let mut args = crate::ci::WORKSPACE_TEST.to_vec();
    args.push("--no-run");
    let mut built: Vec<_> = crate::workspace::built_executables(&args)?
        .into_iter()
        .filter(|e| e.kinds.iter().any(|k| k == "example"))
        .collect();
    built.sort_by(|a, b| (&a.package, &a.name).cmp(&(&b.package, &b.name)));
    let arguments = example_arguments(&root);
    for example in &built {
        let (package, name) = (&example.package, &example.name);
        let args = arguments
            .get(&(package.as_str(), name.as_str()))
            .cloned()
            .unwrap_or_default();
        eprintln!("xtask: example {package}/{name} {}", args.join(" "));
        let status = Command::new(&example.path)
            .args(&args)
            .current_dir(&root)
            .status()
            .map_err(|e| format!("could not start example {package}/{name}: {e}"))?;
        if !status.success() {
            return Err(format!("example {package}/{name} failed ({status})"));
        }
    }
    if built.is_empty() {
        return Err("the tests' build lists no examples".into());
    }
    eprintln!("xtask: {} examples ran", built.len());
    Ok(())
}
