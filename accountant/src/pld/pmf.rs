//! A discretised privacy-loss distribution: masses on the grid `k·h` plus a
//! mass at +∞, and the hockey-stick divergence δ(ε) it bounds.
//!
//! Invariant (`proof.md` §1): the true loss distribution is *dominated* by the
//! stored one — it can be turned into it by moving mass to larger losses
//! (or to +∞), splitting it connect-the-dots style, and adding mass. Every
//! constructor and composition keeps this, so δ(ε) read from a `Pmf` is an
//! upper bound on the true δ(ε).

use privmix_renyi::round::{add_up, mul_up};

/// Unit roundoff of f64.
pub(crate) const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;

/// Masses on the grid `(lower + i)·h`, i = 0..len, and at +∞.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pmf {
    h: f64,
    lower: i64,
    probs: Vec<f64>,
    infinity: f64,
    /// Σ probs and max |loss|, for the rounding allowance of `delta_up`.
    total: f64,
    max_abs_loss: f64,
}

impl Pmf {
    /// A PMF from non-negative masses; leading and trailing zeros are dropped.
    pub(crate) fn new(h: f64, mut lower: i64, mut probs: Vec<f64>, infinity: f64) -> Self {
        debug_assert!(probs.iter().all(|p| *p >= 0.0));
        let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        probs.truncate(last + 1);
        let first = probs.iter().position(|&p| p > 0.0).unwrap_or(0);
        if first > 0 {
            probs.drain(..first);
            lower += first as i64;
        }
        let total = probs.iter().sum();
        let ends = [
            lower as f64 * h,
            (lower + probs.len() as i64 - 1) as f64 * h,
        ];
        Self {
            h,
            lower,
            probs,
            infinity: infinity.min(1.0),
            total,
            max_abs_loss: ends[0].abs().max(ends[1].abs()),
        }
    }

    /// All mass at loss 0.
    pub(crate) fn identity(h: f64) -> Self {
        Self::new(h, 0, vec![1.0], 0.0)
    }

    pub(crate) fn discretization(&self) -> f64 {
        self.h
    }

    pub(crate) fn lower(&self) -> i64 {
        self.lower
    }

    pub(crate) fn probs(&self) -> &[f64] {
        &self.probs
    }

    pub(crate) fn infinity(&self) -> f64 {
        self.infinity
    }

    pub(crate) fn len(&self) -> usize {
        self.probs.len()
    }

    /// The loss of grid value i.
    pub(crate) fn loss(&self, i: usize) -> f64 {
        (self.lower + i as i64) as f64 * self.h
    }

    /// δ(ε) = Σ_{ℓ > ε} p_ℓ (1 − e^{ε−ℓ}) + p_∞, rounded up.
    ///
    /// Rounding: each term is non-negative, so the computed sum is within a
    /// relative `(n + 8)·u` of the exact sum of the computed terms (u the unit
    /// roundoff); a term's loss ℓ = k·h is itself rounded, by at most `u·|ℓ|`,
    /// which moves `1 − e^{ε−ℓ}` by at most `u·(|ℓ| + |ε|)` (its slope is ≤ 1
    /// for ℓ ≥ ε) — the absolute allowance covers it for every grid value,
    /// including those just below ε.
    pub(crate) fn delta_up(&self, epsilon: f64) -> f64 {
        if epsilon == f64::INFINITY {
            return self.infinity;
        }
        // Grid values with loss > ε (one below the estimate is included too:
        // a zero term changes nothing).
        let first = ((epsilon / self.h).floor() - self.lower as f64).max(0.0);
        let first = if first >= self.len() as f64 {
            self.len()
        } else {
            first as usize
        };
        let mut sum = 0.0f64;
        for (i, &p) in self.probs.iter().enumerate().skip(first) {
            let l = self.loss(i);
            if l > epsilon {
                sum += p * -(epsilon - l).exp_m1();
            }
        }
        let terms = (self.len() - first) as f64;
        let u = UNIT_ROUNDOFF;
        let rel = mul_up(sum, 1.0 + (terms + 8.0) * 2.0 * u);
        // The stored total is itself a rounded sum: allow for that too.
        let abs = mul_up(
            mul_up(self.total, 1.0 + (self.len() as f64 + 8.0) * 2.0 * u),
            4.0 * u * (self.max_abs_loss + epsilon.abs() + 1.0),
        );
        add_up(add_up(rel, abs), self.infinity).min(1.0)
    }

