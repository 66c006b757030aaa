//! `cargo xtask bench`: runs the criterion benches and reports what they measured
//! (`--criterion-only`: those alone, written to `criterion.md`).
//!
//! Each bench group that compares our kernel with a reference pass names the
//! reference `baseline…` (for example `baseline_f32_sum`); the report gives every
//! other member of the group as a ratio to it. Both were measured in the same run
//! of the same process on the same buffers, so the ratio is meaningful even on a
//! noisy machine where the absolute times are not.
//!
//! After the benches, `speed.rs` measures SmolLM2's prefill and decode
//! tokens/s beside llama.cpp's on the same file (`--speed-only`: that step
//! alone, written to `speed.md`). Then `serve_load.rs` measures `privmix serve`
//! under concurrent clients beside llama.cpp's server (`--serve-only`: `serve.md`).
//!
//! The report goes to the output folder (git-ignored); the measured figures also
//! go to the checked-in performance page, `docs/performance.md`
//! (`performance.rs`): a run refreshes the sections it measured there (the
//! criterion benches, the speed and serving steps) and keeps the others.
//! `--no-page` leaves the page alone.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::performance::{self, RunInfo, SECTIONS, with_run_line};
use crate::workspace::{cargo, workspace_root};

/// One measured benchmark.
struct Measured {
    group: String,
    id: String,
    mean_ns: f64,
    lower_ns: f64,
    upper_ns: f64,
}

/// What `cargo xtask bench` was asked to do.
pub(crate) struct Options {
    /// criterion `--quick` and the experiment's `--quick`.
    pub quick: bool,
    /// Only the SmolLM2 speed step.
    pub speed_only: bool,
    /// Only the privacy–utility experiment.
    pub experiment_only: bool,
    /// Only the serving load test.
    pub serve_only: bool,
    /// Only the fine-tuning step beside PyTorch + PEFT.
    pub train_only: bool,
    /// Only the criterion benches.
    pub criterion_only: bool,
    /// Extra arguments for the experiment binary.
    pub experiment_args: Vec<String>,
    /// Leave `docs/performance.md` as it is.
    pub no_page: bool,
    /// How the experiment binary is built.
    pub experiment_build: ExperimentBuild,
}

/// How `cargo xtask bench` builds the privacy–utility binary.
#[derive(Clone, Copy)]
pub(crate) enum ExperimentBuild {
    /// `--release`: what measurements use.
    Release,
    /// The binary that `cargo xtask test`'s workspace test run built (its `cargo test`
    /// arguments, run again with `--no-run`): its smoke run reuses that build instead
    /// of compiling everything again in release.
    Tests(&'static [&'static str]),
}

