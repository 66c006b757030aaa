//! The fine-tuning step of `cargo xtask bench` (`--train-only`: this step
//! alone, written to `train.md`): privmix's LoRA training step
//! (`ensemble/examples/train_speed.rs`) beside PyTorch + PEFT
//! (`xtask/peers/peft_step.py`) on SmolLM2's GGUF file, the same 4 × 128
//! token blocks, LoRA r 8 / alpha 16 on `q_proj` and `v_proj`, AdamW, 2
//! threads; then the DP-SGD step beside Opacus. The two engines alternate,
//! several rounds, so that both see the same load. Target: ≥ 1.2 × PyTorch +
//! PEFT for the LoRA step. Then members trained together against one after
//! another (same members and tokens, as a ratio), and the peak memory of a
//! `privmix train` run (`train_memory`).
//!
//! The peer runs in a virtual environment under `models-cache/peft-venv`,
//! created on first use with pinned PyPI versions ([`PEER_PACKAGES`]).
//! PyPI's Linux torch wheel declares the NVIDIA CUDA wheels (several GB) as
//! dependencies; the peer only uses the CPU, so torch is installed without
//! its dependencies and its pure-Python ones are installed by name.
//!
//! Every figure comes from a process run here; where one cannot be had the
//! report says which and why, never a number.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::speed::run_json;
use crate::workspace::{built_executables, workspace_root};

/// The members rows' shapes: members, blocks of 128 tokens each.
const MEMBER_SHAPES: [(&str, &str); 2] = [("4", "4"), ("16", "1")];

/// Threads given to both engines.
const THREADS: &str = "2";

/// torch, installed without its CUDA dependencies.
const TORCH: &str = "torch==2.9.1";

/// The peer's other packages, pinned (torch's pure-Python dependencies unpinned
/// as torch's own metadata leaves them).
const PEER_PACKAGES: [&str; 10] = [
    "transformers==5.23.0",
    "peft==0.21.2",
    "gguf==0.19.0",
    "opacus==1.6.0",
    "filelock",
    "typing-extensions",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
];

/// One engine's measurements over the rounds, or why there are none.
struct Row {
    label: String,
    rates: Result<Vec<f64>, String>,
    /// The median rate of each round.
    rounds: Vec<f64>,
}

/// Runs the step and returns its Markdown section.
pub(crate) fn section(quick: bool) -> String {
    let (rounds, steps) = if quick { (1, 2) } else { (5, 3) };
    let root = workspace_root();
    let gguf = root.join("models-cache").join("smollm2.gguf");
    let mut s = String::from("## LoRA fine-tuning beside PyTorch + PEFT\n\n");
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
    let python = venv(&root.join("models-cache").join("peft-venv"));
    // The example where cargo built it (`CARGO_TARGET_DIR` honoured).
    let built: Result<std::path::PathBuf, String> = built_executables(&[
        "build",
        "--release",
        "-p",
        "privmix-ensemble",
        "--example",
        "train_speed",
    ])
    .and_then(|all| {
        all.into_iter()
            .find(|e| e.name == "train_speed")
            .map(|e| e.path)
            .ok_or_else(|| "cargo built no train_speed example".to_string())
    });
    let script = root.join("xtask/peers/peft_step.py");
    let steps = steps.to_string();
    for (mode, peer_label) in [
        ("lora", "PyTorch + PEFT"),
        ("dpsgd", "PyTorch + PEFT + Opacus"),
    ] {
        let mut rows = vec![
            Row {
                label: format!("privmix ({THREADS} threads)"),
                rates: Ok(Vec::new()),
                rounds: Vec::new(),
            },
            Row {
                label: format!("{peer_label} ({THREADS} threads)"),
                rates: Ok(Vec::new()),
                rounds: Vec::new(),
            },
        ];
        // The LoRA step's ceiling on this machine: its frozen-weight products alone.
        let ceiling = mode == "lora";
        if ceiling {
            rows.push(Row {
                label: format!(
                    "privmix, frozen-weight products only ({THREADS} threads): \
                     the ceiling of an f32 step"
                ),
                rates: Ok(Vec::new()),
                rounds: Vec::new(),
            });
        }
        let run_ours = |mode: &str| {
            built.clone().and_then(|example| {
                let mut mine = Command::new(example);
                mine.args([&gguf_arg, "--mode", mode, "--steps", &steps])
                    .env("RAYON_NUM_THREADS", THREADS);
                run_json(mine, "train_speed")
            })
        };
        for _ in 0..rounds {
            let ours_run = run_ours(mode);
            let peer_run = python.clone().and_then(|py| {
                let mut cmd = Command::new(py);
                cmd.arg(&script).args([
                    &gguf_arg,
                    "--mode",
                    mode,
                    "--steps",
                    &steps,
                    "--threads",
                    THREADS,
                ]);
                run_json(cmd, "peft_step.py")
            });
            let mut runs = vec![ours_run, peer_run];
            if ceiling {
                runs.push(run_ours("products"));
            }
            for (row, run) in rows.iter_mut().zip(runs) {
                match (&mut row.rates, run.and_then(|v| rates(&v))) {
                    (Ok(all), Ok(more)) => {
                        row.rounds.extend(summary(&more).map(|(m, _, _)| m));
                        all.extend(more);
                    }
                    (Ok(_), Err(e)) => row.rates = Err(e),
                    (Err(_), _) => {}
                }
            }
        }
        render(&mut s, mode, &rows);
    }
    let _ = writeln!(
        s,
        "### Members trained together against one after another\n"
    );
    for (count, rows) in MEMBER_SHAPES {
        members(
            &mut s,
            built.clone(),
            &gguf_arg,
            (count, rows),
            rounds.min(2),
            &steps,
        );
    }
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench --train-only` (`train_speed --mode members`): \
         N members, each its own adapter (rank 8 on q_proj and v_proj) and its own \
         blocks of 128 tokens; each step pair in one process times one step of all members \
         together (every row through its own member's factors) and then one step of each \
         member alone, on the same host copy of the model, {THREADS} threads; tokens/s = \
         N × blocks × 128 / step time; the ratio is each pair's.\n"
    );
    s.push_str(&crate::train_memory::section(quick));
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench --train-only` (`xtask/src/train_peer.rs`): \
         `models-cache/smollm2.gguf`, {rounds} round(s) alternating the engines, each \
         timing {steps} steps after one warm-up step; tokens/s = 4 × 128 / step time. \
         The ceiling row times only the LoRA step's products with the frozen weights \
         (forward and backward, head included; `train_speed --mode products`), through \
         the same `gemm` kernels split the same way over the same threads: no f32 step on \
         this machine runs faster than it, so its ratio to the peer bounds ours. \
         Load average at the start: {}.\n",
        load.trim()
    );
    s
}

