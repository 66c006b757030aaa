//! Composition of discretised PLDs by FFT, with the floating-point error of the
//! transform bounded and moved to the +∞ mass (`proof.md` §4–§5).
//!
//! Error model (u = 2⁻⁵³): a power-of-two FFT of length N computed in floating
//! point satisfies `‖ŷ − y‖₂ ≤ κ_N‖y‖₂` with `κ_N = 10·log₂N·u/(1 − 10·log₂N·u)`
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm 24.2,
//! whose constant `log₂N·(μ + γ₄(√2 + μ))` is below 8·log₂N·u for twiddle
//! factors accurate to μ ≤ u; the margin to 10 is our assumption for rustfft);
//! a complex product has relative error at most √5·u (Brent, Percival &
//! Zimmermann 2007). The ℓ₂ error E of the computed masses then gives, for every
//! ε, `|Σ e_k·h_k(ε)| ≤ E·√n` with 0 ≤ h ≤ 1 on n values, so `E·√n` at +∞
//! restores domination (`proof.md` §5).

use rustfft::FftPlanner;
use rustfft::num_complex::Complex64;

use super::pmf::{Pmf, UNIT_ROUNDOFF};
use super::{MAX_FFT_LEN, PldError, TAIL_MASS_TRUNCATION};
use privmix_renyi::round::{add_up, exp_m1_up, ln_1p_up, mul_up, sqrt_up};

/// Normwise relative error bound of one FFT of power-of-two length n.
fn kappa(n: usize) -> f64 {
    let c = 10.0 * f64::from(n.trailing_zeros().max(1)) * UNIT_ROUNDOFF;
    c / (1.0 - c)
}

/// Σ p and ‖p‖₂, rounded up.
fn norms(p: &[f64]) -> (f64, f64) {
    let n = p.len() as f64;
    let s: f64 = p.iter().sum();
    let s2: f64 = p.iter().map(|x| x * x).sum();
    let slack = 1.0 + (n + 4.0) * 2.0 * UNIT_ROUNDOFF;
    (mul_up(s, slack), sqrt_up(mul_up(s2, slack)))
}

fn check_len(needed: u128) -> Result<usize, PldError> {
    if needed > MAX_FFT_LEN as u128 {
        return Err(PldError::TooLarge {
            needed,
            limit: MAX_FFT_LEN,
        });
    }
    let n = (needed as usize).next_power_of_two();
    if n > MAX_FFT_LEN {
        return Err(PldError::TooLarge {
            needed: n as u128,
            limit: MAX_FFT_LEN,
        });
    }
    Ok(n)
}

/// `z^t` by binary powering (at most 2·⌈log₂(t+1)⌉ complex products).
fn cpow(mut z: Complex64, mut t: u64) -> Complex64 {
    let mut acc = Complex64::new(1.0, 0.0);
    while t > 0 {
        if t & 1 == 1 {
            acc *= z;
        }
        t >>= 1;
        if t > 0 {
            z *= z;
        }
    }
    acc
}

/// An index window [lo, hi] that holds all but `tau` of the mass of the
/// `t`-fold convolution of `p` (indices 0..len): by Chernoff,
/// `μ^{*t}(S ≥ s) ≤ e^{−λs}·M(λ)^t` for λ > 0 (and the mirror for λ < 0), with
/// `M(λ) = Σ p_i e^{λi}` — valid for any non-negative measure. Each side is
/// given τ/2; the log-moments are rounded up with a relative 1e-12 slack.
fn chernoff_window(p: &[f64], t: u64, tau: f64) -> (u128, u128) {
    let len = p.len();
    let full_hi = (len as u128 - 1) * u128::from(t);
    let (mut lo, mut hi) = (0f64, full_hi as f64);
    let log_tail = (2.0 / tau).ln();
    let tf = t as f64;
    // λ = 2^j/len: the optimum is near √(2·ln(2/τ)/t)/(spread of p in grid
    // values), which these cover from t = 2 to beyond t = 10⁶ for the grids used.
    for j in (-12..=6).step_by(2) {
        let base = 2f64.powi(j) / len as f64;
        for lambda in [base, -base] {
            // ln Σ p_i e^{λi}, shifted by its largest exponent.
            let shift = if lambda > 0.0 {
                lambda * (len - 1) as f64
            } else {
                0.0
            };
            let m: f64 = p
                .iter()
                .enumerate()
                .filter(|&(_, &x)| x > 0.0)
                .map(|(i, &x)| x * (lambda * i as f64 - shift).exp())
                .sum();
            if m <= 0.0 {
                continue;
            }
            let ln_m = m.ln() + shift;
            let ln_m_up = ln_m + 1e-12 * (1.0 + ln_m.abs() + shift.abs());
            let bound = (tf * ln_m_up + log_tail) / lambda;
            if !bound.is_finite() {
                continue;
            }
            if lambda > 0.0 {
                hi = hi.min(bound.ceil() + 1.0);
            } else {
                lo = lo.max(bound.floor() - 1.0);
            }
        }
    }
    let lo = lo.max(0.0) as u128;
    let hi = (hi.max(0.0) as u128).min(full_hi).max(lo);
    (lo, hi)
}

