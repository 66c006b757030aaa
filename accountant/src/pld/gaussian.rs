//! Connect-the-dots discretisation of one step of the Poisson-subsampled
//! Gaussian mechanism (Doroshenko et al., arXiv:2207.04380, Algorithm 1).
//!
//! For a grid cell [a, b] (b = a + h), a loss ℓ ∈ [a, b] is split into mass
//! `w_b(ℓ) = (1 − e^{a−ℓ}) / (1 − e^{a−b})` at b and `w_a(ℓ) = 1 − w_b(ℓ) =
//! (e^{b−ℓ} − 1) / (e^{b−a} − 1)` at a, which keeps both the mass and
//! `E[e^{−ℓ}]` (`proof.md` §2). The cell's contribution is the integral of
//! `p(x)·w(ℓ(x))` over the noise values x whose loss lies in [a, b]: a
//! non-negative integrand, integrated by Gauss–Legendre quadrature, so tiny
//! masses keep their relative accuracy (dp_accounting instead takes second
//! differences of the privacy profile, which loses ~1e-12 absolute per cell).

use super::pmf::Pmf;
use super::{MAX_FFT_LEN, PldError};

/// Which neighbouring direction the pair describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// D' has one record fewer: p = (1−q)N(0,σ²) + qN(−1,σ²), p' = N(0,σ²).
    Remove,
    /// D' has one record more: p = N(0,σ²), p' = (1−q)N(0,σ²) + qN(1,σ²).
    Add,
}

/// The noise range discretised is ±`TAIL_Z`·σ around the mixture's components;
/// the mass beyond is at most Φ(−10) ≈ 7.6e-24 per side and is bounded with
/// `erfc` and moved up (to +∞ or to a grid point above it).
const TAIL_Z: f64 = 10.0;

/// Every computed grid mass is multiplied by `1 + MASS_INFLATION +
/// 8u·(max|ℓ| + 1)/h`: above the relative error of the quadrature and of the
/// floating-point evaluation, the second term for the rounding of the losses
/// against the grid (`proof.md` §3; measured ≤ 1e-11 in the tests).
pub(crate) const MASS_INFLATION: f64 = 1e-9;

/// Gauss–Legendre nodes per quadrature piece.
pub(crate) const QUADRATURE_NODES: usize = 4;

/// Pieces are at most σ/`PIECES_PER_SIGMA` wide, so the Gaussian factor varies
/// little across one piece even where a grid cell is wide in x.
const PIECES_PER_SIGMA: f64 = 32.0;

/// The one-step privacy loss of the pair: `ℓ(x) = ln(p(x)/p'(x))`, decreasing in x.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GaussianLoss {
    sigma: f64,
    var: f64,
    q: f64,
    direction: Direction,
}

impl GaussianLoss {
    pub(crate) fn new(sigma: f64, q: f64, direction: Direction) -> Self {
        Self {
            sigma,
            var: sigma * sigma,
            q,
            direction,
        }
    }

    /// ℓ(x). Remove: `ln(1−q+q·e^u)`, u = −(x+½)/σ²; add: `−ln(1−q+q·e^v)`,
    /// v = (x−½)/σ².
    pub(crate) fn loss(&self, x: f64) -> f64 {
        match self.direction {
            Direction::Remove => ln_mix(self.q, -(x + 0.5) / self.var),
            Direction::Add => -ln_mix(self.q, (x - 0.5) / self.var),
        }
    }

    /// The x with ℓ(x) = l; +∞ (remove) or −∞ (add) where l is beyond the
    /// loss's asymptote ln(1−q) (remove) or −ln(1−q) (add).
    pub(crate) fn inverse(&self, l: f64) -> f64 {
        match self.direction {
            Direction::Remove => -self.var * inverse_mix(self.q, l) - 0.5,
            Direction::Add => self.var * inverse_mix(self.q, -l) + 0.5,
        }
    }

    /// Density of p at x.
    pub(crate) fn density(&self, x: f64) -> f64 {
        match self.direction {
            Direction::Remove if self.q < 1.0 => {
                (1.0 - self.q) * normal_pdf(x, self.sigma)
                    + self.q * normal_pdf(x + 1.0, self.sigma)
            }
            Direction::Remove => normal_pdf(x + 1.0, self.sigma),
            Direction::Add => normal_pdf(x, self.sigma),
        }
    }

    /// p(X < x).
    pub(crate) fn cdf(&self, x: f64) -> f64 {
        match self.direction {
            Direction::Remove => {
                (1.0 - self.q) * normal_cdf(x, self.sigma)
                    + self.q * normal_cdf(x + 1.0, self.sigma)
            }
            Direction::Add => normal_cdf(x, self.sigma),
        }
    }

