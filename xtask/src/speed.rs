//! The SmolLM2 speed step of `cargo xtask bench` (issue #4): prefill and
//! decode tokens/s of privmix (`models/examples/speed.rs`) on flex with 2
//! threads and on wgpu through Mesa lavapipe, beside llama.cpp
//! (`xtask/scripts/llama_cpp_speed.py`, llama-cpp-python) on the same GGUF
//! with 2 threads, all in one run; and privmix's peak memory (`VmHWM`) over
//! the weights' size in f32. Targets: decode ≥ 0.5× llama.cpp, peak ≤ 1.5×
//! the f32 weights.
//!
//! Every figure comes from a process run here; where one cannot be had
//! (no model file, no Python package, no Vulkan driver, a failed build) the
//! report says which and why, never a number.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::workspace::{cargo, workspace_root};

/// Threads given to both engines (the CI machine has 2 cores).
const THREADS: &str = "2";

/// Matrix products per SmolLM2 decode step whose weight is at least
/// 576 × 576: q, o, gate, up and down in each of the 30 layers, and the
/// head (k and v, 576 × 192, are left out).
const SMOLLM2_PRODUCTS_AT_LEAST_576_SQUARED: f64 = 30.0 * 5.0 + 1.0;

/// Matrix products per SmolLM2 decode step, each at least one kernel
/// dispatch: q, k, v, o, gate, up and down in each of the 30 layers, and the
/// head. (Norms, RoPE, attention and activations add more dispatches, so
/// this is a lower bound.)
const SMOLLM2_PRODUCTS_PER_STEP: f64 = 30.0 * 7.0 + 1.0;

/// One engine's measurement, or why there is none.
struct Row {
    label: String,
    result: Result<Value, String>,
}

/// Runs the step and returns its Markdown section.
pub(crate) fn section(quick: bool) -> String {
    let (prompt, decode) = if quick { (64, 32) } else { (128, 64) };
    let root = workspace_root();
    let gguf = root.join("models-cache").join("smollm2.gguf");
    let mut s = String::from("## SmolLM2 speed beside llama.cpp\n\n");
    if !gguf.is_file() {
        let _ = writeln!(
            s,
            "Not measured: {} is absent (`cargo xtask fetch-models`).\n",
            gguf.display()
        );
        return s;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let gguf_arg = gguf.to_string_lossy().into_owned();
    let (p, d) = (prompt.to_string(), decode.to_string());

    let mut rows = Vec::new();
    let python = std::env::var("PRIVMIX_PYTHON").unwrap_or_else(|_| "python3".into());
    let llama_cpp = crate::llama_cpp::ensure(&root.join("models-cache"), &python);
    // llama.cpp's OpenMP threads spin between operations by default, which
    // is fastest on an idle machine and very slow on a shared one; measure
    // both wait policies and compare with the faster.
    for (label, passive) in [
        ("llama.cpp (OpenMP default wait)", false),
        ("llama.cpp (OMP_WAIT_POLICY=passive)", true),
    ] {
        let script = root
            .join("xtask")
            .join("scripts")
            .join("llama_cpp_speed.py");
        let mut cmd = Command::new(&python);
        cmd.arg(&script).args([&gguf_arg, THREADS, &p, &d]);
        if let Ok(dir) = &llama_cpp {
            cmd.env("PYTHONPATH", dir);
        }
        if passive {
            cmd.env("OMP_WAIT_POLICY", "passive");
        }
        let result = match &llama_cpp {
            Err(e) => Err(format!("llama.cpp not measured: {e}")),
            Ok(_) => run_json(cmd, &format!("{python} {}", script.display())),
        }
        .and_then(|v| match v["error"].as_str() {
            Some(e) => Err(format!("llama.cpp not measured: {e}")),
            None => Ok(v),
        });
        rows.push(Row {
            label: label.into(),
            result,
        });
    }

    let example = root
        .join("target")
        .join("release")
        .join("examples")
        .join("speed");
    let flex = cargo(&[
        "build",
        "--release",
        "-p",
        "privmix-models",
        "--example",
        "speed",
    ])
    .and_then(|()| {
        let mut cmd = Command::new(&example);
        cmd.args([&gguf_arg, "flex", &p, &d])
            .env("RAYON_NUM_THREADS", THREADS);
        run_json(cmd, "models/examples/speed (flex)")
    });
    rows.push(Row {
        label: format!("privmix flex ({THREADS} threads)"),
        result: flex,
    });

    let wgpu = match lavapipe_icd() {
        None => Err(format!(
            "no lavapipe Vulkan driver in {LAVAPIPE_ICD_DIR} (apt-get install mesa-vulkan-drivers)"
        )),
        Some(icd) => cargo(&[
            "build",
            "--release",
            "-p",
            "privmix-models",
            "--features",
            "wgpu",
            "--example",
            "speed",
        ])
        .and_then(|()| {
            let runtime_dir = std::env::temp_dir().join("privmix-xdg-runtime");
            std::fs::create_dir_all(&runtime_dir)
                .map_err(|e| format!("cannot create {}: {e}", runtime_dir.display()))?;
            let mut cmd = Command::new(&example);
            cmd.args([&gguf_arg, "wgpu", &p, &d])
                .env("VK_ICD_FILENAMES", icd)
                .env("XDG_RUNTIME_DIR", runtime_dir);
            run_json(cmd, "models/examples/speed (wgpu)")
        }),
    };
    rows.push(Row {
        label: "privmix wgpu (lavapipe)".into(),
        result: wgpu,
    });

    render(&mut s, &rows, prompt, decode, load.trim());
    s
}

const LAVAPIPE_ICD_DIR: &str = "/usr/share/vulkan/icd.d";

fn lavapipe_icd() -> Option<String> {
    std::fs::read_dir(Path::new(LAVAPIPE_ICD_DIR))
        .ok()?
        .flatten()
        .find_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            (name.starts_with("lvp_icd") && name.ends_with(".json"))
                .then(|| entry.path().to_string_lossy().into_owned())
        })
}

