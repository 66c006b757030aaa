//! Privacy-loss-distribution (PLD) accounting for DP-SGD: the Poisson-subsampled
//! Gaussian mechanism composed over many steps, with ε as tight as the numerical
//! accountants of dp_accounting (Google) and prv_accountant (Microsoft, Opacus'
//! `"prv"`), and never below the true ε.
//!
//! # What is computed
//!
//! For a mechanism M and neighbouring datasets D, D', the privacy loss is
//! `L = ln(p(o)/p'(o))` for an output o drawn from `p = M(D)`; its distribution
//! determines the hockey-stick divergence `δ(ε) = E[(1 − e^{ε−L})₊]` (plus the
//! mass of L = +∞), i.e. M is (ε, δ(ε))-DP, and the loss of a composition is the
//! sum of independent losses (Koskela, Jälkö & Honkela, "Computing Tight
//! Differential Privacy Guarantees Using FFT", arXiv:1906.03049, §3).
//!
//! 1. **Discretisation** ([`PrivacyLossDistribution::poisson_subsampled_gaussian`]):
//!    the loss of one step is put on the grid `k·h` (h =
//!    `value_discretization_interval`) by the *connect-the-dots* rule of
//!    Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, "Connect the Dots: Tighter
//!    Discrete Approximations of Privacy Loss Distributions", arXiv:2207.04380,
//!    Algorithm 1: a loss ℓ between grid points a < b is split between them
//!    so that both the mass and the mass weighted by `e^{−ℓ}` are kept. Losses
//!    beyond the truncated noise range go up: to +∞ above, to the grid point
//!    above them below. Both neighbouring directions (remove and add one record)
//!    are discretised for q < 1, as dp_accounting does.
//! 2. **Composition** ([`PrivacyLossDistribution::self_compose`],
//!    [`PrivacyLossDistribution::compose`]): FFT convolution (`rustfft`), T-fold
//!    by the T-th power in the frequency domain, on a window that a Chernoff
//!    bound shows holds all but `tail_mass_truncation` of the mass.
//! 3. **Conversion** ([`PrivacyLossDistribution::delta`],
//!    [`PrivacyLossDistribution::epsilon`]): the hockey-stick sum over the grid,
//!    the maximum over the two directions.
//!
//! # Guarantee
//!
//! Every reported δ(ε) is an upper bound on the true δ(ε) of the composed
//! mechanism, and every reported ε(δ) is at least the true smallest ε, provided
//! the assumptions below hold; the argument is written out in
//! `proof.md` beside this module (`src/pld/proof.md` in the crate; its §0
//! lists what is taken as given):
//!
//! * connect-the-dots and rounding up are *pessimistic*: the discretised
//!   losses dominate the true ones for every composition (Jensen in `e^{−ℓ}`);
//! * each grid mass is computed as an integral of a non-negative integrand by
//!   Gauss–Legendre quadrature and multiplied by `1 + 1e-9 + 8u·(max|ℓ|+1)/h`,
//!   above the analysed quadrature and rounding error (checked in the tests
//!   against quadrature of four times the order); the truncated noise tails
//!   are bounded with `erfc`;
//! * mass outside the composition window is moved to +∞ (Chernoff bound);
//! * **floating-point FFT error** is bounded in ℓ₂ with the normwise bound for
//!   the FFT (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
//!   Thm 24.2; assumed constant 10·log₂N unit roundoffs for rustfft's
//!   power-of-two transforms) and the error of the complex power, and that
//!   bound times √(window) is added to the +∞ mass
//!   ([`PrivacyLossDistribution::infinity_mass`]); negative FFT outputs are
//!   clamped to 0;
//! * the final sums are rounded up with a relative and absolute allowance.
//!
//! The FFT allowance is of order `T·10⁻¹⁴·‖p‖₂·√N` (about 1e-9 for T = 10⁴):
//! harmless for δ ≥ 1e-7, but it dominates a target δ near or below it. It is
//! reported, never hidden.
//!
//! # Example
//!
//! ```
//! use privmix_accountant::PrivacyLossDistribution;
//! // DP-SGD: σ = 1.5, sampling rate 0.04, 2250 steps (Opacus' test setting).
//! let step = PrivacyLossDistribution::poisson_subsampled_gaussian(1.5, 0.04, 1e-3).unwrap();
//! let eps = step.self_compose(2250).unwrap().epsilon(1e-5).unwrap();
//! assert!(eps > 6.6 && eps < 6.9);
//! ```