    /// The smallest ε ≥ 0 (to a relative 1e-10) with `delta_up(ε) ≤ δ`; every
    /// returned value was checked with `delta_up`. +∞ when `p_∞ ≥ δ`.
    pub(crate) fn epsilon_up(&self, delta: f64) -> f64 {
        if self.infinity >= delta {
            return f64::INFINITY;
        }
        let fits = |e: f64| self.delta_up(e) <= delta;
        if fits(0.0) {
            return 0.0;
        }
        let guess = self.epsilon_scan(delta).max(0.0);
        let tol = 1e-10 * guess.max(1.0);
        // Bracket: `bad` does not fit, `good` fits.
        let (mut bad, mut good);
        if fits(guess) {
            good = guess;
            bad = (guess - tol).max(0.0);
            if fits(bad) {
                return bad;
            }
        } else {
            bad = guess;
            let mut step = tol;
            loop {
                good = guess + step;
                if fits(good) || good == f64::INFINITY {
                    break;
                }
                bad = good;
                step *= 4.0;
            }
        }
        while good - bad > tol {
            let mid = bad + 0.5 * (good - bad);
            if fits(mid) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        good
    }

    /// dp_accounting's scan for the ε with δ(ε) = δ on the computed masses
    /// (`pld_pmf._get_epsilon_for_delta`): on [ℓ_k, ℓ_{k+1}) δ(ε) is
    /// `M_up − e^ε·M_low` with the masses above; an estimate that
    /// [`Self::epsilon_up`] then verifies.
    fn epsilon_scan(&self, delta: f64) -> f64 {
        let (mut upper, mut lower) = (self.infinity, 0.0f64);
        for i in (0..self.len()).rev() {
            let l = self.loss(i);
            if upper > delta && lower > 0.0 && ((upper - delta) / lower).ln() >= l {
                break;
            }
            upper += self.probs[i];
            lower += self.probs[i] * (-l).exp();
        }
        if upper <= delta || lower <= 0.0 {
            0.0
        } else {
            ((upper - delta) / lower).ln()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_zeros_and_keeps_the_grid() {
        let p = Pmf::new(0.5, -3, vec![0.0, 0.0, 0.25, 0.5, 0.0], 0.25);
        assert_eq!(p.lower(), -1);
        assert_eq!(p.probs(), &[0.25, 0.5]);
        assert_eq!(p.loss(1), 0.0);
    }

    #[test]
    fn delta_of_a_two_point_distribution() {
        // Mass ½ at ln 4 and ½ at −ln 4·… : δ(0) = ½(1 − ¼) = 0.375.
        let h = 4f64.ln();
        let p = Pmf::new(h, -1, vec![0.5, 0.0, 0.5], 0.0);
        let d = p.delta_up(0.0);
        assert!((0.375..0.375 + 1e-14).contains(&d), "{d}");
        // Only the rounding allowance is left above the largest loss.
        assert!(p.delta_up(2.0) < 1e-14);
        let e = p.epsilon_up(0.375);
        assert!((e - 0.0).abs() < 1e-9, "{e}");
        // δ(ε) = ½(1 − e^ε/4) on [0, ln 4]: δ = 0.25 at ε = ln 2.
        let e = p.epsilon_up(0.25);
        assert!(e >= 2f64.ln() && e - 2f64.ln() < 1e-9, "{e}");
    }

    #[test]
    fn infinity_mass_above_delta_gives_no_finite_epsilon() {
        let p = Pmf::new(0.1, 0, vec![0.9], 0.1);
        assert_eq!(p.epsilon_up(0.05), f64::INFINITY);
        assert_eq!(p.epsilon_up(0.2), 0.0);
        assert_eq!(p.delta_up(f64::INFINITY), 0.1);
    }
}
