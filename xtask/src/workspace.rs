//! The workspace root, and cargo run from it: what every task builds on (below
//! all the tasks' modules).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

/// Runs `cargo <args>` from the workspace root, failing with the command's name.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with extra environment variables for the child (named in the log line).
pub(crate) fn cargo_with_env(args: &[&str], env: &[(&str, &OsStr)]) -> Result<(), String> {
    let names: String = env.iter().map(|(k, _)| format!(" (with {k})")).collect();
    eprintln!("xtask: cargo {}{names}", args.join(" "));
    let status = cargo_command()
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("could not start cargo {}: {e}", args.join(" ")))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// Runs `cargo <args> --message-format json-render-diagnostics` and returns cargo's
/// `compiler-artifact` messages (one per unit built or already fresh).
pub(crate) fn compiler_artifacts(args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let output = cargo_command()
        .args(args)
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start cargo {}: {e}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo {}` failed ({})",
            args.join(" "),
            output.status
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .collect())
}

/// For every executable that `cargo <args>` reports (built or already fresh), its
/// package name, target name, target kinds and path. Test harnesses
/// (`profile.test`) are left out.
pub(crate) fn built_executables(args: &[&str]) -> Result<Vec<Executable>, String> {
    let mut built = Vec::new();
    for m in compiler_artifacts(args)? {
        if m["profile"]["test"] != false {
            continue;
        }
        let Some(path) = m["executable"].as_str() else {
            continue;
        };
        let package = m["package_id"]
            .as_str()
            .and_then(package_name)
            .ok_or_else(|| format!("cannot read the package of {m}"))?;
        let kinds = m["target"]["kind"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        built.push(Executable {
            package,
            name: m["target"]["name"].as_str().unwrap_or_default().to_string(),
            kinds,
            path: PathBuf::from(path),
        });
    }
    Ok(built)
}

/// An executable target that cargo built.
pub(crate) struct Executable {
    /// Its package's name.
    pub package: String,
    /// The target's name.
    pub name: String,
    /// The target's kinds (`bin`, `example`, …).
    pub kinds: Vec<String>,
    /// The executable.
    pub path: PathBuf,
}

/// The package name in a cargo package id: `path+file:///…/renyi#privmix-renyi@0.1.0`
/// (or `…#0.1.0` when the folder is the name).
pub(crate) fn package_name(id: &str) -> Option<String> {
    let (location, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _version)) => Some(name.to_string()),
        None => location.rsplit('/').next().map(str::to_string),
    }
}

/// The cargo that runs this task (`$CARGO`, else `cargo` on the path), started
/// in the workspace root.
pub(crate) fn cargo_command() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

/// `path` itself when absolute, else taken from the workspace root.
pub(crate) fn from_root(path: &std::path::Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        workspace_root().join(path)
    }
}

/// The workspace root (the folder above `xtask/`).
pub(crate) fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
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
