//! The README's quick start, run as written: its first `sh` block, without the
//! `cargo install` line, in a fresh folder with `privmix` on the path, `MODEL` the
//! tiny Llama test model, `TOKENIZER` its byte tokenizer and `users.jsonl` the
//! training fixture.

use std::path::PathBuf;
use std::process::Command;

use crate::support::fixture;

/// The first ```sh block of the README, its lines joined where they end in `\`.
fn quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(fixture("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README has a sh block");
    block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_quick_start_runs_as_written() {
    let commands = quick_start();
    assert_eq!(commands[0], "cargo install privmix");
    assert!(commands.len() >= 4, "{commands:?}");
    let dir = std::env::temp_dir().join(format!("privmix-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture("tests/fixtures/train/users.jsonl"),
        dir.join("users.jsonl"),
    )
    .unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_privmix"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for command in &commands[1..] {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", command])
            .current_dir(&dir)
            .env("PATH", &path)
            .env("MODEL", fixture("../models/tests/fixtures/hf/llama"))
            .env(
                "TOKENIZER",
                fixture("tests/fixtures/tokenizer/tokenizer.json"),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{command}` failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let show = Command::new(&bin)
        .args(["ledger", "show", "my.ledger"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("ε = "), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