    /// p(X > x).
    pub(crate) fn sf(&self, x: f64) -> f64 {
        match self.direction {
            Direction::Remove => {
                (1.0 - self.q) * normal_cdf(-x, self.sigma)
                    + self.q * normal_cdf(-(x + 1.0), self.sigma)
            }
            Direction::Add => normal_cdf(-x, self.sigma),
        }
    }

    /// The noise range [x_min, x_max] that is discretised.
    pub(crate) fn range(&self) -> (f64, f64) {
        let r = TAIL_Z * self.sigma;
        match self.direction {
            Direction::Remove => (-1.0 - r, r),
            Direction::Add => (-r, r),
        }
    }
}

/// `ln(1 − q + q·eᵘ)`, accurate for all u (q ∈ (0, 1]).
fn ln_mix(q: f64, u: f64) -> f64 {
    if q == 1.0 {
        u
    } else if u < 1.0 {
        (q * u.exp_m1()).ln_1p()
    } else {
        u + (q + (1.0 - q) * (-u).exp()).ln()
    }
}

/// The u with `ln(1 − q + q·eᵘ) = m`, or −∞ when m ≤ ln(1 − q).
fn inverse_mix(q: f64, m: f64) -> f64 {
    if q == 1.0 {
        return m;
    }
    if m > 1.0 {
        // eᵘ = (eᵐ − 1 + q)/q = eᵐ(1 − (1−q)e^{−m})/q.
        return m - q.ln() + (-(1.0 - q) * (-m).exp()).ln_1p();
    }
    let r = m.exp_m1() / q;
    if r <= -1.0 {
        f64::NEG_INFINITY
    } else {
        r.ln_1p()
    }
}

fn normal_pdf(x: f64, sigma: f64) -> f64 {
    let z = x / sigma;
    (-0.5 * z * z).exp() / (sigma * (2.0 * std::f64::consts::PI).sqrt())
}

/// Φ(x/σ) = erfc(−x/(σ√2))/2, accurate in both tails.
fn normal_cdf(x: f64, sigma: f64) -> f64 {
    0.5 * libm::erfc(-x / (sigma * std::f64::consts::SQRT_2))
}

/// Gauss–Legendre nodes and weights on [−1, 1] (Newton's method on the
/// Legendre polynomial, to machine precision).
pub(crate) fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // Chebyshev-like first guess, then Newton on P_n.
        let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
        let mut dp = 0.0;
        for _ in 0..100 {
            let (mut p0, mut p1) = (1.0, x);
            for k in 2..=n {
                let kf = k as f64;
                let p2 = ((2.0 * kf - 1.0) * x * p1 - (kf - 1.0) * p0) / kf;
                p0 = p1;
                p1 = p2;
            }
            dp = n as f64 * (x * p1 - p0) / (x * x - 1.0);
            let dx = p1 / dp;
            x -= dx;
            if dx.abs() < 1e-16 {
                break;
            }
        }
        out.push((x, 2.0 / ((1.0 - x * x) * dp * dp)));
    }
    out
}

/// The pessimistic connect-the-dots PMF of one direction on the grid of width `h`.
pub(crate) fn discretise(
    sigma: f64,
    q: f64,
    direction: Direction,
    h: f64,
) -> Result<Pmf, PldError> {
    discretise_with(GaussianLoss::new(sigma, q, direction), h, QUADRATURE_NODES)
}