mod compose;
mod gaussian;
mod pmf;

use thiserror::Error;

use pmf::Pmf;

/// dp_accounting's default grid width for privacy losses.
pub const DEFAULT_DISCRETIZATION: f64 = 1e-4;

/// Mass that one composition may move to +∞ because it falls outside the
/// window the FFT computes (dp_accounting's default).
pub const TAIL_MASS_TRUNCATION: f64 = 1e-15;

/// Largest FFT length a composition may use (2²⁶ complex values, 1 GiB).
pub const MAX_FFT_LEN: usize = 1 << 26;

/// What went wrong in a PLD computation.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum PldError {
    /// A parameter is outside its domain; the message names it.
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name, e.g. `sigma`, `q`, `delta`.
        name: &'static str,
        /// The offending value.
        value: f64,
        /// What the domain is.
        reason: &'static str,
    },
    /// Two distributions on different grids cannot be composed.
    #[error("cannot compose PLDs with grid widths {0} and {1}")]
    GridMismatch(f64, f64),
    /// The grid or the FFT would exceed [`MAX_FFT_LEN`] values.
    #[error("the computation needs {needed} grid values, over the limit {limit}")]
    TooLarge {
        /// How many values were needed.
        needed: u128,
        /// The limit.
        limit: usize,
    },
}

/// The privacy-loss distributions of a mechanism for both neighbouring
/// directions (remove one record, add one record), discretised pessimistically.
///
/// δ and ε are reported as the maximum over the two directions. Where both are
/// the same (q = 1, the plain Gaussian) only one is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivacyLossDistribution {
    remove: Pmf,
    add: Option<Pmf>,
}

impl PrivacyLossDistribution {
    /// The PLD of one step of the Poisson-subsampled Gaussian mechanism: each
    /// record enters the batch with probability `q`, the sum of the batch's
    /// (clipped, sensitivity 1) contributions gets N(0, σ²) noise — one step of
    /// DP-SGD with noise multiplier `sigma`. Add/remove-one adjacency.
    ///
    /// Remove direction: `p = (1−q)·N(0,σ²) + q·N(−1,σ²)` against `p' = N(0,σ²)`;
    /// add direction: `p = N(0,σ²)` against `p' = (1−q)·N(0,σ²) + q·N(1,σ²)`
    /// (dp_accounting's `GaussianPrivacyLoss`, and the pair analysed by Mironov,
    /// Talwar & Zhang, "Rényi Differential Privacy of the Sampled Gaussian
    /// Mechanism", arXiv:1908.10530, §3). That these one-dimensional pairs are
    /// the worst case of a sensitivity-1 query is taken as given, as dp_accounting
    /// and the PRV accountant take it; see `proof.md`, §0.
    ///
    /// `discretization` is the grid width h ([`DEFAULT_DISCRETIZATION`] is
    /// dp_accounting's): ε is tighter for smaller h, at cost ∝ 1/h.
    /// q = 0 gives the identity (no loss); q = 1 the plain Gaussian.
    pub fn poisson_subsampled_gaussian(
        sigma: f64,
        q: f64,
        discretization: f64,
    ) -> Result<Self, PldError> {
        check_sigma(sigma)?;
        check_q(q)?;
        check_discretization(discretization)?;
        if q == 0.0 {
            return Ok(Self::identity(discretization));
        }
        let remove = gaussian::discretise(sigma, q, gaussian::Direction::Remove, discretization)?;
        let add = if q == 1.0 {
            None
        } else {
            Some(gaussian::discretise(
                sigma,
                q,
                gaussian::Direction::Add,
                discretization,
            )?)
        };
        Ok(Self { remove, add })
    }

    /// The PLD of the Gaussian mechanism with noise multiplier σ (sensitivity 1):
    /// [`Self::poisson_subsampled_gaussian`] with q = 1.
    pub fn gaussian(sigma: f64, discretization: f64) -> Result<Self, PldError> {
        Self::poisson_subsampled_gaussian(sigma, 1.0, discretization)
    }

    /// The PLD of a mechanism that reveals nothing: all mass at loss 0.
    pub fn identity(discretization: f64) -> Self {
        Self {
            remove: Pmf::identity(discretization),
            add: None,
        }
    }

