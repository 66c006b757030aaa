//! The serving step of `cargo xtask bench` (`--serve-only` alone): `privmix serve`
//! (PMixED over SmolLM2 with 8 LoRA members, release build, 2 threads) under 1, 8 and
//! 32 concurrent streaming clients, beside llama.cpp's own `llama-server` on the same
//! GGUF without privacy (2 threads, continuous batching with 32 slots), both driven by
//! one client script (`xtask/scripts/serve_load.py`, standard library only) on
//! loopback: tokens/s and p50/p99 time per token and to the first token.
//!
//! The two do different work per token: privmix runs the public row and 8 member rows
//! of every request and mixes them, llama.cpp one row. The table is the throughput
//! anchor a provider compares against, not a like-for-like kernel race.
//!
//! `llama-server` is built once from the llama.cpp sources inside PyPI's
//! `llama-cpp-python` sdist (pinned by version and sha256, the version of the
//! repository's llama.cpp fixtures) with CMake from PyPI, into
//! `models-cache/llama-server`, for every instruction set the CPU reports, AMX
//! included (see [`BUILD_FLAGS`]). Every figure
//! comes from a process run here; where one cannot be had (llama-server does not build,
//! does not start, or exits during a level) the section says why, never a number.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::serve_server::{MEMBERS, Server, free_port, load, serve_args};
use crate::workspace::{cargo, workspace_root};

/// The llama.cpp sources: PyPI `llama-cpp-python` 0.3.36's sdist.
const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// C and C++ flags of the llama-server build, beside `GGML_NATIVE` (every instruction
/// set the CPU reports, AMX included, as privmix's kernels use it). GCC 12 drops the
/// stores that fill ggml's AMX tile configuration (`ggml_tile_config_init`,
/// `ggml-cpu/amx/mmq.cpp`) as dead before the `ldtilecfg` that reads them, so the
/// configuration loaded is empty and the first tile instruction stopped the server
/// with SIGILL (seen in its disassembly and under gdb; ggml does ask for, and get, the
/// tile state). Without dead-store elimination the stores stay. A binary whose
/// `build/CMakeCache.txt` holds other flags is rebuilt.
pub(crate) const BUILD_FLAGS: &str = "-fno-tree-dse -fno-dse";
/// Concurrent clients measured.
const CLIENTS: &str = "1,8,32";

/// Runs the step and returns its Markdown section.
pub(crate) fn section(quick: bool) -> String {
    let mut s = String::from("## Serving: `privmix serve` beside llama.cpp's server\n\n");
    match measure(quick) {
        Ok(body) => s.push_str(&body),
        Err(e) => {
            let _ = writeln!(s, "Not measured: {e}\n");
        }
    }
    s
}

