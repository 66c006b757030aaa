//! `cargo xtask bench`: runs the criterion benches and reports what they measured.
//!
//! Each bench group that compares our kernel with a reference pass names the
//! reference `baseline…` (for example `baseline_f32_sum`); the report gives every
//! other member of the group as a ratio to it. Both were measured in the same run
//! of the same process on the same buffers, so the ratio is meaningful even on a
//! noisy machine where the absolute times are not.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{cargo, workspace_root};

/// One measured benchmark.
struct Measured {
    group: String,
    id: String,
    mean_ns: f64,
    lower_ns: f64,
    upper_ns: f64,
}

pub(crate) fn run(out: &Path, quick: bool) -> Result<(), String> {
    let criterion_dir = workspace_root().join("target").join("criterion");
    // Old results of benches that no longer exist must not leak into the report.
    if criterion_dir.exists() {
        fs::remove_dir_all(&criterion_dir)
            .map_err(|e| format!("cannot clear {}: {e}", criterion_dir.display()))?;
    }
    let mut args = vec!["bench", "--workspace", "--benches", "--"];
    if quick {
        args.push("--quick");
    }
    cargo(&args)?;
    let measured = collect(&criterion_dir)?;
    if measured.is_empty() {
        return Err("the benches ran but criterion wrote no results".into());
    }
    let report = render(&measured, quick);
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        workspace_root().join(out)
    };
    fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let path = out.join("README.md");
    fs::write(&path, &report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{report}");
    eprintln!("xtask: report written to {}", path.display());
    Ok(())
}

fn collect(dir: &Path) -> Result<Vec<Measured>, String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "new") {
                    if let Some(m) = read_one(&p)? {
                        found.push(m);
                    }
                } else {
                    stack.push(p);
                }
            }
        }
    }
    found.sort_by(|a, b| (&a.group, &a.id).cmp(&(&b.group, &b.id)));
    Ok(found)
}

fn read_json(path: PathBuf) -> Result<Value, String> {
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_one(new_dir: &Path) -> Result<Option<Measured>, String> {
    let bench = new_dir.join("benchmark.json");
    let estimates = new_dir.join("estimates.json");
    if !bench.exists() || !estimates.exists() {
        return Ok(None);
    }
    let bench = read_json(bench)?;
    let est = read_json(estimates)?;
    let group = bench["group_id"].as_str().unwrap_or("?").to_string();
    let mut id = bench["function_id"].as_str().unwrap_or("").to_string();
    if let Some(v) = bench["value_str"].as_str() {
        if !id.is_empty() {
            id.push('/');
        }
        id.push_str(v);
    }
    let mean = &est["mean"];
    let num = |v: &Value| {
        v.as_f64()
            .ok_or_else(|| format!("bad estimate in {}", new_dir.display()))
    };
    Ok(Some(Measured {
        group,
        id,
        mean_ns: num(&mean["point_estimate"])?,
        lower_ns: num(&mean["confidence_interval"]["lower_bound"])?,
        upper_ns: num(&mean["confidence_interval"]["upper_bound"])?,
    }))
}

fn human(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

fn render(measured: &[Measured], quick: bool) -> String {
    let mut groups: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in measured {
        groups.entry(&m.group).or_default().push(m);
    }
    let mut s = String::new();
    let _ = writeln!(s, "# privmix bench report\n");
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench{}` on {} logical CPUs. Times are criterion's mean \
         with its 95% interval; a ratio divides a bench's mean by the mean of its group's \
         `baseline…` bench, measured in the same run.\n",
        if quick { " --quick" } else { "" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    for (group, items) in groups {
        let _ = writeln!(s, "## {group}\n");
        let _ = writeln!(s, "| bench | mean | 95% interval | ratio to baseline |");
        let _ = writeln!(s, "|---|---|---|---|");
        let base = items.iter().find(|m| m.id.starts_with("baseline"));
        for m in &items {
            let ratio = match base {
                Some(b) if b.mean_ns > 0.0 => format!("{:.2}×", m.mean_ns / b.mean_ns),
                _ => "—".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} – {} | {} |",
                m.id,
                human(m.mean_ns),
                human(m.lower_ns),
                human(m.upper_ns),
                ratio
            );
        }
        let _ = writeln!(s);
    }
    s
}