/// [`discretise`] with a chosen number of quadrature nodes (the tests compare orders).
pub(crate) fn discretise_with(pl: GaussianLoss, h: f64, nodes: usize) -> Result<Pmf, PldError> {
    let (x_min, x_max) = pl.range();
    let (l_max, l_min) = (pl.loss(x_min), pl.loss(x_max));
    let j_lo = (l_min / h).floor();
    let j_hi = (l_max / h).ceil();
    let count = j_hi - j_lo + 1.0;
    if count.is_nan() || count > MAX_FFT_LEN as f64 {
        return Err(PldError::TooLarge {
            needed: if count.is_finite() {
                count as u128
            } else {
                u128::MAX
            },
            limit: MAX_FFT_LEN,
        });
    }
    let count = count as usize;
    let j_lo = j_lo as i64;
    let grid = |k: usize| (j_lo + k as i64) as f64 * h;
    // Breakpoints: xs[k] is where the loss crosses grid point k (x falls as k grows).
    let xs: Vec<f64> = (0..count)
        .map(|k| pl.inverse(grid(k)).clamp(x_min, x_max))
        .collect();
    let rule = gauss_legendre(nodes);
    let one_minus_e_neg_h = -(-h).exp_m1();
    let e_h_minus_one = h.exp_m1();
    let max_piece = pl.sigma / PIECES_PER_SIGMA;
    let mut probs = vec![0.0; count];
    for k in 1..count {
        let (lo, hi) = (xs[k], xs[k - 1]);
        if lo >= hi {
            continue;
        }
        let (a, b) = (grid(k - 1), grid(k));
        let pieces = ((hi - lo) / max_piece).ceil().max(1.0);
        let width = (hi - lo) / pieces;
        let (mut to_a, mut to_b) = (0.0, 0.0);
        for piece in 0..pieces as usize {
            let mid = lo + width * (piece as f64 + 0.5);
            for &(t, w) in &rule {
                let x = mid + 0.5 * width * t;
                let l = pl.loss(x);
                let mass = w * pl.density(x);
                to_b += mass * (-(a - l).exp_m1() / one_minus_e_neg_h).clamp(0.0, 1.0);
                to_a += mass * ((b - l).exp_m1() / e_h_minus_one).clamp(0.0, 1.0);
            }
        }
        probs[k] += 0.5 * width * to_b;
        probs[k - 1] += 0.5 * width * to_a;
    }
    // Noise beyond x_max has loss below ℓ(x_max): up to the grid point above ℓ(x_max).
    let k_up = ((l_min / h).ceil() as i64 - j_lo) as usize;
    probs[k_up.min(count - 1)] += pl.sf(x_max);
    let inflation = 1.0
        + MASS_INFLATION
        + 8.0 * super::pmf::UNIT_ROUNDOFF * (l_max.abs().max(l_min.abs()) + 1.0) / h;
    for p in &mut probs {
        *p *= inflation;
    }
    // Noise below x_min has loss above ℓ(x_min): to +∞.
    let infinity = pl.cdf(x_min) * inflation;
    Ok(Pmf::new(h, j_lo, probs, infinity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauss_legendre_integrates_polynomials_exactly() {
        for n in [4, 8, 16] {
            let rule = gauss_legendre(n);
            let w: f64 = rule.iter().map(|&(_, w)| w).sum();
            assert!((w - 2.0).abs() < 1e-14, "{n}: {w}");
            // ∫ x^(2n−2) over [−1, 1] = 2/(2n−1).
            let m = 2 * n - 2;
            let got: f64 = rule.iter().map(|&(x, w)| w * x.powi(m as i32)).sum();
            assert!((got - 2.0 / (m as f64 + 1.0)).abs() < 1e-14, "{n}: {got}");
        }
    }

    #[test]
    fn inverse_inverts_the_loss() {
        for dir in [Direction::Remove, Direction::Add] {
            for (sigma, q) in [(1.0, 1.0), (0.8, 0.05), (2.0, 0.001), (0.5, 0.9)] {
                let pl = GaussianLoss::new(sigma, q, dir);
                for x in [-8.0, -2.0, -0.3, 0.0, 0.7, 3.0, 9.0] {
                    let l = pl.loss(x);
                    let back = pl.inverse(l);
                    // Where the loss is flat (near its asymptote) x is ill-determined:
                    // compare losses instead.
                    let err = (pl.loss(back) - l).abs();
                    assert!(
                        err <= 1e-12 * (1.0 + l.abs()),
                        "{dir:?} {sigma} {q} {x}: {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn mass_is_conserved_and_quadrature_has_converged() {
        for dir in [Direction::Remove, Direction::Add] {
            for (sigma, q) in [(1.0, 1.0), (0.8, 0.05), (1.5, 0.01)] {
                let pl = GaussianLoss::new(sigma, q, dir);
                let p8 = discretise_with(pl, 1e-3, QUADRATURE_NODES).unwrap();
                let p16 = discretise_with(pl, 1e-3, 16).unwrap();
                let total: f64 = p8.probs().iter().sum::<f64>() + p8.infinity();
                assert!((total - 1.0).abs() < 2e-9, "{dir:?} {sigma} {q}: {total}");
                for (a, b) in p8.probs().iter().zip(p16.probs()) {
                    // Far inside MASS_INFLATION = 1e-9.
                    assert!((a - b).abs() <= 1e-11 * b + 1e-300, "{dir:?}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn connect_the_dots_keeps_the_mean_of_e_to_the_minus_loss() {
        // E_p[e^{−ℓ}] = p'(ℝ) = 1 for the exact pair; the split keeps it cell by
        // cell, so the discretised value is 1 up to the tails and the inflation.
        for dir in [Direction::Remove, Direction::Add] {
            let p = discretise(0.9, 0.1, dir, 1e-3).unwrap();
            let m: f64 = p
                .probs()
                .iter()
                .enumerate()
                .map(|(i, &w)| w * (-p.loss(i)).exp())
                .sum();
            assert!((m - 1.0).abs() < 2e-9, "{dir:?}: {m}");
        }
    }
}