/// One members row: `count` members of `rows` × 128 tokens each, trained
/// together (one batched step) and one after another (the same members and
/// tokens, one member per step), alternating step by step in one process
/// (`train_speed --mode members`), `rounds` processes.
fn members(
    s: &mut String,
    example: Result<std::path::PathBuf, String>,
    gguf: &str,
    (count, rows): (&str, &str),
    rounds: usize,
    steps: &str,
) {
    let (mut together, mut alone, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut failed = None;
    for _ in 0..rounds {
        let run = example.clone().and_then(|ex| {
            let mut cmd = Command::new(ex);
            cmd.args([
                gguf,
                "--mode",
                "members",
                "--members",
                count,
                "--rows",
                rows,
            ])
            .args(["--steps", steps])
            .env("RAYON_NUM_THREADS", THREADS);
            run_json(cmd, "train_speed --mode members")
        });
        let read = run.and_then(|v| {
            let list = |key: &str| rates(&serde_json::json!({"tokens_per_s": v[key].clone()}));
            Ok((
                list("tokens_per_s")?,
                list("one_by_one_tokens_per_s")?,
                list("ratios")?,
            ))
        });
        match read {
            Ok((t, a, r)) => {
                together.extend(t);
                alone.extend(a);
                ratios.extend(r);
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let _ = writeln!(s, "{count} members × {rows} blocks of 128 tokens:\n");
    match (
        failed,
        summary(&together),
        summary(&alone),
        summary(&ratios),
    ) {
        (None, Some(t), Some(a), Some(r)) => {
            let _ = writeln!(
                s,
                "| training | tokens/s (median) | range |\n|---|---|---|\n\
                 | together (one batched step) | {:.1} | {:.1}–{:.1} |\n\
                 | one after another | {:.1} | {:.1}–{:.1} |\n\n\
                 Together / one after another, paired step by step: median **{:.2}×** \
                 (range {:.2}–{:.2}× over {} step pairs).\n",
                t.0,
                t.1,
                t.2,
                a.0,
                a.1,
                a.2,
                r.0,
                r.1,
                r.2,
                ratios.len()
            );
        }
        (Some(e), ..) => {
            let _ = writeln!(s, "Not measured: {e}\n");
        }
        _ => {
            let _ = writeln!(s, "Not measured: no step timed\n");
        }
    }
}

/// The virtual environment's Python, created with the pinned packages if absent.
fn venv(dir: &Path) -> Result<String, String> {
    let py = dir.join("bin/python3");
    let ready = dir.join("privmix-peer-ready");
    if !ready.is_file() {
        let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
            eprintln!("xtask: {what}");
            match cmd.status() {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => Err(format!("{what} failed ({s})")),
                Err(e) => Err(format!("could not start {what}: {e}")),
            }
        };
        run(
            Command::new("python3").args(["-m", "venv"]).arg(dir),
            "python3 -m venv",
        )?;
        run(
            Command::new(&py).args(["-m", "pip", "install", "--no-deps", TORCH]),
            "pip install --no-deps torch",
        )?;
        run(
            Command::new(&py)
                .args(["-m", "pip", "install"])
                .args(PEER_PACKAGES),
            "pip install the peer's packages",
        )?;
        std::fs::write(&ready, format!("{TORCH} {}\n", PEER_PACKAGES.join(" ")))
            .map_err(|e| format!("cannot write {}: {e}", ready.display()))?;
    }
    Ok(py.to_string_lossy().into_owned())
}

/// The `tokens_per_s` list of one run's JSON line.
fn rates(v: &Value) -> Result<Vec<f64>, String> {
    let list = v["tokens_per_s"]
        .as_array()
        .ok_or_else(|| format!("no tokens_per_s list in {v}"))?;
    list.iter()
        .map(|x| {
            x.as_f64()
                .filter(|r| r.is_finite() && *r > 0.0)
                .ok_or_else(|| format!("bad tokens/s {x}"))
        })
        .collect()
}

/// Median, least and greatest.
fn summary(rates: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v = rates.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| {
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        (median, v[0], v[n - 1])
    })
}

fn render(s: &mut String, mode: &str, rows: &[Row]) {
    let title = match mode {
        "lora" => "LoRA step (forward, backward, AdamW)",
        _ => "DP-SGD step (per-example gradients, clipping, noise, AdamW)",
    };
    let _ = writeln!(s, "### {title}\n");
    let _ = writeln!(
        s,
        "| engine | tokens/s (median) | range | ratio ours / peer |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    let peer = rows[1].rates.as_ref().ok().and_then(|r| summary(r));
    for row in rows {
        match row.rates.as_ref().map(|r| summary(r)) {
            Ok(Some((m, lo, hi))) => {
                let ratio = match (&row.label, peer) {
                    (l, Some((p, _, _))) if l.starts_with("privmix") => format!("{:.2}×", m / p),
                    _ => String::new(),
                };
                let _ = writeln!(s, "| {} | {m:.1} | {lo:.1}–{hi:.1} | {ratio} |", row.label);
            }
            Ok(None) => {
                let _ = writeln!(s, "| {} | not measured: no step timed | | |", row.label);
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | not measured: {e} | | |", row.label);
            }
        }
    }
    // Rounds alternate the engines, so a round's two medians met the same state
    // of the machine: their ratio drifts less than the ratio of whole-run medians.
    if let Some((m, lo, hi)) = summary(&paired_ratios(&rows[0].rounds, &rows[1].rounds)) {
        let _ = writeln!(
            s,
            "\nPaired by round (ours / peer, each round's medians): median {m:.2}× \
             (range {lo:.2}–{hi:.2}× over {} rounds).",
            rows[0].rounds.len().min(rows[1].rounds.len())
        );
    }
    s.push('\n');
}

/// `ours[i] / peer[i]` for every round both engines finished.
fn paired_ratios(ours: &[f64], peer: &[f64]) -> Vec<f64> {
    ours.iter().zip(peer).map(|(a, b)| a / b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_from_the_json_line_and_bad_ones_refused() {
        let v: Value =
            serde_json::from_str(r#"{"engine":"privmix","tokens_per_s":[300.5, 290]}"#).unwrap();
        assert_eq!(rates(&v).unwrap(), vec![300.5, 290.0]);
        for bad in [
            r#"{"tokens_per_s":[0]}"#,
            r#"{"tokens_per_s":"x"}"#,
            r#"{}"#,
        ] {
            assert!(rates(&serde_json::from_str(bad).unwrap()).is_err(), "{bad}");
        }
        assert_eq!(summary(&[3.0, 1.0, 2.0, 10.0]), Some((2.5, 1.0, 10.0)));
        assert_eq!(summary(&[]), None);
        assert_eq!(
            paired_ratios(&[200.0, 150.0, 9.0], &[100.0, 150.0]),
            vec![2.0, 1.0]
        );
    }
}
