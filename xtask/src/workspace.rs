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
