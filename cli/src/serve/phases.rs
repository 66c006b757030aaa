//! `privmix serve --phase-timings`: where the decode loop's time goes.
//!
//! The engine adds each phase's wall time to a [`PhaseTimes`] and, at most every
//! few seconds and when the loop goes idle, prints the sums to stderr: admission
//! (mechanism set-up and prefill), the mechanisms' steps, the ledger's commits,
//! releasing tokens (detokenising, sending), joining and leaving the batch (KV cache
//! copies) and the batched forward.
//!
//! These durations depend on the private members (the solvers' evaluations, the
//! mechanisms' shortcuts), and the ledger does not charge for them: the option is
//! for measuring a server whose members are not private (benchmarks with random or
//! public adapters), off by default, never sent to clients, and refused to a server
//! with API keys (tenants paying for the members' privacy: `serve::check_args`).

use std::time::{Duration, Instant};

/// How often the sums are printed while the engine runs.
const PRINT_EVERY: Duration = Duration::from_secs(5);

/// A phase of the decode loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A request admitted: its mechanism built, its prompt prefilled.
    Admit,
    /// The mechanisms' steps (ensembles built from the rows, outputs computed,
    /// tokens drawn), ledger commits excluded.
    Mechanism,
    /// Charges committed to the ledger store.
    Ledger,
    /// Committed tokens released: turned into text and sent.
    Release,
    /// Rows leaving and joining the batch (the KV cache's copies).
    JoinLeave,
    /// The batched forward of every active row.
    Forward,
}

const PHASES: [(Phase, &str); 6] = [
    (Phase::Admit, "admit+prefill"),
    (Phase::Mechanism, "mechanism"),
    (Phase::Ledger, "ledger commit"),
    (Phase::Release, "release"),
    (Phase::JoinLeave, "join/leave"),
    (Phase::Forward, "forward"),
];

/// Wall time per phase, summed since the last print.
#[derive(Debug)]
pub struct PhaseTimes {
    enabled: bool,
    sums: [Duration; 6],
    steps: u64,
    rows: u64,
    tokens: u64,
    since: Instant,
}

impl PhaseTimes {
    /// Sums that are kept (and printed) only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            sums: [Duration::ZERO; 6],
            steps: 0,
            rows: 0,
            tokens: 0,
            since: Instant::now(),
        }
    }

    /// The current time where timings are kept, for [`PhaseTimes::add_since`].
    pub fn start(&self) -> Option<Instant> {
        self.enabled.then(Instant::now)
    }

    /// Adds the time since `started` to `phase`.
    pub fn add_since(&mut self, phase: Phase, started: Option<Instant>) {
        if let Some(t) = started {
            let i = PHASES
                .iter()
                .position(|(p, _)| *p == phase)
                .unwrap_or_default();
            self.sums[i] += t.elapsed();
        }
    }

    /// Counts a step of `rows` forward rows that released `tokens` tokens, and prints
    /// the sums when they are due.
    pub fn step_done(&mut self, rows: usize, tokens: usize) {
        if !self.enabled {
            return;
        }
        self.steps += 1;
        self.rows += rows as u64;
        self.tokens += tokens as u64;
        if self.since.elapsed() >= PRINT_EVERY {
            self.print();
        }
    }

    /// Prints the sums (if any step ran since the last print) and starts new ones.
    pub fn print(&mut self) {
        if !self.enabled || self.steps == 0 {
            return;
        }
        let wall = self.since.elapsed().as_secs_f64();
        let mut line = format!(
            "privmix: phases over {wall:.1} s: {} steps, {} forward rows, {} tokens;",
            self.steps, self.rows, self.tokens
        );
        for (i, (_, name)) in PHASES.iter().enumerate() {
            let ms = self.sums[i].as_secs_f64() * 1e3;
            line.push_str(&format!(
                " {name} {ms:.0} ms ({:.1} ms/step)",
                ms / self.steps as f64
            ));
        }
        eprintln!("{line}");
        self.sums = [Duration::ZERO; 6];
        self.steps = 0;
        self.rows = 0;
        self.tokens = 0;
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_times_nothing() {
        let mut t = PhaseTimes::new(false);
        assert!(t.start().is_none());
        t.add_since(Phase::Forward, Some(Instant::now()));
        t.step_done(9, 1);
        assert_eq!(t.steps, 0);
    }

    #[test]
    fn enabled_sums_each_phase_apart() {
        let mut t = PhaseTimes::new(true);
        let s = t.start();
        std::thread::sleep(Duration::from_millis(2));
        t.add_since(Phase::Ledger, s);
        t.step_done(9, 1);
        assert!(t.sums[2] >= Duration::from_millis(2));
        assert_eq!(t.sums[5], Duration::ZERO);
        assert_eq!((t.steps, t.rows, t.tokens), (1, 9, 1));
    }
}