pub(crate) fn run(out: &Path, options: Options) -> Result<(), String> {
    let Options {
        quick,
        speed_only,
        experiment_only,
        serve_only,
        train_only,
        criterion_only,
        experiment_args,
        no_page,
        experiment_build,
    } = options;
    let mut command = String::from("cargo xtask bench");
    for (flag, on) in [
        (" --quick", quick),
        (" --speed-only", speed_only),
        (" --serve-only", serve_only),
        (" --train-only", train_only),
        (" --criterion-only", criterion_only),
    ] {
        if on {
            command.push_str(flag);
        }
    }
    let refresh_page = |fresh: &[(&str, String)]| -> Result<(), String> {
        if no_page {
            return Ok(());
        }
        let root = workspace_root();
        let run = RunInfo::collect(command.clone(), &root);
        let fresh: Vec<(&str, String)> = fresh
            .iter()
            .map(|(name, section)| (*name, with_run_line(section, heading(name), &run)))
            .collect();
        let path = performance::update(&root, &fresh)?;
        eprintln!("xtask: performance page refreshed: {}", path.display());
        Ok(())
    };
    let out = crate::workspace::from_root(out);
    fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    if experiment_only {
        let section = experiment(&out, quick, &experiment_args, experiment_build)?;
        let report = format!("# privmix privacy–utility report\n\n{section}");
        return write_report(&out.join("experiment.md"), &report);
    }
    if serve_only {
        let serve = crate::serve_load::section(quick);
        let report = format!("# privmix serving report\n\n{serve}");
        write_report(&out.join("serve.md"), &report)?;
        return refresh_page(&[("serve", serve)]);
    }
    if train_only {
        let train = crate::train_peer::section(quick);
        let report = format!("# privmix fine-tuning report\n\n{train}");
        write_report(&out.join("train.md"), &report)?;
        return refresh_page(&[("train", train)]);
    }
    if speed_only {
        // The speed step alone, in its own file: the criterion report stays.
        let speed = crate::speed::section(quick);
        let report = format!("# privmix speed report\n\n{speed}");
        write_report(&out.join("speed.md"), &report)?;
        return refresh_page(&[("speed", speed)]);
    }
    let criterion_dir = workspace_root().join("target").join("criterion");
    // Old results of benches that no longer exist must not leak into the report.
    if criterion_dir.exists() {
        fs::remove_dir_all(&criterion_dir)
            .map_err(|e| format!("cannot clear {}: {e}", criterion_dir.display()))?;
    }
    // `--bench "*"` selects the criterion targets only: `--benches` also runs every
    // lib and bin under libtest, which rejects criterion's `--quick`.
    let mut args = vec!["bench", "--workspace", "--bench", "*", "--"];
    if quick {
        args.push("--quick");
    }
    cargo(&args)?;
    let measured = collect(&criterion_dir)?;
    if measured.is_empty() {
        return Err("the benches ran but criterion wrote no results".into());
    }
    let mut report = render(&measured, quick);
    if criterion_only {
        write_report(&out.join("criterion.md"), &report)?;
        return refresh_page(&[("criterion", criterion_section(&measured))]);
    }
    // SmolLM2 beside llama.cpp: separate processes, after the criterion
    // benches so that they do not share the cores with them.
    let speed = crate::speed::section(quick);
    report.push_str(&speed);
    // `privmix serve` under concurrent clients beside llama.cpp's server.
    let serve = crate::serve_load::section(quick);
    report.push_str(&serve);
    // privmix's fine-tuning step beside PyTorch + PEFT (and Opacus).
    let train = crate::train_peer::section(quick);
    report.push_str(&train);
    // The measured figures, before the experiment (which may fail) runs.
    refresh_page(&[
        ("criterion", criterion_section(&measured)),
        ("speed", speed),
        ("serve", serve),
        ("train", train),
    ])?;
    // Last, the privacy–utility experiment on SmolLM2 and Shakespeare.
    report.push_str(&experiment(
        &out,
        quick,
        &experiment_args,
        experiment_build,
    )?);
    write_report(&out.join("README.md"), &report)
}

/// Fetches SmolLM2, all-MiniLM-L6-v2, the plays and WordNet if needed, runs the `privacy-utility` binary
/// (release build) into `out/privacy-utility`, and returns its report as a
/// section of the main report (image links made relative to `out`).
fn experiment(
    out: &Path,
    quick: bool,
    extra: &[String],
    build: ExperimentBuild,
) -> Result<String, String> {
    let cache = Path::new("models-cache");
    crate::fetch::run(cache, Some("smollm2"))?;
    crate::fetch::run(cache, Some("minilm"))?;
    crate::data::run(cache)?;
    let dir = out.join("privacy-utility");
    let mut args = vec!["--out".to_string(), dir.to_string_lossy().into_owned()];
    if quick {
        args.push("--quick".into());
    }
    args.extend(extra.iter().cloned());
    let started = std::time::Instant::now();
    match build {
        ExperimentBuild::Release => {
            let mut cargo_args = vec![
                "run",
                "--release",
                "-p",
                "privmix-bench",
                "--bin",
                "privacy-utility",
                "--",
            ];
            cargo_args.extend(args.iter().map(String::as_str));
            cargo(&cargo_args)?;
        }
        ExperimentBuild::Tests(test_command) => {
            let mut cargo_args = test_command.to_vec();
            cargo_args.push("--no-run");
            let executable = crate::workspace::built_executables(&cargo_args)?
                .into_iter()
                .find(|e| e.name == "privacy-utility" && e.kinds.iter().any(|k| k == "bin"))
                .ok_or("the tests' build has no privacy-utility binary")?
                .path;
            eprintln!("xtask: {} {}", executable.display(), args.join(" "));
            let status = std::process::Command::new(&executable)
                .args(&args)
                .current_dir(workspace_root())
                .status()
                .map_err(|e| format!("could not start {}: {e}", executable.display()))?;
            if !status.success() {
                return Err(format!("privacy-utility failed ({status})"));
            }
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let text = fs::read_to_string(dir.join("README.md"))
        .map_err(|e| format!("the experiment wrote no report: {e}"))?;
    // Demote its headings one level and point its images into its folder.
    let mut section = format!(
        "## Privacy–utility experiment{} ({minutes:.1} min with the build)\n\n\
         Full report, plots and raw JSON: `privacy-utility/`.\n\n",
        if quick { " (--quick)" } else { "" }
    );
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let _ = writeln!(section, "### {rest}");
        } else if let Some(rest) = line.strip_prefix("## ") {
            let _ = writeln!(section, "### {rest}");
        } else if let Some(rest) = line.strip_prefix("![") {
            let _ = writeln!(section, "![{}", rest.replace("](", "](privacy-utility/"));
        } else {
            let _ = writeln!(section, "{line}");
        }
    }
    Ok(section)
}