/// The `t`-fold composition of `p` with itself, by the t-th power of its FFT on
/// a Chernoff window. Dominates the t-fold composition of whatever `p` dominates.
pub(crate) fn self_compose(p: &Pmf, t: u64) -> Result<Pmf, PldError> {
    if t == 1 {
        return Ok(p.clone());
    }
    let probs = p.probs();
    let (s, x2) = norms(probs);
    let (lo, hi) = chernoff_window(probs, t, TAIL_MASS_TRUNCATION);
    let width = hi - lo + 1;
    let n = check_len(width.max(probs.len() as u128))?;
    let width = width as usize;

    let mut planner = FftPlanner::<f64>::new();
    let mut buf: Vec<Complex64> = probs.iter().map(|&x| Complex64::new(x, 0.0)).collect();
    buf.resize(n, Complex64::new(0.0, 0.0));
    planner.plan_fft_forward(n).process(&mut buf);
    for z in &mut buf {
        *z = cpow(*z, t);
    }
    planner.plan_fft_inverse(n).process(&mut buf);
    let scale = 1.0 / n as f64;
    let shift = (lo % n as u128) as usize;
    let out: Vec<f64> = (0..width)
        .map(|k| (buf[(shift + k) % n].re * scale).max(0.0))
        .collect();

    // ℓ₂ error of `out` against the exact circular t-fold convolution
    // (proof.md §5): forward error ≤ κ√N‖p‖₂ per the whole spectrum, so every
    // |X̂_k| ≤ s' = s + κ√N‖p‖₂; the power moves it by ≤ t·s'^{t−1}·|η_k| and
    // adds relative κ_pow; the inverse adds κ·‖·‖.
    let kap = kappa(n);
    let tf = t as f64;
    let s_prime = add_up(s, mul_up(mul_up(kap, sqrt_up(n as f64)), x2));
    let products = 2.0 * (64 - t.leading_zeros()) as f64;
    let kap_pow = products * 5f64.sqrt() * UNIT_ROUNDOFF * 1.01;
    let s_pow = s_prime.powf(tf) * (1.0 + 1e-12);
    let s_pow_m1 = s_prime.powf(tf - 1.0) * (1.0 + 1e-12);
    let err2 = (tf * s_pow_m1 * kap * x2 + (kap_pow + kap) * s_pow) * (1.0 + 1e-6);
    let allowance = mul_up(err2, sqrt_up(width as f64));

    // +∞ after t steps: (s + p∞)^t − s^t = s^t·(e^{t·ln(1 + p∞/s)} − 1).
    let inf_composed = mul_up(
        s_pow,
        exp_m1_up(mul_up(
            tf,
            ln_1p_up(p.infinity() / s * (1.0 + 4.0 * UNIT_ROUNDOFF)),
        )),
    );
    let infinity = add_up(add_up(inf_composed, TAIL_MASS_TRUNCATION), allowance);
    let lower = p.lower() * t as i64 + lo as i64;
    Ok(Pmf::new(p.discretization(), lower, out, infinity))
}

