//! The performance page, `docs/performance.md`: the measured figures of the
//! workspace, checked in, and refreshed by `cargo xtask bench` after each run.
//!
//! The page is Markdown with generated sections between stable markers:
//!
//! ```text
//! <!-- section: criterion -->
//! ## Criterion benches
//! …
//! <!-- end section: criterion -->
//! ```
//!
//! A run replaces the sections it measured ([`SECTIONS`]: the criterion benches
//! and the speed, serving and fine-tuning steps of a full run; `--criterion-only`,
//! `--speed-only`, `--serve-only` or `--train-only` that section alone) and keeps every other section
//! as the page had it, so figures measured by an earlier run stay, with the run
//! line (commit, CPU, threads, rustc, date) that says where they come from.
//! Text outside the markers, and sections under other names (hand-written
//! notes), are not generated and are kept byte for byte. [`merge`] is that rule,
//! over strings.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The page, from the workspace root.
pub(crate) const PAGE: &str = "docs/performance.md";

/// The sections `cargo xtask bench` writes, in page order: marker name and the
/// heading of the placeholder a section has until a run measures it.
pub(crate) const SECTIONS: [(&str, &str); 4] = [
    ("criterion", "Criterion benches"),
    ("speed", "SmolLM2 speed beside llama.cpp"),
    (
        "serve",
        "Serving: `privmix serve` beside llama.cpp's server",
    ),
    ("train", "LoRA fine-tuning beside PyTorch + PEFT"),
];

/// The page before any run has measured anything.
const INTRO: &str = "# privmix performance

Measured figures of the workspace, written by `cargo xtask bench` (`xtask/src/performance.rs`).
Each run replaces the sections it measured (a full run: all of them; `--criterion-only`,
`--speed-only`, `--serve-only`, `--train-only`: that section) and keeps the others as they were; every section
names the commit, CPU, thread count, toolchain and date it was measured with. Text outside the
`<!-- section: … -->` markers is not generated: it is kept as it is.
";

fn start_marker(name: &str) -> String {
    format!("<!-- section: {name} -->")
}

fn end_marker(name: &str) -> String {
    format!("<!-- end section: {name} -->")
}

/// A section that no run has measured yet.
fn placeholder(heading: &str) -> String {
    format!("## {heading}\n\nNot measured yet: run `cargo xtask bench` to fill this section.\n")
}

/// A stretch of the page: text kept as it is, or a marked section.
#[derive(Debug)]
enum Segment {
    Text(String),
    Section { name: String, body: String },
}

/// The name in a start marker line, if `line` is one.
fn start_name(line: &str) -> Option<&str> {
    line.trim()
        .strip_prefix("<!-- section:")?
        .strip_suffix("-->")
        .map(str::trim)
        .filter(|n| !n.is_empty())
}

/// Splits a page into text and marked sections. A section runs from its start
/// marker to its end marker; without one, to the next start marker or the end.
fn parse(page: &str) -> Vec<Segment> {
    let lines: Vec<&str> = page.split_inclusive('\n').collect();
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = start_name(lines[i]) else {
            text.push_str(lines[i]);
            i += 1;
            continue;
        };
        if !text.is_empty() {
            segments.push(Segment::Text(std::mem::take(&mut text)));
        }
        let end = end_marker(name);
        let mut body = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != end && start_name(lines[i]).is_none() {
            body.push_str(lines[i]);
            i += 1;
        }
        if i < lines.len() && lines[i].trim() == end {
            i += 1;
        }
        segments.push(Segment::Section {
            name: name.to_string(),
            body,
        });
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    segments
}

fn render(segments: &[Segment]) -> String {
    let mut page = String::new();
    for segment in segments {
        match segment {
            Segment::Text(text) => page.push_str(text),
            Segment::Section { name, body } => {
                page.push_str(&start_marker(name));
                page.push('\n');
                page.push_str(body);
                if !body.is_empty() && !body.ends_with('\n') {
                    page.push('\n');
                }
                page.push_str(&end_marker(name));
                page.push('\n');
            }
        }
    }
    page
}

