//! The search shared by every λ solver: the largest λ ∈ [0, U] with `c(λ) ≤ b`, for a
//! constraint `c` that is non-decreasing in λ with `c(0) = 0`.
//!
//! The search keeps a bracket `[lo, hi]` whose ends have been *evaluated*: `c(lo) ≤ b`
//! and `c(hi) > b`. It returns `lo` once `hi − lo ≤ LAMBDA_TOLERANCE`, so the λ returned
//! satisfies the constraint exactly as the evaluator computes it, and (by monotonicity) lies
//! within the tolerance of the supremum of the feasible set.
//!
//! Inside the bracket it is a safeguarded Newton method. Each evaluation returns the
//! value, the slope and a curvature `κ` chosen by the caller, and Newton works on
//! `G(λ) = expm1(κ(c(λ) − b))/κ` (`c − b` for κ = 0): the solvers pick κ per evaluation so
//! that G is convex and close to linear for the active part of their constraint (see
//! each solver's documentation). The next point is, in order of preference,
//!
//! 1. the Newton point from the latest evaluation, if it lies strictly inside the bracket
//!    and its step is at most half the step before last (Numerical Recipes' `rtsafe`
//!    rule);
//! 2. the zero of the chord of G through the bracket ends, if it lies inside;
//! 3. the midpoint,
//!
//! and the midpoint is forced whenever three evaluations have not halved the bracket, so
//! the search always terminates (within about `3·log2(U/tolerance)` evaluations).
//!
//! For a convex increasing G every Newton point lies right of the root, so Newton alone
//! would never move the bracket's lower end; the chord lies above G and its zero lies
//! left of the root. When the Newton and chord estimates agree within half the tolerance
//! (or Newton's step falls below a quarter of it, near the root), the search *finishes*:
//! it evaluates just outside the estimates, at a margin of a third of the remaining
//! tolerance on each side, which usually closes the bracket in one or two evaluations.
//! A concave G mirrors this. Nothing relies on either shape for correctness, only for
//! speed: a finishing evaluation that lands on the wrong side forces a bisection.

use crate::MixingError;

/// Absolute accuracy of every λ the solvers return: the supremum of the feasible set lies
/// in `[λ, λ + LAMBDA_TOLERANCE]`.
pub const LAMBDA_TOLERANCE: f64 = 1e-9;

/// After this many evaluations the search stops taking Newton steps and only bisects,
/// which bounds the cost of any solve by about 40 + log2(U / tolerance) evaluations.
const GUIDED_EVALUATIONS: u32 = 40;

/// Largest `|c(λ) − b|` at which a Newton step below a quarter of the tolerance is taken
/// as a sign that the search has converged.
const NEAR_ROOT_RESIDUAL: f64 = 1e-3;

/// The outcome of a λ search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Solution {
    /// The λ chosen. Its constraint value, as computed by the solver's evaluator, is at most
    /// the bound.
    pub lambda: f64,
    /// The constraint's value at `lambda`, as evaluated (`≤` the bound).
    pub value: f64,
    /// The smallest λ at which the constraint was evaluated and found above the bound;
    /// `None` when `lambda` is the upper end of the range. By monotonicity the supremum of
    /// the feasible set lies in `[lambda, violated_at]`, and except for a zero bound (see
    /// the solvers) `violated_at − lambda ≤ LAMBDA_TOLERANCE`.
    pub violated_at: Option<f64>,
    /// How many times the constraint was evaluated (each evaluation is one pass over the
    /// inputs): the cost of the solve.
    pub evaluations: u32,
}

/// One part of a constraint: the constraint is the maximum of its parts (PMixED's and
/// DPS-MOZO's two directions) or a single part (SubMix).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Part {
    /// The part's value (may be `+∞`).
    pub value: f64,
    /// Its derivative in λ (right derivative, or left at the upper end); may be `+∞`,
    /// never trusted beyond guiding a step.
    pub slope: f64,
    /// The curvature κ of the transform `H = expm1(κc)/κ` Newton uses for this part.
    pub kappa: f64,
}

/// What an evaluator reports at one λ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Evaluation {
    /// The constraint's value, as the solver's `constraint(λ)` computes it: feasibility is
    /// decided on this number alone (NaN counts as infeasible).
    pub value: f64,
    /// The parts whose maximum the value is, for guiding steps (a single-part constraint
    /// repeats its part).
    pub parts: [Part; 2],
}

