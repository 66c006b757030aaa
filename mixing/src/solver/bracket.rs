//! The bracket of a search and the rules that shrink it (see the parent module).

use super::{Evaluation, LAMBDA_TOLERANCE, Part, Search, Solution, check_bound, check_upper};
use crate::MixingError;

impl Search {
    /// Runs the search. `eval(λ)` evaluates the constraint at λ.
    pub(crate) fn run<F>(&self, eval: F) -> Result<Solution, MixingError>
    where
        F: FnMut(f64) -> Result<Evaluation, MixingError>,
    {
        check_upper(self.upper)?;
        check_bound(self.bound)?;
        solve(self, eval)
    }
}

/// After this many evaluations the search stops taking Newton steps and only bisects,
/// which bounds the cost of any solve by about 40 + log2(U / tolerance) evaluations.
const GUIDED_EVALUATIONS: u32 = 40;

/// The grid the λ of a converged search lies on: `2⁻³²`, a quarter of the tolerance, so
/// that λ is reproducible whatever the summation order of the evaluator (a permuted
/// vocabulary, another thread count) unless the supremum lies within
/// [`ESTIMATE_ERROR`] of a grid point.
const GRID: f64 = 1.0 / 4_294_967_296.0;

/// How far below the converged estimate of the supremum the returned grid point lies at
/// least: a bound on the estimate's error. The convergence tests below accept an estimate
/// whose predicted error is a tenth of this; with the grid point four steps above
/// (`4·GRID ≈ 9.3e-10 < LAMBDA_TOLERANCE`) the final bracket still holds the supremum
/// when the estimate is off by up to `3·GRID − ESTIMATE_ERROR ≈ 6e-10` upward.
const ESTIMATE_ERROR: f64 = 1e-10;

/// Largest predicted error, in log λ, at which an estimate counts as converged: a tenth
/// of [`ESTIMATE_ERROR`] (λ ≤ 1 for PMixED and SubMix; DPS-MOZO's λ ≤ 1.5 keeps a
/// margin of 6.7).
const CONVERGED: f64 = 1e-11;

/// Largest `|ln H(c) − ln H(b)|` at the latest point for which the two-point (Hermite)
/// estimate is trusted: the point must already be close to the root on the model's own
/// scale, not on a steep wall far from it.
const HERMITE_RESIDUAL: f64 = 1e-2;

/// Largest `|c(λ) − b|` at which a small Newton step is taken as a sign that the search
/// has converged (a tiny step also comes from a point far up a steep wall).
const NEAR_ROOT_RESIDUAL: f64 = 1e-3;

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

/// A part's point in Newton's log–log coordinates: `(ln λ, ln H(c), d ln H/d ln λ)`,
/// for a positive λ and a finite positive value and slope (else `None`).
fn log_log(lambda: f64, part: &Part) -> Option<(f64, f64, f64)> {
    let Part {
        value,
        slope,
        kappa,
    } = *part;
    let usable =
        value.is_finite() && value > 0.0 && slope.is_finite() && slope > 0.0 && lambda > 0.0;
    usable.then(|| {
        (
            lambda.ln(),
            log_h(kappa, value),
            lambda * slope * log_h_rate(kappa, value),
        )
    })
}