fn measure(quick: bool) -> Result<String, String> {
    let root = workspace_root();
    let cache = root.join("models-cache");
    crate::fetch::run(Path::new("models-cache"), Some("smollm2"))?;
    let gguf = cache.join("smollm2.gguf");
    let seconds = if quick { "10" } else { "30" };
    let python = std::env::var("PRIVMIX_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = root.join("xtask").join("scripts").join("serve_load.py");

    // Where cargo put it (`CARGO_TARGET_DIR` included).
    let privmix = crate::workspace::built_executables(&["build", "--release", "-p", "privmix"])?
        .into_iter()
        .find(|e| e.name == "privmix" && e.kinds.iter().any(|k| k == "bin"))
        .ok_or("cargo built no privmix binary")?
        .path;
    let members = cache.join("serve-bench-members");
    cargo(&[
        "run",
        "--release",
        "-p",
        "privmix-ensemble",
        "--example",
        "random_members",
        "--",
        &gguf.to_string_lossy(),
        &members.to_string_lossy(),
        &MEMBERS.to_string(),
    ])?;
    // Read before any server runs: the machine's load, not the bench's own.
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let tmp = std::env::temp_dir().join(format!("privmix-serve-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;

    let ledger = tmp.join("ledger").display().to_string();
    let args = serve_args(&gguf, &ledger, &members);
    let mut rows = Vec::new();
    let server = Server::start(Command::new(&privmix).args(&args), "http://")?;
    rows.extend(load(
        &python,
        &script,
        &server.url,
        "smollm2",
        "privmix PMixED, 8 members",
        CLIENTS,
        seconds,
    )?);
    let phases = server.lines_containing("privmix: phases");
    drop(server);

    match llama_server(&cache, &python) {
        Ok(bin) => rows.extend(
            measure_llama_server(&bin, &gguf, &python, &script, seconds)
                .unwrap_or_else(|e| vec![Value::String(format!("llama.cpp not measured: {e}"))]),
        ),
        Err(e) => rows.push(Value::String(format!("llama.cpp not measured: {e}"))),
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let replicas =
        crate::serve_replicas::section(&privmix, &gguf, &members, &python, &script, seconds)
            .unwrap_or_else(|e| {
                format!("Replicas on one PostgreSQL ledger: not measured: {e}\n\n")
            });

    let mut s = String::new();
    let _ = writeln!(
        s,
        "SmolLM2-135M-Instruct Q4_1, streamed `/v1/completions` of up to 32 tokens, {seconds} s per \
         level, loopback, 2 threads each; load average before: {}.\n",
        load_before
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    s.push_str("| server | clients | tokens/s | p50 ms/token | p99 ms/token | p50 ms to first token | p99 ms to first token | requests |\n|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        match r {
            Value::String(note) => {
                let _ = writeln!(s, "\n{note}\n");
            }
            r => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    r["label"].as_str().unwrap_or("?"),
                    r["clients"],
                    r["tokens_per_s"],
                    r["p50_ms_per_token"],
                    r["p99_ms_per_token"],
                    r["p50_ms_first_token"],
                    r["p99_ms_first_token"],
                    r["requests"]
                );
            }
        }
    }
    s.push_str(&goal_table(&rows));
    s.push_str(
        "\nprivmix computes the public row and 8 member rows per request and mixes them under \
         PMixED (every token charged to the ledger before it is sent); llama.cpp computes one row \
         with no privacy. Both use the CPU's AMX int8 tiles where it has them: llama.cpp \
         through its AMX buffer type (`GGML_NATIVE`, with `-fno-tree-dse -fno-dse`, see \
         `xtask/src/serve_load.rs`), privmix for its products of 16 rows or more.\n\n",
    );
    s.push_str(&replicas);
    if !phases.is_empty() {
        s.push_str(
            "Where privmix's decode loop spent its time (`privmix serve --phase-timings`, \
             sums over each interval, the three levels in turn):\n\n```text\n",
        );
        for line in &phases {
            let _ = writeln!(s, "{}", line.trim_start_matches("privmix: "));
        }
        s.push_str("```\n\n");
    }
    Ok(s)
}

/// The serving goal's ratios at each client level measured for both servers:
/// privmix's tokens/s over llama.cpp's (goal: at least 0.5×) and its p50 time
/// to first token over llama.cpp's (goal: at most 3× at 8 clients). Empty when
/// no level has both rows.
fn goal_table(rows: &[Value]) -> String {
    let row = |prefix: &str, clients: &Value| {
        rows.iter().find(|r| {
            r["label"].as_str().is_some_and(|l| l.starts_with(prefix)) && &r["clients"] == clients
        })
    };
    let mut lines = Vec::new();
    for ours in rows.iter().filter(|r| {
        r["label"]
            .as_str()
            .is_some_and(|l| l.starts_with("privmix"))
    }) {
        let clients = &ours["clients"];
        let Some(theirs) = row("llama.cpp", clients) else {
            continue;
        };
        let ratio = |key: &str| Some(ours[key].as_f64()? / theirs[key].as_f64()?);
        let verdict = |met: bool| if met { "met" } else { "not met" };
        let throughput = match ratio("tokens_per_s") {
            Some(r) => format!("{r:.2}× ({})", verdict(r >= 0.5)),
            None => "?".into(),
        };
        let first = match ratio("p50_ms_first_token") {
            Some(r) if clients == &Value::from(8) => format!("{r:.2}× ({})", verdict(r <= 3.0)),
            Some(r) => format!("{r:.2}×"),
            None => "?".into(),
        };
        lines.push(format!("| {clients} | {throughput} | {first} |"));
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "\nThe goal, from the rows above: privmix's tokens/s at least 0.5× llama.cpp's at \
         every level, and its p50 time to first token at most 3× llama.cpp's at 8 clients.\n\n\
         | clients | tokens/s, privmix / llama.cpp | p50 time to first token, privmix / llama.cpp |\n\
         |---|---|---|\n{}\n",
        lines.join("\n")
    )
}

/// llama-server's rows. A start failure is an error; an exit during the load keeps
/// the rows measured before it and adds a note naming the exit.
fn measure_llama_server(
    bin: &Path,
    gguf: &Path,
    python: &str,
    script: &Path,
    seconds: &str,
) -> Result<Vec<Value>, String> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args([
        "--model",
        &gguf.to_string_lossy(),
        "--threads",
        "2",
        "--parallel",
        "32",
    ])
    .args([
        "--ctx-size",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ]);
    let mut server = Server::start(&mut cmd, "listening on http://")?;
    let url = format!("http://127.0.0.1:{port}");
    let label = "llama.cpp llama-server, no privacy";
    let rows = load(python, script, &url, "smollm2", label, CLIENTS, seconds);
    let Some(exit) = server.exited() else {
        return rows;
    };
    let mut rows = rows.unwrap_or_else(|e| vec![Value::String(format!("{label}: {e}"))]);
    let tail: Vec<String> = server.lines_containing("");
    let tail = &tail[tail.len().saturating_sub(3)..];
    rows.push(Value::String(format!(
        "llama.cpp's server exited during the load ({exit}); the rows above it were measured \
         before or while it stopped. Its last lines: {}",
        tail.join(" / ")
    )));
    Ok(rows)
}

/// Whether the CMake cache in `build` configured the C and C++ flags [`BUILD_FLAGS`].
fn configured_with_build_flags(build: &Path) -> bool {
    let Ok(cache) = std::fs::read_to_string(build.join("CMakeCache.txt")) else {
        return false;
    };
    ["CMAKE_C_FLAGS:STRING=", "CMAKE_CXX_FLAGS:STRING="]
        .iter()
        .all(|key| {
            cache
                .lines()
                .any(|l| l.strip_prefix(key) == Some(BUILD_FLAGS))
        })
}

/// `models-cache/llama-server/llama-server`, built if absent or built with other flags
/// than [`BUILD_FLAGS`].
fn llama_server(cache: &Path, python: &str) -> Result<PathBuf, String> {
    let dir = cache.join("llama-server");
    let bin = dir.join("llama-server");
    let build = dir.join("build");
    if bin.is_file() && configured_with_build_flags(&build) {
        return Ok(bin);
    }
    // A build from other flags (an older build without AMX) starts over.
    let _ = std::fs::remove_dir_all(&build);
    let _ = std::fs::remove_file(&bin);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let fetch = r##"
import hashlib, re, sys, urllib.request
name, sha, out = sys.argv[1], sys.argv[2], sys.argv[3]
html = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = re.search(r'href="([^"]*' + re.escape(name) + r'[^"]*)"', html).group(1).split("#")[0]
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit("sha256 mismatch for " + name)
open(out, "wb").write(data)
"##;
    let sdist = dir.join(SDIST);
    run(Command::new(python)
        .args(["-c", fetch, SDIST, SDIST_SHA256])
        .arg(&sdist))?;
    run(Command::new("tar")
        .arg("xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&dir))?;
    let cmake_dir = dir.join("cmake");
    run(Command::new(python)
        .args(["-m", "pip", "install", "--target"])
        .arg(&cmake_dir)
        .arg("cmake"))?;
    let src = dir
        .join("llama_cpp_python-0.3.36")
        .join("vendor")
        .join("llama.cpp");
    let cmake = |args: &[&str]| {
        run(Command::new(python)
            .env("PYTHONPATH", &cmake_dir)
            .args([
                "-c",
                "import sys; from cmake import cmake; sys.argv[0] = 'cmake'; cmake()",
            ])
            .args(args))
    };
    cmake(&[
        "-S",
        &src.to_string_lossy(),
        "-B",
        &build.to_string_lossy(),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        &format!("-DCMAKE_C_FLAGS={BUILD_FLAGS}"),
        &format!("-DCMAKE_CXX_FLAGS={BUILD_FLAGS}"),
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DBUILD_SHARED_LIBS=OFF",
    ])?;
    cmake(&[
        "--build",
        &build.to_string_lossy(),
        "--target",
        "llama-server",
        "-j",
        "2",
    ])?;
    std::fs::copy(build.join("bin").join("llama-server"), &bin)
        .map_err(|e| format!("llama-server was not built: {e}"))?;
    Ok(bin)
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(flags: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "privmix-serve-load-test-{}-{}",
            std::process::id(),
            flags.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let text: String = flags
            .iter()
            .map(|(k, v)| format!("{k}:STRING={v}\n"))
            .collect();
        std::fs::write(dir.join("CMakeCache.txt"), text).unwrap();
        dir
    }

    #[test]
    fn the_goal_table_divides_privmix_by_llama_cpp_at_each_level() {
        let row = |label: &str, clients: u64, tps: f64, first: f64| {
            serde_json::json!({"label": label, "clients": clients, "tokens_per_s": tps,
                               "p50_ms_first_token": first})
        };
        let rows = vec![
            row("privmix PMixED, 8 members", 1, 60.0, 5.0),
            row("privmix PMixED, 8 members", 8, 40.0, 100.0),
            row("privmix PMixED, 8 members", 32, 90.0, 130.0),
            Value::String("a note".into()),
            row("llama.cpp llama-server, no privacy", 1, 100.0, 4.0),
            row("llama.cpp llama-server, no privacy", 8, 100.0, 25.0),
        ];
        let table = goal_table(&rows);
        assert!(table.contains("| 1 | 0.60× (met) | 1.25× |"), "{table}");
        assert!(
            table.contains("| 8 | 0.40× (not met) | 4.00× (not met) |"),
            "{table}"
        );
        assert!(!table.contains("| 32 |"), "{table}");
        assert_eq!(goal_table(&rows[..3]), "");
    }

    #[test]
    fn a_build_configured_with_the_build_flags_is_kept_and_any_other_is_not() {
        let kept = cache_with(&[
            ("CMAKE_C_FLAGS", BUILD_FLAGS),
            ("CMAKE_CXX_FLAGS", BUILD_FLAGS),
        ]);
        assert!(configured_with_build_flags(&kept));
        let native = cache_with(&[("CMAKE_C_FLAGS", "")]);
        assert!(!configured_with_build_flags(&native));
        assert!(!configured_with_build_flags(&kept.join("absent")));
        let _ = std::fs::remove_dir_all(kept);
        let _ = std::fs::remove_dir_all(native);
    }
}