/// The page with `fresh` (section name, new body) in place of those sections,
/// every other section and all text outside the markers as in `existing`. A
/// section of [`SECTIONS`] the page lacks is added (its fresh body, or a
/// placeholder) after the owned sections before it in [`SECTIONS`]' order, or
/// at the end; with no page, the sections follow a short introduction.
pub(crate) fn merge(existing: Option<&str>, fresh: &[(&str, String)]) -> String {
    let base = match existing {
        Some(page) if !page.trim().is_empty() => page.to_string(),
        _ => INTRO.to_string(),
    };
    let mut segments = parse(&base);
    let position = |segments: &[Segment], wanted: &str| {
        segments
            .iter()
            .position(|s| matches!(s, Segment::Section { name, .. } if name.as_str() == wanted))
    };
    for (k, (name, heading)) in SECTIONS.iter().enumerate() {
        let new_body = fresh
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, body)| body.clone());
        match position(&segments, name) {
            Some(at) => {
                if let (Some(body), Segment::Section { body: old, .. }) =
                    (new_body, &mut segments[at])
                {
                    *old = body;
                }
            }
            None => {
                let section = Segment::Section {
                    name: name.to_string(),
                    body: new_body.unwrap_or_else(|| placeholder(heading)),
                };
                let after = SECTIONS[..k]
                    .iter()
                    .rev()
                    .find_map(|(n, _)| position(&segments, n));
                let at = match after {
                    Some(at) => at + 1,
                    None => {
                        // At the end, a blank line after whatever text is there.
                        if let Some(Segment::Text(text)) = segments.last_mut() {
                            if !text.ends_with('\n') {
                                text.push('\n');
                            }
                            if !text.ends_with("\n\n") {
                                text.push('\n');
                            }
                        }
                        segments.len()
                    }
                };
                if after.is_some() {
                    segments.insert(at, Segment::Text("\n".into()));
                    segments.insert(at + 1, section);
                } else {
                    segments.insert(at, section);
                }
            }
        }
    }
    render(&segments)
}

/// Where and with what a run measured: the line each section it writes starts
/// with (below the section's heading).
pub(crate) struct RunInfo {
    /// The command, e.g. `cargo xtask bench --quick`.
    pub command: String,
    /// `git rev-parse HEAD`, with whether the tree had uncommitted changes.
    pub commit: Option<(String, bool)>,
    /// `model name` of /proc/cpuinfo.
    pub cpu: Option<String>,
    /// Logical CPUs this process may use.
    pub threads: usize,
    /// `rustc --version`.
    pub rustc: Option<String>,
    /// When the run ended, in seconds since the Unix epoch.
    pub unix_seconds: u64,
}