/// Runs the search (arguments already validated).
fn solve<F>(search: &Search, eval: F) -> Result<Solution, MixingError>
where
    F: FnMut(f64) -> Result<Evaluation, MixingError>,
{
    let mut state = State::new(search, eval);
    if state.probe(search.upper)? {
        return Ok(Solution {
            lambda: search.upper,
            value: state.last.value,
            violated_at: None,
            evaluations: state.evaluations,
        });
    }
    if search.bound == 0.0 {
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
    /// The evaluation before `last`, if any (for the two-point estimate).
    previous: Option<Sample>,
    /// The last two steps taken, in log λ, older first (for the `rtsafe` progress rule).
    steps: [f64; 2],
    /// Whether the latest point was reached by a Newton step.
    newton_last: bool,
    /// The bracket was closed around a converged estimate, with λ on the grid.
    on_grid: bool,
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
            previous: None,
            steps: [f64::INFINITY; 2],
            newton_last: false,
            on_grid: false,
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
        if self.evaluations > 0 {
            self.previous = Some(self.last);
        }
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
        s.parts
            .iter()
            .filter_map(|part| self.part_newton(s.lambda, part))
            .reduce(f64::min)
    }

    /// Newton's step for one part from λ (see [`State::newton`]).
    fn part_newton(&self, lambda: f64, part: &Part) -> Option<f64> {
        let (_, log_hc, power) = log_log(lambda, part)?;
        let x = lambda * ((log_h(part.kappa, self.search.bound) - log_hc) / power).exp();
        x.is_finite().then_some(x)
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

    /// Shrinks the bracket until it is no wider than the tolerance and, where Newton can
    /// get there, closed on the grid (so that λ does not depend on the path taken).
    fn bracket(&mut self) -> Result<(), MixingError> {
        loop {
            let closed = self.width() <= LAMBDA_TOLERANCE;
            let exhausted = self.evaluations >= GUIDED_EVALUATIONS;
            if closed && (self.on_grid || exhausted || self.misled) {
                return Ok(());
            }
            if self.misled || exhausted {
                self.misled = false;
                self.step_to(self.midpoint(), false)?;
                continue;
            }
            // Estimates may sit on a bracket end (Newton from a point exactly at the root);
            // steps must go strictly inside.
            let within = |x: &f64| *x >= self.lo.lambda && *x <= self.hi.lambda;
            let newton = self.newton(&self.last).filter(within);
            let chord = self.chord().filter(within);
            if let Some(estimate) = self.converged(newton, chord) {
                self.finish_on_grid(estimate)?;
                continue;
            }
            let (newton, chord) = (
                newton.filter(|&x| self.inside(x)),
                chord.filter(|&x| self.inside(x)),
            );
            if closed {
                // Accurate enough already; polish with Newton until it converges (a small
                // root is closed by the absolute tolerance long before Newton converges).
                match newton {
                    Some(n) => self.step_to(n, true)?,
                    None => return Ok(()),
                }
                continue;
            }
            // Newton must at least halve its step (in log λ, where its model lives) every
            // two steps (`rtsafe`); the chord, which can creep along one end, is taken only
            // while three evaluations halve the bracket.
            let stalled = self.width() > 0.5 * self.widths[0];
            match (newton, chord) {
                (Some(n), _)
                    if log_step(self.last.lambda, n).abs() <= 0.5 * self.steps[0].abs() =>
                {
                    self.step_to(n, true)?
                }
                (_, Some(c)) if !stalled => self.step_to(c, false)?,
                _ => self.step_to(self.midpoint(), false)?,
            }
        }
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

    /// The two-point estimate of the root and its predicted error (in log λ): the zero of
    /// the cubic Hermite interpolant, in Newton's log–log coordinates, through the last two
    /// evaluations of the part active at the latest one (values and slopes at both).
    ///
    /// Why: Newton from the latest point `x₁` leaves an error `e_N ≈ C·u²` (`u` its step,
    /// `C = |g''/2g'|` for the model residual `g`); the cubic through `x₀` and `x₁` leaves
    /// `|g''''/24g'|·u²·h²` (`h = x₀ − x₁`), far smaller when `x₁` came from a Newton step
    /// from `x₀`. With `e_N ≈ d = |Hermite − Newton|` and `|g''''/g'| ≈ (2C)³`, the
    /// predicted error is `d³h²/(3u⁴)`. Once the first Newton step from the upper end has
    /// landed near the root, this usually certifies convergence one evaluation earlier
    /// than Newton's own test. A wrong prediction costs speed only: the grid point below
    /// the estimate is evaluated, and the one above is evaluated or proven infeasible.
    ///
    /// `None` unless both points are positive with the same active part, finite positive
    /// values and slopes, the latest point is within [`HERMITE_RESIDUAL`] of the target on
    /// the model's scale, that part reaches the bound before the other one (by each part's
    /// Newton estimate), and the cubic's correction to Newton is small.
    fn hermite(&self) -> Option<(f64, f64)> {
        let (last, previous) = (&self.last, self.previous.as_ref()?);
        if !(last.lambda > 0.0 && previous.lambda > 0.0 && last.lambda != previous.lambda) {
            return None;
        }
        let j = usize::from(last.active() != last.parts[0]);
        let kappa = last.parts[j].kappa;
        let (x1, y1, g1) = log_log(last.lambda, &last.parts[j])?;
        let (x0, y0, g0) = log_log(previous.lambda, &previous.parts[j])?;
        let target = log_h(kappa, self.search.bound);
        let same_transform = previous.parts[j].kappa == kappa;
        if !(same_transform && (y1 - target).abs() <= HERMITE_RESIDUAL && g1 > 0.0 && g0 > 0.0) {
            return None;
        }
        // P(u) = y₁ + g₁u + a·u² + c·u³ with P(h) = y₀ and P'(h) = g₀.
        let h = x0 - x1;
        let d2 = (y0 - y1 - g1 * h) / (h * h);
        let e1 = (g0 - g1) / h;
        let c = (e1 - 2.0 * d2) / h;
        let a = 3.0 * d2 - e1;
        let newton = (target - y1) / g1;
        let mut u = newton;
        for _ in 0..4 {
            let p = y1 + u * (g1 + u * (a + c * u)) - target;
            let dp = g1 + u * (2.0 * a + 3.0 * c * u);
            if dp.is_nan() || dp <= 0.0 {
                return None;
            }
            u -= p / dp;
        }
        let d = (u - newton).abs();
        if !(u.is_finite() && d <= 0.5 * newton.abs()) {
            return None;
        }
        let estimate = last.lambda * u.exp();
        // The other part must not reach the bound first.
        let other = last.parts[1 - j];
        if other != last.parts[j]
            && let Some(n) = self.part_newton(last.lambda, &other)
            && n <= estimate * (1.0 + 1e-6)
        {
            return None;
        }
        let predicted = d * d * d * h * h / (3.0 * newton.powi(4));
        Some((estimate, predicted))
    }

    /// The root, once an estimate says the search has converged: the latest point's
    /// residual is small (a tiny step also comes from a point far up a steep wall) and
    ///
    /// * Newton's next point is predicted to be within ~1e-12·λ of the root (well inside
    ///   [`ESTIMATE_ERROR`]): Newton converges quadratically in log λ, so after steps `s₁`
    ///   then `s₂` the error left is about `s₂³/s₁²`; or its relative step is below 1e-7;
    /// * or, without slopes, the chord moved less than an eighth of the grid.
    fn converged(&self, newton: Option<f64>, chord: Option<f64>) -> Option<f64> {
        let last = self.last.lambda;
        if let Some((estimate, predicted)) = self.hermite()
            && predicted <= CONVERGED
            && estimate >= self.lo.lambda
            && estimate <= self.hi.lambda
        {
            return Some(estimate);
        }
        if (self.last.value - self.search.bound).abs() > NEAR_ROOT_RESIDUAL {
            return None;
        }
        match (newton, chord) {
            (Some(n), _) => {
                let step = log_step(last, n).abs();
                let previous = self.steps[1].abs();
                let predicted = if self.newton_last && previous > 0.0 {
                    step * (step / previous) * (step / previous)
                } else {
                    f64::INFINITY
                };
                (predicted <= CONVERGED / 10.0 || step <= 1e-7 || (n - last).abs() <= GRID / 8.0)
                    .then_some(n)
            }
            (None, Some(c)) => ((c - last).abs() <= GRID / 8.0).then_some(c),
            (None, None) => None,
        }
    }

    fn step_to(&mut self, x: f64, newton: bool) -> Result<(), MixingError> {
        self.steps = [self.steps[1], log_step(self.last.lambda, x)];
        self.newton_last = newton;
        self.probe(x).map(drop)
    }

    /// Closes the bracket around a converged estimate of the root on the grid: the lower
    /// end becomes the grid point at least `ESTIMATE_ERROR` below the estimate (evaluated,
    /// even when the bracket's lower end already lies above it, so that the λ returned
    /// depends on the estimate only and not on which side of the root earlier points fell
    /// by rounding), and the upper end at most four grid steps above it. A side that turns
    /// out wrong makes the next step a bisection.
    fn finish_on_grid(&mut self, estimate: f64) -> Result<(), MixingError> {
        let below = (((estimate - ESTIMATE_ERROR) / GRID).floor() * GRID).max(0.0);
        let above = below + 4.0 * GRID;
        if below >= self.hi.lambda {
            self.misled = true;
            return Ok(());
        }
        if below == 0.0 {
            // λ = 0 is feasible (checked by `finish`).
            self.lo = Sample {
                lambda: 0.0,
                value: 0.0,
                parts: self.lo.parts,
            };
            self.lo_checked = false;
        } else if below != self.lo.lambda {
            let saved = (self.lo, self.lo_checked, self.hi);
            if below < self.lo.lambda {
                // Retreat to the grid: probe as if the bracket's lower end were `below`.
                self.lo.lambda = below;
            }
            if !self.probe(below)? {
                if below < saved.0.lambda {
                    // Infeasible below a feasible point: the evaluator is not monotone at
                    // this scale. Keep the bracket as it was.
                    (self.lo, self.lo_checked, self.hi) = saved;
                }
                self.misled = true;
                return Ok(());
            }
        }
        if self.hi.lambda > above {
            if self.tangent_exceeds_bound(above) {
                self.hi = Sample {
                    lambda: above,
                    value: f64::INFINITY,
                    parts: self.lo.parts,
                };
            } else if self.probe(above)? {
                self.misled = true;
                return Ok(());
            }
        }
        self.on_grid = true;
        Ok(())
    }

    /// Whether the constraint is provably above the bound at `x` > the lower end, from
    /// the lower end's value and slope alone: for a constraint whose parts' transforms
    /// `H = expm1(κc)/κ` are convex in λ ([`Search::convex`]), `H(x) ≥ H(lo) + (x − lo)·H'(lo)`
    /// (the tangent), so a part whose tangent, mapped back to the constraint's scale,
    /// passes the bound by more than the evaluator's rounding is above the bound at `x`,
    /// and so is the maximum. The allowance is generous: the slope is taken `1e-6`
    /// (relative) low and the tangent must pass the bound by `1e-11` of the bound and of
    /// the lower end's value, far beyond the ~1e-13 to which the evaluators agree with an
    /// exact computation. A point that fails the test is evaluated instead.
    fn tangent_exceeds_bound(&self, x: f64) -> bool {
        const SLOPE_SLACK: f64 = 1e-6;
        const VALUE_SLACK: f64 = 1e-11;
        let b = self.search.bound;
        // (x, b) are finite here; b may be 0 (then the bracket closes at λ = 0) or +∞.
        let usable = self.search.convex && self.lo_checked && x > self.lo.lambda;
        if !usable || b <= 0.0 || b.is_infinite() {
            return false;
        }
        let step = x - self.lo.lambda;
        self.lo.parts.iter().any(|part| {
            let Part {
                value,
                slope,
                kappa,
            } = *part;
            if kappa == 0.0 || !(value.is_finite() && value >= 0.0 && slope.is_finite()) {
                return false;
            }
            // H(c) = expm1(κc)/κ, dH/dλ = e^{κc}·dc/dλ, and c = ln(1 + κH)/κ.
            let tangent = (kappa * value).exp_m1() / kappa
                + step * (kappa * value).exp() * slope.max(0.0) * (1.0 - SLOPE_SLACK);
            let back = (kappa * tangent).ln_1p() / kappa;
            back.is_finite() && back > b + VALUE_SLACK * (b + value)
        })
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
