//! What a run was made on and how long each phase took, written into the
//! report's JSON and Markdown so that a figure can be traced to its commit,
//! machine and compiler.

use std::fmt::Write as _;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The machine, build and timing of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    /// The command line the binary was started with.
    pub command: String,
    /// The commit the binary was built from (with `-dirty` when tracked files
    /// had uncommitted changes then), or why it is unknown.
    pub commit: String,
    /// The CPU model (`/proc/cpuinfo`'s `model name`, family and model
    /// numbers) and the instruction set the CPU kernels dispatch to.
    pub cpu: String,
    /// Logical CPUs the process may use.
    pub available_threads: usize,
    /// Threads of rayon's pool, which every kernel runs on.
    pub threads: usize,
    /// The burn backend the experiments ran on ([`crate::BACKEND_NAME`]).
    #[serde(default)]
    pub backend: String,
    /// `rustc --version` of the compiler that built this binary.
    pub rustc: String,
    /// The build profile (`release` or `debug`).
    pub profile: String,
    /// UTC start time, RFC 3339.
    pub started: String,
    /// `(phase, seconds)` in the order the phases ran.
    pub phases: Vec<(String, f64)>,
    /// Seconds from start to the report.
    pub wall_seconds: f64,
    /// `(part, seconds)` of work read from the cache instead of redone, each as
    /// measured when an earlier run made it: the run's whole cost is
    /// `wall_seconds` plus these.
    #[serde(default)]
    pub reused: Vec<(String, f64)>,
    /// What `--verify-cache` recomputed and how it compared with the cache.
    #[serde(default)]
    pub cache_checks: Vec<String>,
    /// `(part, from the cache, seconds when computed)` of each scored part of
    /// the perplexity experiment, in the order the run reached them.
    #[serde(default)]
    pub scored_parts: Vec<(String, bool, f64)>,
}

impl RunInfo {
    /// Reads the machine and build now; phases are added with [`Phases`].
    pub fn collect() -> Self {
        Self {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            commit: commit(),
            cpu: cpu_model(),
            available_threads: std::thread::available_parallelism().map_or(0, |n| n.get()),
            threads: rayon::current_num_threads(),
            backend: crate::BACKEND_NAME.to_string(),
            rustc: env!("PRIVMIX_BENCH_RUSTC").to_string(),
            profile: if cfg!(debug_assertions) {
                "debug".into()
            } else {
                "release".into()
            },
            started: utc_now(),
            phases: Vec::new(),
            wall_seconds: 0.0,
            reused: Vec::new(),
            cache_checks: Vec::new(),
            scored_parts: Vec::new(),
        }
    }

    /// The Markdown section.
    pub fn markdown(&self) -> String {
        let mut s = String::from("## Run\n\n| | |\n|---|---|\n");
        for (k, v) in [
            ("command", format!("`{}`", self.command)),
            ("commit", format!("`{}`", self.commit)),
            ("CPU", self.cpu.clone()),
            (
                "threads",
                format!("{} (of {} available)", self.threads, self.available_threads),
            ),
            ("backend", self.backend.clone()),
            ("rustc", self.rustc.clone()),
            ("profile", self.profile.clone()),
            ("started (UTC)", self.started.clone()),
            ("wall time", minutes(self.wall_seconds)),
        ] {
            let _ = writeln!(s, "| {k} | {v} |");
        }
        s.push_str("\n| phase | wall time |\n|---|---|\n");
        for (phase, secs) in &self.phases {
            let _ = writeln!(s, "| {phase} | {} |", minutes(*secs));
        }
        let reused: f64 = self.reused.iter().map(|(_, secs)| secs).sum();
        if reused > 0.0 {
            s.push_str(
                "\nReused from the cache (work of earlier runs of the same configuration, \
                 timed when it was done):\n\n| part | time when made |\n|---|---|\n",
            );
            for (part, secs) in self.reused.iter().filter(|(_, secs)| *secs > 0.0) {
                let _ = writeln!(s, "| {part} | {} |", minutes(*secs));
            }
            let _ = writeln!(
                s,
                "| **whole run: wall time + reused** | **{}** |",
                minutes(self.wall_seconds + reused)
            );
        }
        if !self.scored_parts.is_empty() {
            s.push_str(
                "\nScored parts (each cached when done, so a stopped run resumes at the first \
                 part not done):\n\n| part | from the cache | time when computed |\n|---|---|---|\n",
            );
            for (part, cached, secs) in &self.scored_parts {
                let from = if *cached { "yes" } else { "no: computed now" };
                let _ = writeln!(s, "| {part} | {from} | {} |", minutes(*secs));
            }
        }
        if !self.cache_checks.is_empty() {
            s.push_str("\nCache verified (`--verify-cache`: one seeded part recomputed):\n\n");
            for check in &self.cache_checks {
                let _ = writeln!(s, "- {check}");
            }
        }
        s.push('\n');
        s
    }
}

fn minutes(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.1} s")
    } else {
        format!("{:.1} min", secs / 60.0)
    }
}

/// Times the phases of a run.
pub struct Phases {
    started: Instant,
    phases: Vec<(String, f64)>,
}

impl Default for Phases {
    fn default() -> Self {
        Self::new()
    }
}

impl Phases {
    /// Starts the run's clock.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            phases: Vec::new(),
        }
    }

    /// Runs `f` as the phase `name`, recording its wall time.
    pub fn time<T>(&mut self, name: impl Into<String>, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.phases.push((name.into(), t.elapsed().as_secs_f64()));
        out
    }

    /// Records a phase measured elsewhere.
    pub fn record(&mut self, name: impl Into<String>, seconds: f64) {
        self.phases.push((name.into(), seconds));
    }

    /// Writes the phases and the wall time so far into `info`.
    pub fn finish(&self, info: &mut RunInfo) {
        info.phases = self.phases.clone();
        info.wall_seconds = self.started.elapsed().as_secs_f64();
    }
}