impl Evaluation {
    /// A constraint with one part.
    pub(crate) fn single(value: f64, slope: f64, kappa: f64) -> Self {
        let part = Part {
            value,
            slope,
            kappa,
        };
        Evaluation {
            value,
            parts: [part, part],
        }
    }
}

/// One evaluation of the constraint.
#[derive(Debug, Clone, Copy)]
struct Sample {
    lambda: f64,
    value: f64,
    parts: [Part; 2],
}

impl Sample {
    /// The part that attains the maximum (of two tied parts, the steeper: the right
    /// derivative of a maximum is the largest slope among the parts attaining it).
    fn active(&self) -> Part {
        let [a, b] = self.parts;
        if a.value > b.value || (a.value == b.value && a.slope >= b.slope) {
            a
        } else {
            b
        }
    }
}

/// The search over `[0, upper]` for `c(λ) ≤ bound`.
pub(crate) struct Search {
    /// Upper end `U` of the range (finite, > 0).
    pub upper: f64,
    /// The bound `b` (≥ 0, possibly `+∞`).
    pub bound: f64,
}

/// Validates a bound: a number ≥ 0 or `+∞`.
pub(crate) fn check_bound(bound: f64) -> Result<f64, MixingError> {
    if bound >= 0.0 {
        Ok(bound)
    } else {
        Err(MixingError::InvalidBound(bound))
    }
}

/// Validates the upper end of a λ range: finite and > 0.
pub(crate) fn check_upper(upper: f64) -> Result<f64, MixingError> {
    if upper.is_finite() && upper > 0.0 {
        Ok(upper)
    } else {
        Err(MixingError::InvalidUpperEnd(upper))
    }
}

/// `ln(to/from)`: a step in log λ (infinite from λ = 0).
fn log_step(from: f64, to: f64) -> f64 {
    (to / from).ln()
}

/// `ln H(c)` with `H(c) = expm1(κc)/κ` (`H = c` for κ = 0): `−∞` at `c = 0`, and never
/// overflowing for large `c`.
fn log_h(kappa: f64, c: f64) -> f64 {
    if kappa == 0.0 {
        c.ln()
    } else {
        let k = kappa.abs();
        kappa.max(0.0) * c + (-(-k * c).exp_m1() / k).ln()
    }
}

/// `d ln H/dc = κ/(1 − exp(−κc))` (`1/c` for κ = 0).
fn log_h_rate(kappa: f64, c: f64) -> f64 {
    if kappa == 0.0 {
        1.0 / c
    } else {
        kappa / -(-kappa * c).exp_m1()
    }
}

impl Search {
    /// Runs the search. `eval(λ)` evaluates the constraint at λ.
    pub(crate) fn run<F>(&self, eval: F) -> Result<Solution, MixingError>
    where
        F: FnMut(f64) -> Result<Evaluation, MixingError>,
    {
        check_upper(self.upper)?;
        check_bound(self.bound)?;
        let mut state = State::new(self, eval);
        if state.probe(self.upper)? {
            return Ok(Solution {
                lambda: self.upper,
                value: state.last.value,
                violated_at: None,
                evaluations: state.evaluations,
            });
        }
        if self.bound == 0.0 {
            // The constraint is 0 at λ = 0 and, along a path that is not identically 0,
            // strictly positive for every λ > 0 (each solver documents why), so 0 is the
            // exact answer; it is confirmed by evaluation below.
            return state.finish();
        }
        if state.last.value == f64::INFINITY {
            state.probe_infinite_top()?;
        }
        state.bracket()?;
        state.finish()
    }
}

/// The bracket and the evaluation history.
struct State<'s, F> {
    search: &'s Search,
    eval: F,
    evaluations: u32,
    /// Largest λ known feasible (λ = 0 is assumed feasible, with value 0, until checked).
    lo: Sample,
    lo_checked: bool,
    /// Smallest λ evaluated infeasible.
    hi: Sample,
    last: Sample,
    /// The last two steps taken, in log λ, older first (for the `rtsafe` progress rule).
    steps: [f64; 2],
    /// Bracket widths before each of the last three evaluations, oldest first.
    widths: [f64; 3],
    /// A finishing evaluation landed on the wrong side: bisect next.
    misled: bool,
}