/// The composition of two PMFs on the same grid (linear convolution by FFT, no
/// truncation).
pub(crate) fn compose(a: &Pmf, b: &Pmf) -> Result<Pmf, PldError> {
    if a.discretization() != b.discretization() {
        return Err(PldError::GridMismatch(
            a.discretization(),
            b.discretization(),
        ));
    }
    let len = a.len() + b.len() - 1;
    let n = check_len(len as u128)?;
    let mut planner = FftPlanner::<f64>::new();
    let forward = planner.plan_fft_forward(n);
    let spectrum = |p: &[f64]| {
        let mut v: Vec<Complex64> = p.iter().map(|&x| Complex64::new(x, 0.0)).collect();
        v.resize(n, Complex64::new(0.0, 0.0));
        forward.process(&mut v);
        v
    };
    let mut fa = spectrum(a.probs());
    let fb = spectrum(b.probs());
    for (x, y) in fa.iter_mut().zip(&fb) {
        *x *= *y;
    }
    planner.plan_fft_inverse(n).process(&mut fa);
    let scale = 1.0 / n as f64;
    let out: Vec<f64> = fa[..len].iter().map(|z| (z.re * scale).max(0.0)).collect();

    // ℓ₂ error (proof.md §5): |X̂Ŷ − XY| ≤ |X̂ − X||Ŷ| + |X||Ŷ − Y| + √5u|X̂Ŷ|.
    let kap = kappa(n);
    let root_n = sqrt_up(n as f64);
    let (sa, a2) = norms(a.probs());
    let (sb, b2) = norms(b.probs());
    let sa_p = add_up(sa, mul_up(mul_up(kap, root_n), a2));
    let sb_p = add_up(sb, mul_up(mul_up(kap, root_n), b2));
    let err2 = (kap * (a2 * sb_p + sa_p * b2) + (5f64.sqrt() * UNIT_ROUNDOFF + kap) * sa_p * sb_p)
        * (1.0 + 1e-6);
    let allowance = mul_up(err2, sqrt_up(len as f64));
    // +∞: any of the two at +∞, counted with the (possibly > 1) finite masses.
    let inf_composed = add_up(
        add_up(mul_up(sa, b.infinity()), mul_up(a.infinity(), sb)),
        mul_up(a.infinity(), b.infinity()),
    );
    let infinity = add_up(inf_composed, allowance);
    Ok(Pmf::new(
        a.discretization(),
        a.lower() + b.lower(),
        out,
        infinity,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct (exact up to rounding) linear convolution.
    fn convolve(a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; a.len() + b.len() - 1];
        for (i, x) in a.iter().enumerate() {
            for (j, y) in b.iter().enumerate() {
                out[i + j] += x * y;
            }
        }
        out
    }

    fn test_pmf(len: usize, seed: u64) -> Pmf {
        // A deterministic, smooth-ish, normalised mass function.
        let mut v: Vec<f64> = (0..len)
            .map(|i| {
                let x = i as f64 / len as f64 - 0.4;
                (-(x * x) * 40.0).exp() * (1.0 + 0.3 * ((i as u64 * seed) % 7) as f64)
            })
            .collect();
        let s: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= s);
        Pmf::new(0.01, -(len as i64) / 3, v, 1e-6)
    }

    #[test]
    fn self_compose_matches_direct_convolution_within_the_allowance() {
        let p = test_pmf(300, 3);
        for t in [2u64, 3, 7, 20] {
            let fft = self_compose(&p, t).unwrap();
            let mut direct = p.probs().to_vec();
            for _ in 1..t {
                direct = convolve(&direct, p.probs());
            }
            let lower = p.lower() * t as i64;
            // Every direct mass inside the window is matched; the error is far
            // inside the ℓ₂ allowance that went to +∞.
            let mut err2 = 0.0;
            for (k, &x) in fft.probs().iter().enumerate() {
                let idx = (fft.lower() + k as i64 - lower) as usize;
                err2 += (x - direct[idx]).powi(2);
            }
            let allowance = fft.infinity() - TAIL_MASS_TRUNCATION;
            assert!(err2.sqrt() * (fft.len() as f64).sqrt() <= allowance, "{t}");
            // δ never below the exact one.
            for eps in [0.0, 0.1, 0.5, 1.0] {
                let exact = Pmf::new(0.01, lower, direct.clone(), 0.0).delta_up(eps);
                assert!(fft.delta_up(eps) >= exact, "{t} {eps}");
            }
        }
    }

    #[test]
    fn compose_matches_direct_convolution() {
        let (a, b) = (test_pmf(200, 5), test_pmf(130, 2));
        let c = compose(&a, &b).unwrap();
        let direct = convolve(a.probs(), b.probs());
        let shift = (c.lower() - (a.lower() + b.lower())) as usize;
        for (k, &x) in c.probs().iter().enumerate() {
            assert!((x - direct[k + shift]).abs() < 1e-15, "{k}");
        }
        // (1 + 1e-6)² − 1 at +∞, plus the FFT allowance (≈ 1e-13 here).
        let inf = 1e-6 + 1e-6 + 1e-12;
        assert!(
            c.infinity() >= inf && c.infinity() < inf + 1e-11,
            "{}",
            c.infinity()
        );
    }

    #[test]
    fn chernoff_window_holds_the_mass() {
        let p = test_pmf(100, 1);
        let t = 50;
        let (lo, hi) = chernoff_window(p.probs(), t, 1e-15);
        let mut direct = p.probs().to_vec();
        for _ in 1..t {
            direct = convolve(&direct, p.probs());
        }
        let outside: f64 = direct[..lo as usize].iter().sum::<f64>()
            + direct[hi as usize + 1..].iter().sum::<f64>();
        assert!(outside <= 1e-15, "{outside}");
        // and it is much narrower than the full support
        assert!(((hi - lo) as usize) < direct.len() / 2, "{lo} {hi}");
    }

    #[test]
    fn grids_must_match() {
        let a = Pmf::identity(0.1);
        let b = Pmf::identity(0.2);
        assert!(matches!(compose(&a, &b), Err(PldError::GridMismatch(..))));
    }
}
