//! `--step-time-ms`: releasing tokens on a fixed schedule.
//!
//! How long a step takes depends on the private data (the λ solvers' evaluation
//! counts, AdaPMixED's screening, SubMix's stopping, fallbacks to the public
//! model), so an observer who times the stream learns something the ledger does
//! not charge for. With a period N, token k (counting from 0) is released at
//! the deadline `start + (k + 1)·N`, where `start` is when the first step
//! began: the release times are fixed in advance and independent of the data. When the
//! budget refuses token k, the end of the stream is released at token k's deadline too.
//!
//! A step whose token is ready only after its deadline cannot be released on
//! schedule. Releasing it late would reveal the overrun and shift every later
//! release; so the run stops there with [`CliError::StepOverran`] and the token,
//! already charged, is withheld (an over-count, the safe side). The overrun
//! itself remains observable as the end of the stream: pick N with a margin
//! over the slowest step.
//!
//! `privmix serve --step-time-ms` gives every request the same schedule, anchored
//! where that request's first step starts (`serve/pace.rs`).

use std::time::{Duration, Instant};

use crate::error::CliError;

/// The fixed release schedule of one run.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    start: Instant,
    period: Duration,
}

impl Pacer {
    /// A schedule of period `period_ms` (> 0) starting at `start`.
    pub fn new(start: Instant, period_ms: u64) -> Result<Self, CliError> {
        if period_ms == 0 {
            return Err(CliError::arg(
                "--step-time-ms",
                "must be at least 1 (ms between released tokens)",
            ));
        }
        Ok(Self {
            start,
            period: Duration::from_millis(period_ms),
        })
    }

    /// Token `k`'s deadline, in time since the start.
    fn offset(&self, k: usize) -> Duration {
        let steps = u32::try_from(k + 1).unwrap_or(u32::MAX);
        self.period.saturating_mul(steps)
    }

    /// Token `k`'s deadline: `start + (k + 1)·period`.
    pub fn deadline(&self, k: usize) -> Instant {
        self.start + self.offset(k)
    }

    /// How long to wait at `now` before releasing token `k`, or
    /// [`CliError::StepOverran`] when `now` is past its deadline.
    pub fn wait_for(&self, k: usize, now: Instant) -> Result<Duration, CliError> {
        let deadline = self.deadline(k);
        if now > deadline {
            return Err(CliError::StepOverran {
                token: k,
                deadline_ms: self.offset(k).as_millis(),
            });
        }
        Ok(deadline - now)
    }

    /// Sleeps until token `k`'s deadline (see [`Self::wait_for`]).
    pub fn pace(&self, k: usize) -> Result<(), CliError> {
        let wait = self.wait_for(k, Instant::now())?;
        std::thread::sleep(wait);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_fixed_multiples_of_the_period() {
        let start = Instant::now();
        let pacer = Pacer::new(start, 50).unwrap();
        let ms = Duration::from_millis;
        // However early a token is ready, it waits for k·N after the start...
        assert_eq!(pacer.wait_for(0, start).unwrap(), ms(50));
        assert_eq!(pacer.wait_for(0, start + ms(49)).unwrap(), ms(1));
        assert_eq!(pacer.wait_for(3, start + ms(10)).unwrap(), ms(190));
        // ... a slow step does not move the later deadlines ...
        assert_eq!(pacer.wait_for(1, start + ms(99)).unwrap(), ms(1));
        assert_eq!(pacer.wait_for(2, start + ms(100)).unwrap(), ms(50));
        // ... exactly on time is on time, and late is an error naming the token.
        assert_eq!(pacer.wait_for(1, start + ms(100)).unwrap(), ms(0));
        match pacer.wait_for(1, start + ms(101)) {
            Err(CliError::StepOverran {
                token: 1,
                deadline_ms: 100,
            }) => {}
            other => panic!("expected StepOverran, got {other:?}"),
        }
    }

    #[test]
    fn a_zero_period_is_refused() {
        assert!(matches!(
            Pacer::new(Instant::now(), 0),
            Err(CliError::Argument {
                flag: "--step-time-ms",
                ..
            })
        ));
    }

    #[test]
    fn pace_sleeps_until_the_deadline() {
        let start = Instant::now();
        let pacer = Pacer::new(start, 30).unwrap();
        pacer.pace(1).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(60));
    }
}
