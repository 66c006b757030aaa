//! Wall-clock time of each step of a task, printed as a table when the task ends
//! (on success and on failure), so a slow CI run says where its minutes went.

use std::time::{Duration, Instant};

/// The steps run so far, in order, with their times and outcomes.
#[derive(Default)]
pub(crate) struct Steps {
    done: Vec<(String, Duration, bool)>,
    started: Option<Instant>,
}

impl Steps {
    /// Runs one step, timing it; its error is returned unchanged.
    pub(crate) fn run(
        &mut self,
        name: &str,
        step: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        self.started.get_or_insert_with(Instant::now);
        eprintln!("xtask: step `{name}`");
        let start = Instant::now();
        let result = step();
        self.done
            .push((name.to_string(), start.elapsed(), result.is_ok()));
        result
    }

    /// The table of steps: name, seconds, minutes, outcome, then the total.
    pub(crate) fn table(&self) -> String {
        let mut out = String::from("| step | s | min | |\n|---|---|---|---|\n");
        for (name, took, ok) in &self.done {
            let s = took.as_secs_f64();
            let verdict = if *ok { "ok" } else { "FAILED" };
            out.push_str(&format!(
                "| {name} | {s:.0} | {:.1} | {verdict} |\n",
                s / 60.0
            ));
        }
        let total = self.started.map(|t| t.elapsed()).unwrap_or_default();
        let s = total.as_secs_f64();
        out.push_str(&format!("| total | {s:.0} | {:.1} | |\n", s / 60.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Steps;

    #[test]
    fn failed_steps_are_recorded_and_returned() {
        let mut steps = Steps::default();
        assert!(steps.run("a", || Ok(())).is_ok());
        assert_eq!(steps.run("b", || Err("boom".into())), Err("boom".into()));
        let table = steps.table();
        assert!(table.contains("| a | 0 | 0.0 | ok |"), "{table}");
        assert!(table.contains("| b | 0 | 0.0 | FAILED |"), "{table}");
        assert!(table.contains("| total |"), "{table}");
    }
}