    /// The PLD of `count` independent runs of this mechanism (adaptive
    /// composition), by the `count`-th power of the FFT. `count` = 0 gives the
    /// identity.
    pub fn self_compose(&self, count: u64) -> Result<Self, PldError> {
        if count == 0 {
            return Ok(Self::identity(self.discretization()));
        }
        Ok(Self {
            remove: compose::self_compose(&self.remove, count)?,
            add: self
                .add
                .as_ref()
                .map(|p| compose::self_compose(p, count))
                .transpose()?,
        })
    }

    /// The PLD of this mechanism followed by `other` (both on the same grid).
    pub fn compose(&self, other: &Self) -> Result<Self, PldError> {
        let remove = compose::compose(&self.remove, &other.remove)?;
        let add = match (&self.add, &other.add) {
            (None, None) => None,
            (a, b) => Some(compose::compose(
                a.as_ref().unwrap_or(&self.remove),
                b.as_ref().unwrap_or(&other.remove),
            )?),
        };
        Ok(Self { remove, add })
    }

    /// An upper bound on the smallest δ for which the mechanism is (ε, δ)-DP,
    /// over both directions; ε ≥ 0, and ε = +∞ gives the +∞ mass.
    pub fn delta(&self, epsilon: f64) -> Result<f64, PldError> {
        if epsilon.is_nan() || epsilon < 0.0 {
            return Err(PldError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "must be a number ≥ 0",
            });
        }
        let mut d = self.remove.delta_up(epsilon);
        if let Some(add) = &self.add {
            d = d.max(add.delta_up(epsilon));
        }
        Ok(d)
    }

    /// An ε ≥ 0, rounded up, for which the mechanism is (ε, δ)-DP: checked with
    /// [`Self::delta`] and within a relative 1e-9 of the smallest such ε on
    /// the discretised distribution. `delta` must lie in (0, 1). Returns +∞ when
    /// the +∞ mass (truncation and FFT allowance included) already exceeds δ.
    pub fn epsilon(&self, delta: f64) -> Result<f64, PldError> {
        if !(delta > 0.0 && delta < 1.0) {
            return Err(PldError::InvalidParameter {
                name: "delta",
                value: delta,
                reason: "must lie in the open interval (0, 1)",
            });
        }
        let mut e = self.remove.epsilon_up(delta);
        if let Some(add) = &self.add {
            e = e.max(add.epsilon_up(delta));
        }
        Ok(e)
    }

    /// The grid width h of the losses.
    pub fn discretization(&self) -> f64 {
        self.remove.discretization()
    }

    /// The mass at loss +∞ (the larger of the two directions): true mass,
    /// truncated tails and the FFT error allowance. δ(ε) is never below it.
    pub fn infinity_mass(&self) -> f64 {
        let m = self.remove.infinity();
        self.add.as_ref().map_or(m, |a| m.max(a.infinity()))
    }

    /// How many grid values the larger direction holds (memory and time scale with it).
    pub fn len(&self) -> usize {
        let n = self.remove.len();
        self.add.as_ref().map_or(n, |a| n.max(a.len()))
    }

    /// Never true: a distribution holds at least one grid value.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// ε for DP-SGD by the PLD accountant: `steps` steps of the Poisson-subsampled
/// Gaussian with noise multiplier `sigma` and sampling rate `q`, at δ, on
/// dp_accounting's default grid ([`DEFAULT_DISCRETIZATION`]).
pub fn dp_sgd_epsilon(sigma: f64, q: f64, steps: u64, delta: f64) -> Result<f64, PldError> {
    PrivacyLossDistribution::poisson_subsampled_gaussian(sigma, q, DEFAULT_DISCRETIZATION)?
        .self_compose(steps)?
        .epsilon(delta)
}

fn check_sigma(sigma: f64) -> Result<(), PldError> {
    if sigma.is_finite() && sigma > 0.0 {
        Ok(())
    } else {
        Err(PldError::InvalidParameter {
            name: "sigma",
            value: sigma,
            reason: "the noise multiplier must be finite and > 0",
        })
    }
}

fn check_q(q: f64) -> Result<(), PldError> {
    if (0.0..=1.0).contains(&q) {
        Ok(())
    } else {
        Err(PldError::InvalidParameter {
            name: "q",
            value: q,
            reason: "the sampling rate must lie in [0, 1]",
        })
    }
}

fn check_discretization(h: f64) -> Result<(), PldError> {
    if h.is_finite() && (1e-8..=1.0).contains(&h) {
        Ok(())
    } else {
        Err(PldError::InvalidParameter {
            name: "discretization",
            value: h,
            reason: "the grid width must lie in [1e-8, 1]",
        })
    }
}