impl RunInfo {
    /// Reads the facts of this run from the machine (what cannot be read is
    /// said to be unknown on the page, never guessed).
    pub(crate) fn collect(command: String, root: &Path) -> Self {
        let output = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .current_dir(root)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let commit = output("git", &["rev-parse", "HEAD"]).map(|hash| {
            let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            (hash, dirty)
        });
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        RunInfo {
            command,
            commit,
            cpu: fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|text| cpu_model(&text)),
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            rustc: output(&rustc, &["--version"]),
            unix_seconds: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// `Measured by … at commit … on …`, one paragraph.
    pub(crate) fn line(&self) -> String {
        let unknown = || "unknown".to_string();
        let commit = match &self.commit {
            Some((hash, false)) => format!("`{hash}`"),
            Some((hash, true)) => format!("`{hash}` (with uncommitted changes)"),
            None => unknown(),
        };
        format!(
            "Measured by `{}` at commit {commit}, {} UTC, on {} ({} logical CPUs), {}.",
            self.command,
            utc_minute(self.unix_seconds),
            self.cpu.clone().unwrap_or_else(|| "an unknown CPU".into()),
            self.threads,
            self.rustc.clone().unwrap_or_else(|| "rustc unknown".into()),
        )
    }
}

/// The first processor of a /proc/cpuinfo text: its `model name`, then its
/// `cpu family` and `model` numbers and which of the instruction sets the
/// kernels dispatch on it has (AVX-512, AVX-512 VNNI, AMX int8), since a
/// model name such as "AMD EPYC" names neither the generation nor them.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let model = field("model name")?;
    let mut facts = Vec::new();
    if let (Some(family), Some(number)) = (field("cpu family"), field("model")) {
        facts.push(format!("family {family}, model {number}"));
    }
    if let Some(flags) = field("flags") {
        let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
        let isa = [
            ("avx512f", "AVX-512"),
            ("avx512_vnni", "AVX-512 VNNI"),
            ("amx_int8", "AMX int8"),
        ]
        .iter()
        .map(|&(flag, name)| {
            if has(flag) {
                name.to_string()
            } else {
                format!("no {name}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
        facts.push(isa);
    }
    Some(if facts.is_empty() {
        model
    } else {
        format!("{model} ({})", facts.join("; "))
    })
}

/// `YYYY-MM-DD HH:MM` of a Unix time (the proleptic Gregorian calendar, by
/// Howard Hinnant's `civil_from_days`).
fn utc_minute(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let minute_of_day = (unix_seconds % 86_400) / 60;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        minute_of_day / 60,
        minute_of_day % 60
    )
}

/// A step's section (`## heading`, then its text) as the page holds it: the
/// run line right below the heading. Text without a leading `## ` heading gets
/// `heading`.
pub(crate) fn with_run_line(section: &str, heading: &str, run: &RunInfo) -> String {
    let section = section.trim_start_matches('\n');
    let (title, rest) = match section.strip_prefix("## ") {
        Some(after) => {
            let (title, rest) = after.split_once('\n').unwrap_or((after, ""));
            (title.trim_end().to_string(), rest)
        }
        None => (heading.to_string(), section),
    };
    let mut body = String::new();
    let _ = write!(
        body,
        "## {title}\n\n{}\n\n{}",
        run.line(),
        rest.trim_start_matches('\n')
    );
    while body.ends_with("\n\n") {
        body.pop();
    }
    if !body.ends_with('\n') {
        body.push('\n');
    }
    body
}

/// Reads the page under `root` (if there is one), merges `fresh` into it and
/// writes it back; returns its path.
pub(crate) fn update(root: &Path, fresh: &[(&str, String)]) -> Result<PathBuf, String> {
    let path = root.join(PAGE);
    let existing = match fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let page = merge(existing.as_deref(), fresh);
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    fs::write(&path, page).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(title: &str, figure: &str) -> String {
        format!("## {title}\n\nMeasured by test.\n\n| a | b |\n|---|---|\n| {figure} | 1 |\n")
    }

    #[test]
    fn a_first_run_writes_the_introduction_and_every_section() {
        let page = merge(None, &[("criterion", body("Criterion benches", "7 ns"))]);
        assert!(page.starts_with("# privmix performance\n"), "{page}");
        assert!(
            page.contains(
                "<!-- section: criterion -->\n## Criterion benches\n\nMeasured by test.\n"
            )
        );
        assert!(page.contains("| 7 ns | 1 |\n<!-- end section: criterion -->\n"));
        for (name, heading) in SECTIONS {
            assert!(page.contains(&start_marker(name)), "{page}");
            assert!(page.contains(&end_marker(name)), "{page}");
            if name != "criterion" {
                assert!(page.contains(&placeholder(heading)), "{page}");
            }
        }
        // In SECTIONS' order, one blank line apart.
        let at = |n: &str| page.find(&start_marker(n)).unwrap();
        assert!(at("criterion") < at("speed") && at("speed") < at("serve"));
        assert!(page.contains("<!-- end section: criterion -->\n\n<!-- section: speed -->"));
    }

    #[test]
    fn a_section_not_run_keeps_its_figures_and_hand_written_text_stays() {
        let first = merge(
            None,
            &[
                ("criterion", body("Criterion benches", "7 ns")),
                ("speed", body("SmolLM2 speed beside llama.cpp", "12 tok/s")),
            ],
        );
        // Someone adds notes of their own, outside the markers and in a marked
        // section the generator does not own.
        let edited = format!(
            "{first}\n## Kernel notes\n\nWhy the ratio kernel prefetches.\n\n\
             <!-- section: kernel-notes -->\nHand-written.\n<!-- end section: kernel-notes -->\n"
        );
        let second = merge(
            Some(&edited),
            &[("speed", body("SmolLM2 speed beside llama.cpp", "15 tok/s"))],
        );
        assert!(second.contains("| 7 ns | 1 |"), "{second}");
        assert!(second.contains("| 15 tok/s | 1 |") && !second.contains("12 tok/s"));
        assert!(second.contains("\n## Kernel notes\n\nWhy the ratio kernel prefetches.\n\n"));
        assert!(second.contains(
            "<!-- section: kernel-notes -->\nHand-written.\n<!-- end section: kernel-notes -->\n"
        ));
        // Only the speed section changed.
        assert_eq!(
            second.replace("15 tok/s", "12 tok/s"),
            edited,
            "the rest of the page moved"
        );
    }

    #[test]
    fn merging_is_stable() {
        let fresh = [("serve", body("Serving", "3 req/s"))];
        let once = merge(None, &fresh);
        assert_eq!(merge(Some(&once), &fresh), once);
        assert_eq!(merge(Some(&once), &[]), once);
    }

    #[test]
    fn a_page_without_markers_is_kept_and_gets_the_sections_after_it() {
        let notes = "# Performance\n\n## Kernel notes\n\nThe notes.";
        let page = merge(Some(notes), &[("speed", body("Speed", "9 tok/s"))]);
        assert!(
            page.starts_with(
                "# Performance\n\n## Kernel notes\n\nThe notes.\n\n<!-- section: criterion -->\n"
            ),
            "{page}"
        );
        assert!(page.contains("| 9 tok/s | 1 |"));
        assert_eq!(merge(Some(&page), &[]), page);
    }

    #[test]
    fn a_missing_section_goes_after_the_sections_before_it() {
        let page = "intro\n\n<!-- section: criterion -->\nC\n<!-- end section: criterion -->\n\n\
                    tail\n";
        let merged = merge(Some(page), &[]);
        let at = |n: &str| merged.find(&start_marker(n)).unwrap();
        assert!(
            at("criterion") < at("speed") && at("speed") < at("serve"),
            "{merged}"
        );
        assert!(merged.ends_with("\ntail\n"), "{merged}");
        assert!(merged.contains("<!-- end section: criterion -->\n\n<!-- section: speed -->"));
    }

    #[test]
    fn an_unterminated_section_ends_at_the_next_marker() {
        let page = "<!-- section: criterion -->\nold\n<!-- section: speed -->\nS\n\
                    <!-- end section: speed -->\n";
        let merged = merge(Some(page), &[("criterion", "new\n".into())]);
        assert!(merged.starts_with(
            "<!-- section: criterion -->\nnew\n<!-- end section: criterion -->\n<!-- section: speed -->\nS\n"
        ), "{merged}");
    }

    #[test]
    fn the_run_line_names_commit_cpu_threads_toolchain_and_date() {
        let run = RunInfo {
            command: "cargo xtask bench --speed-only".into(),
            commit: Some(("abc123".into(), true)),
            cpu: cpu_model(
                "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: Example CPU @ 2.0GHz\n\
                 flags\t\t: fpu avx512f avx512_vnni x\nprocessor\t: 1\nmodel name\t: Other\n",
            ),
            threads: 2,
            rustc: Some("rustc 1.92.0".into()),
            unix_seconds: 951_782_400 + 13 * 3600 + 5 * 60,
        };
        assert_eq!(
            run.line(),
            "Measured by `cargo xtask bench --speed-only` at commit `abc123` (with uncommitted \
             changes), 2000-02-29 13:05 UTC, on Example CPU @ 2.0GHz (family 26, model 2; \
             AVX-512, AVX-512 VNNI, no AMX int8) (2 logical CPUs), rustc 1.92.0."
        );
        assert_eq!(
            cpu_model("model name\t: Bare CPU\n").as_deref(),
            Some("Bare CPU")
        );
        let section = with_run_line("## Speed\n\n| t |\n|---|\n\n\n", "unused", &run);
        assert_eq!(
            section,
            format!("## Speed\n\n{}\n\n| t |\n|---|\n", run.line())
        );
        let untitled = with_run_line("Not measured: no model.\n", "Speed", &run);
        assert!(
            untitled.starts_with("## Speed\n\nMeasured by"),
            "{untitled}"
        );
    }

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(utc_minute(0), "1970-01-01 00:00");
        assert_eq!(utc_minute(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc_minute(1_735_689_599), "2024-12-31 23:59");
    }

    #[test]
    fn the_checked_in_page_has_every_section() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let page = fs::read_to_string(root.join(PAGE)).unwrap();
        for (name, _) in SECTIONS {
            assert!(
                page.contains(&start_marker(name)) && page.contains(&end_marker(name)),
                "{PAGE} lacks section {name}"
            );
        }
        // Refreshing it with nothing measured changes nothing.
        assert_eq!(merge(Some(&page), &[]), page);
    }
}