/// Runs `cmd` and parses the last line of its stdout as JSON.
pub(crate) fn run_json(mut cmd: Command, what: &str) -> Result<Value, String> {
    eprintln!("xtask: {what}");
    let out = cmd
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not start {what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("{what} printed no JSON ({e}): {line:?}"))
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v[key].as_f64()
}

fn render(s: &mut String, rows: &[Row], prompt: usize, decode: usize, load: &str) {
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench` (step `xtask/src/speed.rs`): `models-cache/smollm2.gguf` \
         (SmolLM2-135M-Instruct, Q4_1), a fixed prompt of {prompt} tokens (prefill: median of 3 \
         after a warm-up) then {decode} greedy decode steps through the KV cache, {THREADS} \
         threads for llama.cpp (`n_threads`, `n_threads_batch`) and for privmix flex \
         (`RAYON_NUM_THREADS`), one after the other in this run. /proc/loadavg at the start: \
         `{load}` (on a shared machine the absolute rates, and llama.cpp's spinning threads, \
         suffer).\n"
    );
    // The reference: the faster llama.cpp decode of the two wait policies.
    let reference = rows
        .iter()
        .filter(|r| r.label.starts_with("llama.cpp"))
        .filter_map(|r| r.result.as_ref().ok())
        .max_by(|a, b| {
            let key = |v: &Value| num(v, "decode_tok_s").unwrap_or(0.0);
            key(a).total_cmp(&key(b))
        });
    let _ = writeln!(
        s,
        "| engine | prefill tok/s | decode tok/s | prefill ÷ llama.cpp | decode ÷ llama.cpp | peak RSS ÷ f32 weights |\n|---|---|---|---|---|---|"
    );
    let mut notes = Vec::new();
    for row in rows {
        match &row.result {
            Err(why) => {
                let _ = writeln!(s, "| {} | — | — | — | — | — |", row.label);
                notes.push(format!("- {}: not measured — {why}", row.label));
            }
            Ok(v) => {
                let ratio = |key: &str| match (num(v, key), reference.and_then(|r| num(r, key))) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                    _ => "—".into(),
                };
                let peak = match (num(v, "vm_hwm_bytes"), num(v, "f32_weight_bytes")) {
                    (Some(p), Some(w)) if w > 0.0 => format!(
                        "{:.2}× ({:.0} MiB / {:.0} MiB)",
                        p / w,
                        p / 1048576.0,
                        w / 1048576.0
                    ),
                    _ => "—".into(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {:.2} | {} | {} | {} |",
                    row.label,
                    num(v, "prefill_tok_s").unwrap_or(f64::NAN),
                    num(v, "decode_tok_s").unwrap_or(f64::NAN),
                    ratio("prefill_tok_s"),
                    ratio("decode_tok_s"),
                    peak
                );
            }
        }
    }
    let _ = writeln!(s);
    match reference {
        None => notes
            .push("- No llama.cpp figure in this run, so no ratios (see above why).".to_string()),
        Some(r) => {
            let base = num(r, "decode_tok_s").unwrap_or(f64::NAN);
            for row in rows.iter().filter(|r| r.label.starts_with("privmix")) {
                if let Ok(v) = &row.result {
                    let ratio = num(v, "decode_tok_s").unwrap_or(f64::NAN) / base;
                    notes.push(format!(
                        "- {}: decode {ratio:.2}× llama.cpp's faster wait policy — target ≥ 0.5×: {}.",
                        row.label,
                        if ratio >= 0.5 { "met" } else { "NOT met" }
                    ));
                    if let (Some(p), Some(w)) = (num(v, "vm_hwm_bytes"), num(v, "f32_weight_bytes"))
                    {
                        notes.push(format!(
                            "- {}: peak memory {:.2}× the f32 weights — target ≤ 1.5×: {}.",
                            row.label,
                            p / w,
                            if p / w <= 1.5 { "met" } else { "NOT met" }
                        ));
                        if let (Some(r), Some(l)) =
                            (num(v, "runtime_rss_bytes"), num(v, "loaded_rss_bytes"))
                        {
                            notes.push(format!(
                                "  - resident: {:.0} MiB once the backend had started (before any \
                                 weight), {:.0} MiB after the load, {:.0} MiB at the peak.",
                                r / 1048576.0,
                                l / 1048576.0,
                                p / 1048576.0
                            ));
                        }
                    }
                    if let Some(t) = num(v, "matvec_576_s") {
                        let bound = 1.0 / (SMOLLM2_PRODUCTS_AT_LEAST_576_SQUARED * t);
                        notes.push(format!(
                            "  - one [1, 576] × [576, 576] product through burn's matmul took \
                             {:.3} ms on this backend; a decode step makes {:.0} products at least \
                             that large, so its products alone allow at most {bound:.1} tok/s \
                             ({:.3}× llama.cpp).",
                            t * 1e3,
                            SMOLLM2_PRODUCTS_AT_LEAST_576_SQUARED,
                            bound / base
                        ));
                    }
                    // On flex an operation is a host function call, not a dispatch.
                    let dispatched = v["backend"].as_str().is_some_and(|b| b != "flex");
                    if let Some(t) = num(v, "dispatch_s").filter(|_| dispatched) {
                        let bound = 1.0 / (SMOLLM2_PRODUCTS_PER_STEP * t);
                        notes.push(format!(
                            "  - one kernel dispatch (a chain of tiny adds) cost {:.1} µs on this \
                             backend; a decode step dispatches at least its {:.0} products, so \
                             dispatch alone allows at most {bound:.0} tok/s ({:.2}× llama.cpp).",
                            t * 1e6,
                            SMOLLM2_PRODUCTS_PER_STEP,
                            bound / base
                        ));
                    }
                    if let Some(ceiling) = num(v, "f32_decode_ceiling_tok_s") {
                        notes.push(format!(
                            "  - one streaming read of a buffer the size of the f32 weights took \
                             {:.1} ms here (same process, after the run): no engine that reads \
                             f32 weights every token decodes faster than {ceiling:.0} tok/s \
                             ({:.2}× llama.cpp) on this machine.",
                            1e3 / ceiling,
                            ceiling / base
                        ));
                    }
                }
            }
        }
    }
    // Which implementations and kernels privmix ran, as its models print them.
    for row in rows {
        if let Some(plan) = row.result.as_ref().ok().and_then(|v| v["plan"].as_str()) {
            notes.push(format!(
                "- {} execution plan:\n\n```text\n{plan}\n```",
                row.label
            ));
        }
    }
    notes.push(
        "- llama.cpp runs with its default model parameters: on a CPU with AMX int8 tiles its \
         AMX buffer type serves the quantised products (the wheel is built with \
         `-fno-tree-dse -fno-dse`, see `xtask/src/llama_cpp.rs`)."
            .into(),
    );
    let _ = writeln!(s, "{}\n", notes.join("\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(label: &str, prefill: f64, decode: f64, peak: Option<f64>) -> Row {
        let mut v = serde_json::json!({"prefill_tok_s": prefill, "decode_tok_s": decode});
        if let Some(p) = peak {
            v["vm_hwm_bytes"] = p.into();
            v["f32_weight_bytes"] = 100.0.into();
            v["runtime_rss_bytes"] = (10.0 * 1048576.0).into();
            v["loaded_rss_bytes"] = (110.0 * 1048576.0).into();
            v["f32_decode_ceiling_tok_s"] = 60.0.into();
            v["matvec_576_s"] = 0.001.into();
            v["dispatch_s"] = 0.0001.into();
            v["backend"] = if label.contains("wgpu") {
                "wgpu"
            } else {
                "flex"
            }
            .into();
        }
        Row {
            label: label.into(),
            result: Ok(v),
        }
    }

    #[test]
    fn ratios_are_to_the_faster_llama_cpp_and_failures_say_why() {
        let rows = vec![
            measured("llama.cpp (a)", 100.0, 10.0, None),
            measured("llama.cpp (b)", 50.0, 40.0, None),
            measured("privmix flex", 200.0, 20.0, Some(120.0)),
            Row {
                label: "privmix wgpu".into(),
                result: Err("no lavapipe".into()),
            },
        ];
        let mut s = String::new();
        render(&mut s, &rows, 8, 4, "0.00");
        // The reference is llama.cpp (b), the faster decode: prefill 4×, decode 0.5×.
        assert!(
            s.contains("| privmix flex | 200.0 | 20.00 | 4.00× | 0.50× | 1.20×"),
            "{s}"
        );
        assert!(s.contains("decode 0.50× llama.cpp's faster wait policy — target ≥ 0.5×: met."));
        assert!(s.contains("peak memory 1.20× the f32 weights — target ≤ 1.5×: met."));
        assert!(s.contains("10 MiB once the backend had started"), "{s}");
        assert!(s.contains("took 16.7 ms here"), "{s}");
        assert!(s.contains("took 1.000 ms on this backend"), "{s}");
        // 1 / (151 × 1 ms) = 6.6 tok/s, over llama.cpp (b)'s 40 tok/s.
        assert!(s.contains("at most 6.6 tok/s (0.166× llama.cpp)"), "{s}");
        assert!(s.contains("faster than 60 tok/s (1.50× llama.cpp)"), "{s}");
        // On flex an operation is a host call: no dispatch line.
        assert!(!s.contains("kernel dispatch"), "{s}");
        assert!(s.contains("| privmix wgpu | — | — | — | — | — |"));
        assert!(s.contains("privmix wgpu: not measured — no lavapipe"));
    }

    #[test]
    fn a_gpu_backend_gets_the_dispatch_bound() {
        let rows = vec![
            measured("llama.cpp", 50.0, 40.0, None),
            measured("privmix wgpu (lavapipe)", 20.0, 2.0, Some(140.0)),
        ];
        let mut s = String::new();
        render(&mut s, &rows, 8, 4, "0.00");
        // 1 / (211 × 100 µs) = 47 tok/s, over llama.cpp's 40 tok/s.
        assert!(s.contains("cost 100.0 µs on this backend"), "{s}");
        assert!(s.contains("at most 47 tok/s (1.18× llama.cpp)"), "{s}");
        assert!(s.contains("target ≤ 1.5×: met."), "{s}");
        assert!(s.contains("target ≥ 0.5×: NOT met."), "{s}");
    }

    #[test]
    fn without_llama_cpp_there_are_no_ratios() {
        let rows = vec![
            Row {
                label: "llama.cpp".into(),
                result: Err("cannot import llama_cpp".into()),
            },
            measured("privmix flex", 200.0, 20.0, None),
        ];
        let mut s = String::new();
        render(&mut s, &rows, 8, 4, "0.00");
        assert!(
            s.contains("| privmix flex | 200.0 | 20.00 | — | — | — |"),
            "{s}"
        );
        assert!(s.contains("No llama.cpp figure in this run"));
        assert!(!s.contains("target ≥ 0.5×"));
    }
}
