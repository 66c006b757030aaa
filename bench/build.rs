//! Records what builds the bench binaries, for their reports and the provenance
//! of their cache entries: the compiler, and the commit of the sources compiled
//! (`-dirty` where tracked files differed from it).
//!
//! The commit is read when the binary is built, not when it runs: a binary
//! copied aside and run for an hour while the tree moves on still names the
//! sources it was compiled from.

use std::path::Path;
use std::process::Command;

/// The library crates whose sources a bench binary compiles (with the bench's).
const SOURCE_DIRS: [&str; 8] = [
    "../simd",
    "../renyi",
    "../accountant",
    "../mixing",
    "../mechanisms",
    "../models",
    "../ensemble",
    ".",
];

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(Command::new(rustc).arg("--version"))
        .unwrap_or_else(|| "rustc (version unknown)".into());
    println!("cargo:rustc-env=PRIVMIX_BENCH_RUSTC={version}");
    println!("cargo:rustc-env=PRIVMIX_BENCH_COMMIT={}", build_commit());
    println!("cargo:rerun-if-env-changed=RUSTC");
    // A new commit, a staged change, or an edited source reruns this script.
    if let Some(git_dir) = output(Command::new("git").args(["rev-parse", "--git-dir"])) {
        let git_dir = Path::new(&git_dir);
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", git_dir.join("index").display());
        if let Some(head_ref) = output(Command::new("git").args(["symbolic-ref", "HEAD"])) {
            println!(
                "cargo:rerun-if-changed={}",
                git_dir.join(head_ref).display()
            );
        }
    }
    for dir in SOURCE_DIRS {
        for part in ["src", "Cargo.toml"] {
            let path = Path::new(dir).join(part);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}

/// `HEAD`'s commit, with `-dirty` where a tracked file differs from it, or why
/// it is unknown (built outside a git checkout, as from a published package).
fn build_commit() -> String {
    match output(Command::new("git").args(["rev-parse", "HEAD"])) {
        Some(head) => {
            let dirty =
                output(Command::new("git").args(["status", "--porcelain", "--untracked-files=no"]))
                    .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        None => "unknown (not built inside a git checkout)".into(),
    }
}

/// A command's trimmed standard output, or None where it fails or is missing.
fn output(cmd: &mut Command) -> Option<String> {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}