impl<'s, F> State<'s, F>
where
    F: FnMut(f64) -> Result<Evaluation, MixingError>,
{
    fn new(search: &'s Search, eval: F) -> Self {
        let unknown = Part {
            value: f64::NAN,
            slope: f64::NAN,
            kappa: 0.0,
        };
        let zero = Sample {
            lambda: 0.0,
            value: 0.0,
            parts: [unknown; 2],
        };
        let top = Sample {
            lambda: search.upper,
            value: f64::INFINITY,
            parts: [unknown; 2],
        };
        State {
            search,
            eval,
            evaluations: 0,
            lo: zero,
            lo_checked: false,
            hi: top,
            last: top,
            steps: [f64::INFINITY; 2],
            widths: [f64::INFINITY; 3],
            misled: false,
        }
    }

    fn width(&self) -> f64 {
        self.hi.lambda - self.lo.lambda
    }

    fn inside(&self, x: f64) -> bool {
        x > self.lo.lambda && x < self.hi.lambda
    }

    /// Evaluates the constraint at `x` and moves the matching end of the bracket.
    /// Returns whether `x` is feasible.
    fn probe(&mut self, x: f64) -> Result<bool, MixingError> {
        let Evaluation { value, parts } = (self.eval)(x)?;
        self.evaluations += 1;
        self.widths = [self.widths[1], self.widths[2], self.width()];
        let s = Sample {
            lambda: x,
            value,
            parts,
        };
        self.last = s;
        let feasible = value <= self.search.bound;
        if feasible {
            if x >= self.lo.lambda {
                self.lo = s;
                self.lo_checked = true;
            }
        } else if x <= self.hi.lambda {
            self.hi = s;
        }
        Ok(feasible)
    }

    /// The top is at `+∞`. If the slope at 0 is `+∞` the divergence is infinite for every
    /// λ > 0 (a support mismatch): one evaluation at the tolerance certifies that and
    /// closes the bracket, instead of thirty bisections.
    fn probe_infinite_top(&mut self) -> Result<(), MixingError> {
        if !self.probe(0.0)? {
            return Err(MixingError::InfeasibleAtZero {
                value: self.last.value,
                bound: self.search.bound,
            });
        }
        if self.last.active().slope == f64::INFINITY && self.inside(LAMBDA_TOLERANCE) {
            self.probe(LAMBDA_TOLERANCE)?;
        }
        Ok(())
    }

    /// Newton's step in log–log coordinates from `s`, for the part that reaches the bound
    /// first: for each part, with `H = expm1(κc)/κ` and `p = λH'/H`, the local power-law
    /// model `H ∝ λ^p` reaches `H(b)` at `λ·(H(b)/H(c))^{1/p}`; the constraint, a maximum,
    /// reaches it at the smallest of these.
    fn newton(&self, s: &Sample) -> Option<f64> {
        let b = self.search.bound;
        let part_newton = |part: &Part| {
            let Part {
                value,
                slope,
                kappa,
            } = *part;
            if !(value.is_finite()
                && value > 0.0
                && slope.is_finite()
                && slope > 0.0
                && s.lambda > 0.0)
            {
                return None;
            }
            let power = s.lambda * slope * log_h_rate(kappa, value);
            let x = s.lambda * ((log_h(kappa, b) - log_h(kappa, value)) / power).exp();
            x.is_finite().then_some(x)
        };
        s.parts.iter().filter_map(part_newton).reduce(f64::min)
    }

    /// The secant through the bracket ends in log–log coordinates (with the upper end's
    /// κ), or, while the lower end is λ = 0, the chord of H through the origin.
    fn chord(&self) -> Option<f64> {
        let (b, k) = (self.search.bound, self.hi.active().kappa);
        let (lo, hi) = (&self.lo, &self.hi);
        if !(hi.value.is_finite() && hi.value > 0.0) {
            return None;
        }
        let (target, log_hi) = (log_h(k, b), log_h(k, hi.value));
        let x = if lo.lambda > 0.0 && lo.value > 0.0 {
            let log_lo = log_h(k, lo.value);
            let power = (log_hi - log_lo) / (hi.lambda / lo.lambda).ln();
            lo.lambda * ((target - log_lo) / power).exp()
        } else {
            lo.lambda + (hi.lambda - lo.lambda) * (target - log_hi).exp()
        };
        x.is_finite().then_some(x)
    }

    /// Shrinks the bracket until it is no wider than the tolerance.
    fn bracket(&mut self) -> Result<(), MixingError> {
        while self.width() > LAMBDA_TOLERANCE {
            if self.misled || self.evaluations >= GUIDED_EVALUATIONS {
                self.misled = false;
                self.step_to(self.midpoint())?;
                continue;
            }
            // Estimates may sit on a bracket end (Newton from a point exactly at the root);
            // steps must go strictly inside.
            let within = |x: &f64| *x >= self.lo.lambda && *x <= self.hi.lambda;
            let newton = self.newton(&self.last).filter(within);
            let chord = self.chord().filter(within);
            if let Some((a, b)) = self.converged(newton, chord) {
                self.finish_around(a, b)?;
                continue;
            }
            let (newton, chord) = (
                newton.filter(|&x| self.inside(x)),
                chord.filter(|&x| self.inside(x)),
            );
            // Newton must at least halve its step (in log λ, where its model lives) every
            // two steps (`rtsafe`); the chord, which can creep along one end, is taken only
            // while three evaluations halve the bracket.
            let stalled = self.width() > 0.5 * self.widths[0];
            let x = match (newton, chord) {
                (Some(n), _)
                    if log_step(self.last.lambda, n).abs() <= 0.5 * self.steps[0].abs() =>
                {
                    n
                }
                (_, Some(c)) if !stalled => c,
                _ => self.midpoint(),
            };
            self.step_to(x)?;
        }
        Ok(())
    }

    /// The bisection point: geometric while the bracket spans more than a factor 4 (the
    /// constraints are scale-free near 0) but never below `hi/1024`, arithmetic after.
    fn midpoint(&self) -> f64 {
        let (lo, hi) = (self.lo.lambda, self.hi.lambda);
        if lo > 0.0 && hi > 4.0 * lo {
            (lo * hi).sqrt().max(hi / 1024.0)
        } else {
            lo + 0.5 * (hi - lo)
        }
    }

    /// Newton and chord estimates of the root, when they say the search has converged:
    /// both agree within half the tolerance, or one of them lies within a quarter of it
    /// from the latest point and that point's residual is small (a tiny step also comes
    /// from a point far up a steep wall).
    fn converged(&self, newton: Option<f64>, chord: Option<f64>) -> Option<(f64, f64)> {
        if let (Some(n), Some(c)) = (newton, chord)
            && (n - c).abs() <= LAMBDA_TOLERANCE / 2.0
        {
            return Some((n.min(c), n.max(c)));
        }
        let near = (self.last.value - self.search.bound).abs() <= NEAR_ROOT_RESIDUAL;
        [newton, chord]
            .into_iter()
            .flatten()
            .find(|&e| near && (e - self.last.lambda).abs() <= LAMBDA_TOLERANCE / 4.0)
            .map(|e| (e, e))
    }

    fn step_to(&mut self, x: f64) -> Result<(), MixingError> {
        self.steps = [self.steps[1], log_step(self.last.lambda, x)];
        self.probe(x).map(drop)
    }

    /// Evaluates just below `a` and just above `b` (skipping either side the bracket
    /// already covers). A side that turns out wrong makes the next step a bisection.
    fn finish_around(&mut self, a: f64, b: f64) -> Result<(), MixingError> {
        let margin = (LAMBDA_TOLERANCE - (b - a)) / 3.0;
        let (below, above) = (a - margin, b + margin);
        if self.inside(below) && !self.probe(below)? {
            self.misled = true;
            return Ok(());
        }
        if self.width() > LAMBDA_TOLERANCE && self.inside(above) && self.probe(above)? {
            self.misled = true;
        }
        Ok(())
    }

    /// Returns the lower end, evaluating λ = 0 first if it was only assumed feasible.
    fn finish(mut self) -> Result<Solution, MixingError> {
        if !self.lo_checked && !self.probe(0.0)? {
            return Err(MixingError::InfeasibleAtZero {
                value: self.last.value,
                bound: self.search.bound,
            });
        }
        Ok(Solution {
            lambda: self.lo.lambda,
            value: self.lo.value,
            violated_at: Some(self.hi.lambda),
            evaluations: self.evaluations,
        })
    }
}

#[cfg(test)]
#[path = "solver_tests.rs"]
mod tests;
