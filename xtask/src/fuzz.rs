//! `cargo xtask fuzz` — the cargo-fuzz targets of `fuzz/` (the GGUF and
//! safetensors header parsers of privmix-models), each for a bounded time.
//!
//! cargo-fuzz passes `-Z` flags to rustc, which only nightly accepts; this
//! environment has the stable toolchain, so the run sets `RUSTC_BOOTSTRAP=1`
//! (stable rustc then accepts them). The parsers contain no `unsafe` (the
//! workspace denies it; its one allowed use is a SIMD kernel), so the
//! targets run without AddressSanitizer (`--sanitizer none`): what they look
//! for is a panic, an abort, a timeout or an allocation over libFuzzer's
//! `-rss_limit_mb`, which a malformed header must never cause. Seeds are the
//! committed fixtures; crashes land in `fuzz/artifacts/<target>/`.

use std::path::Path;

/// The targets and the fixtures that seed them.
const TARGETS: [(&str, &[&str]); 2] = [
    (
        "gguf_parse",
        &[
            "models/tests/fixtures/tiny.gguf",
            "models/tests/fixtures/tiny_align64.gguf",
            "models/tests/fixtures/gguf/llama_q8_0.gguf",
            "models/tests/fixtures/gguf/gemma3_q8_0.gguf",
        ],
    ),
    (
        "safetensors_parse",
        &["models/tests/fixtures/safetensors/model-00002-of-00002.safetensors"],
    ),
];

/// The cargo-fuzz release this task installs when `cargo fuzz` is missing.
const CARGO_FUZZ: &str = "0.13.2";

pub(crate) fn run(seconds: u32) -> Result<(), String> {
    let root = crate::workspace::workspace_root();
    ensure_cargo_fuzz()?;
    for (target, seeds) in TARGETS {
        let corpus = root.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        for seed in seeds {
            let from = root.join(seed);
            let name = Path::new(seed).file_name().unwrap_or_default();
            std::fs::copy(&from, corpus.join(name))
                .map_err(|e| format!("cannot copy the seed {}: {e}", from.display()))?;
        }
        eprintln!("xtask: cargo fuzz run {target} for {seconds} s");
        let status = crate::workspace::cargo_command()
            .env("RUSTC_BOOTSTRAP", "1")
            // `--dev`: unoptimised (with debug assertions), which compiles burn and
            // the models in a fraction of a release build's time; a time-bounded run
            // tries fewer inputs, each checked more strictly.
            .args(["fuzz", "run", target, "--dev", "--sanitizer", "none", "--"])
            .arg(format!("-max_total_time={seconds}"))
            // A fixed seed: CI replays the same mutation sequence (bounded by time).
            .args([
                "-seed=1",
                "-rss_limit_mb=2048",
                "-timeout=10",
                "-print_final_stats=1",
            ])
            .status()
            .map_err(|e| format!("could not start cargo fuzz: {e}"))?;
        if !status.success() {
            return Err(format!(
                "fuzz target {target} failed ({status}): the input is in fuzz/artifacts/{target}/"
            ));
        }
    }
    Ok(())
}

fn ensure_cargo_fuzz() -> Result<(), String> {
    let installed = crate::workspace::cargo_command()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    eprintln!("xtask: cargo install cargo-fuzz --locked --version {CARGO_FUZZ}");
    let status = crate::workspace::cargo_command()
        // `--debug`: the tool only drives cargo, so its optimised build is not worth
        // its compile time.
        .args([
            "install",
            "cargo-fuzz",
            "--locked",
            "--debug",
            "--version",
            CARGO_FUZZ,
        ])
        .status()
        .map_err(|e| format!("could not start cargo install: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo install cargo-fuzz failed ({status})"))
    }
}