fn write_report(path: &Path, report: &str) -> Result<(), String> {
    fs::write(path, report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
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

/// What the times and ratios are, for both the report and the page.
const EXPLAINED: &str = "Times are criterion's mean with its 95% interval; a ratio divides a \
bench's mean by the mean of one of its group's `baseline…` benches, measured in the same run.";

fn render(measured: &[Measured], quick: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# privmix bench report\n");
    let _ = writeln!(
        s,
        "Produced by `cargo xtask bench{}` on {} logical CPUs. {EXPLAINED}\n",
        if quick { " --quick" } else { "" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    render_groups(&mut s, measured, "##");
    s
}

/// The criterion section of the performance page: every group's table, under
/// `###` headings (the run line goes above, see `performance::with_run_line`).
fn criterion_section(measured: &[Measured]) -> String {
    let mut s = format!("## {}\n\n{EXPLAINED}\n\n", heading("criterion"));
    render_groups(&mut s, measured, "###");
    s
}

/// The page heading of section `name` of `performance::SECTIONS`.
fn heading(name: &str) -> &'static str {
    SECTIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("Measured", |(_, heading)| heading)
}

/// One table per group (`{level} group` headings): each bench's mean and
/// interval, and its ratio to every `baseline…` bench of the group.
fn render_groups(s: &mut String, measured: &[Measured], level: &str) {
    let mut groups: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in measured {
        groups.entry(&m.group).or_default().push(m);
    }
    for (group, items) in groups {
        let _ = writeln!(s, "{level} {group}\n");
        // One ratio column per `baseline…` bench of the group: a group may compare
        // against both a plain pass and a straightforward implementation.
        let bases: Vec<&&Measured> = items
            .iter()
            .filter(|m| m.id.starts_with("baseline"))
            .collect();
        let mut header = String::from("| bench | mean | 95% interval |");
        let mut rule = String::from("|---|---|---|");
        for b in &bases {
            let _ = write!(header, " ratio to {} |", b.id);
            rule.push_str("---|");
        }
        let _ = writeln!(s, "{header}\n{rule}");
        for m in &items {
            let _ = write!(
                s,
                "| {} | {} | {} – {} |",
                m.id,
                human(m.mean_ns),
                human(m.lower_ns),
                human(m.upper_ns)
            );
            for b in &bases {
                if b.mean_ns > 0.0 {
                    let _ = write!(s, " {:.2}× |", m.mean_ns / b.mean_ns);
                } else {
                    s.push_str(" — |");
                }
            }
            s.push('\n');
        }
        let _ = writeln!(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(group: &str, id: &str, mean_ns: f64) -> Measured {
        Measured {
            group: group.into(),
            id: id.into(),
            mean_ns,
            lower_ns: mean_ns * 0.9,
            upper_ns: mean_ns * 1.1,
        }
    }

    #[test]
    fn ratios_are_given_against_every_baseline_of_the_group() {
        let measured = vec![
            m("g", "baseline_pass", 10.0),
            m("g", "baseline_naive", 40.0),
            m("g", "ours", 20.0),
            m("h", "alone", 5.0),
        ];
        let report = render(&measured, true);
        assert!(
            report.contains("| ours | 20.0 ns | 18.0 ns – 22.0 ns | 2.00× | 0.50× |"),
            "{report}"
        );
        assert!(report.contains("ratio to baseline_pass | ratio to baseline_naive |"));
        assert!(report.contains("| alone | 5.0 ns | 4.5 ns – 5.5 ns |\n"));
    }

    #[test]
    fn the_page_section_has_the_same_rows_under_smaller_headings() {
        let measured = vec![m("g", "baseline_pass", 10.0), m("g", "ours", 20.0)];
        let section = criterion_section(&measured);
        assert!(
            section.starts_with("## Criterion benches\n\nTimes are"),
            "{section}"
        );
        assert!(
            section.contains("\n### g\n\n| bench | mean | 95% interval | ratio to baseline_pass |")
        );
        assert!(section.contains("| ours | 20.0 ns | 18.0 ns – 22.0 ns | 2.00× |\n"));
        let report = render(&measured, false);
        for line in report.lines().filter(|l| l.starts_with('|')) {
            assert!(section.contains(line), "{line}");
        }
    }
}