/// The commit of the sources this binary was compiled from, `-dirty` where
/// tracked files differed from it (read by `bench/build.rs` at build time, so a
/// binary run while the tree moves on still names its own sources).
pub(crate) fn commit() -> String {
    env!("PRIVMIX_BENCH_COMMIT").to_string()
}

/// The kind of machine a result's floating-point bits belong to: the CPU's
/// model name, family and model numbers and the kernels' instruction set (the
/// L1 data cache that sizes gemm's blocks follows the family and model).
pub(crate) fn machine() -> String {
    cpu_model()
}

/// How a recomputed part that differs from its entry is judged: a difference is
/// an error (the cache holds results its key no longer describes) only where the
/// entry names this kind of machine; an entry made on another kind, or whose
/// machine is unrecorded, is expected to differ in its last bits (gemm blocks its
/// sums by the L1 data cache, the quantised kernels run the CPU's instruction
/// set), so the difference is stated, not failed. `None`: an error is due.
pub(crate) fn machine_difference(entry_machine: Option<&str>, what: &str) -> Option<String> {
    let here = machine();
    match entry_machine {
        Some(m) if m == here => None,
        other => Some(format!(
            "{what} recomputed differs from its entry, made on {}, not this kind of \
             machine ({here}): bits are expected to differ across machines, so this is \
             no check of the code",
            other.unwrap_or("an unrecorded machine")
        )),
    }
}

fn cpu_model() -> String {
    let kernels = format!("{:?}", privmix_models::cpu::Isa::detected());
    match std::fs::read_to_string("/proc/cpuinfo") {
        Ok(text) => describe_cpu(&text, &kernels),
        Err(_) => format!("unknown (kernels: {kernels})"),
    }
}

/// The first processor of a /proc/cpuinfo text: its `model name`, its `cpu
/// family` and `model` numbers (a name such as "AMD EPYC" names no
/// generation), and the instruction set the CPU kernels dispatch to, since
/// trained weights and scored parts can differ in their last bits between
/// kinds of CPU.
fn describe_cpu(cpuinfo: &str, kernels: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let name = field("model name").unwrap_or_else(|| "unknown".into());
    match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => {
            format!("{name} (family {family}, model {model}; kernels: {kernels})")
        }
        _ => format!("{name} (kernels: {kernels})"),
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, H. Hinnant's algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_named_with_its_family_model_and_kernels() {
        let text = "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\
                    processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            describe_cpu(text, "Avx512Vnni"),
            "AMD EPYC (family 26, model 2; kernels: Avx512Vnni)"
        );
        assert_eq!(
            describe_cpu("model name\t: X\n", "Avx2"),
            "X (kernels: Avx2)"
        );
    }

    #[test]
    fn a_difference_fails_only_on_the_machine_that_made_the_entry() {
        let here = machine();
        assert_eq!(machine_difference(Some(&here), "part"), None);
        let other = machine_difference(Some("another CPU"), "part").unwrap();
        assert!(other.contains("made on another CPU"), "{other}");
        let unknown = machine_difference(None, "part").unwrap();
        assert!(unknown.contains("an unrecorded machine"), "{unknown}");
    }

    /// The build's commit is a full hash (`-dirty` where the tree had changes)
    /// or says why it is unknown.
    #[test]
    fn the_commit_is_the_builds() {
        let c = commit();
        let hash = c.strip_suffix("-dirty").unwrap_or(&c);
        assert!(
            c.starts_with("unknown (")
                || (hash.len() == 40 && hash.chars().all(|ch| ch.is_ascii_hexdigit())),
            "{c}"
        );
    }

    #[test]
    fn collects_the_build_and_machine() {
        let info = RunInfo::collect();
        assert!(info.rustc.starts_with("rustc "), "{}", info.rustc);
        assert!(info.threads >= 1);
        assert_eq!(info.started.len(), 20, "{}", info.started);
        let mut phases = Phases::new();
        let x = phases.time("data", || 7);
        assert_eq!(x, 7);
        let mut info = info;
        phases.finish(&mut info);
        assert_eq!(info.phases.len(), 1);
        assert!(info.markdown().contains("| data |"));
        assert!(
            info.markdown()
                .contains(&format!("| backend | {} |", crate::BACKEND_NAME))
        );
        assert!(!info.markdown().contains("Reused"));
        // Reused work is listed and added to the wall time for the whole run.
        info.wall_seconds = 60.0;
        info.reused = vec![("adapters".into(), 240.0), ("nothing".into(), 0.0)];
        let md = info.markdown();
        assert!(md.contains("| adapters | 4.0 min |"), "{md}");
        assert!(!md.contains("| nothing |"), "{md}");
        assert!(
            md.contains("| **whole run: wall time + reused** | **5.0 min** |"),
            "{md}"
        );
        // Each scored part says whether it came from the cache and what it cost.
        assert!(!md.contains("Scored parts"));
        info.scored_parts = vec![
            ("record level: seed row 0".into(), true, 600.0),
            ("record level: seed row 1".into(), false, 30.0),
        ];
        let md = info.markdown();
        assert!(
            md.contains("| record level: seed row 0 | yes | 10.0 min |"),
            "{md}"
        );
        assert!(
            md.contains("| record level: seed row 1 | no: computed now | 30.0 s |"),
            "{md}"
        );
    }
}
