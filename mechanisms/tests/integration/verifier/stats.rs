//! Pearson's chi-square goodness-of-fit test and its power, in the verifier's own
//! arithmetic (no statistics crate).
//!
//! Power: under an alternative law p₁ the statistic is approximately noncentral
//! chi-square with `bins − 1` degrees of freedom and noncentrality
//! `λ = n·Σ (p₁ − p₀)²/p₀ = n·χ²(p₁ ‖ p₀)` (Pearson's statistic under local
//! alternatives; Cochran 1952). [`detectable`] returns the smallest χ²-distance
//! `χ²(p₁ ‖ p₀)` that a test of `n` draws rejects with probability ≥ `power`; since
//! `TV(p₀, p₁) ≤ ½·√χ²(p₁ ‖ p₀)` (Cauchy–Schwarz), every alternative at total variation
//! `≥ ½·√detectable` from p₀ is detected with at least that power.

/// `ln Γ(x)` for x > 0 (Lanczos, g = 7, n = 9; relative error below 1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised lower incomplete gamma function P(a, x).
pub fn gamma_p(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        // Series.
        let (mut sum, mut term, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        (sum * front).min(1.0)
    } else {
        // Continued fraction for Q (modified Lentz).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        (1.0 - front * h).max(0.0)
    }
}

/// The chi-square CDF with `k` degrees of freedom.
pub fn chi2_cdf(k: f64, x: f64) -> f64 {
    gamma_p(k / 2.0, x / 2.0)
}

/// The upper-`level` critical value of chi-square with `k` degrees of freedom.
pub fn chi2_critical(k: f64, level: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, k + 100.0 * (k + 10.0).sqrt() + 100.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if 1.0 - chi2_cdf(k, mid) > level {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The noncentral chi-square CDF (k degrees of freedom, noncentrality λ) as the
/// Poisson(λ/2) mixture of central ones.
pub fn noncentral_chi2_cdf(k: f64, lambda: f64, x: f64) -> f64 {
    let mu = lambda / 2.0;
    let top = (mu + 40.0 * mu.sqrt() + 60.0) as usize;
    let mut total = 0.0;
    for j in 0..=top {
        let log_w = -mu + j as f64 * mu.max(1e-300).ln() - ln_gamma(j as f64 + 1.0);
        let w = if mu == 0.0 {
            if j == 0 { 1.0 } else { 0.0 }
        } else {
            log_w.exp()
        };
        total += w * chi2_cdf(k + 2.0 * j as f64, x);
    }
    total
}

/// The smallest χ²-distance `χ²(p₁ ‖ p₀)` that Pearson's test with `bins` bins, `n`
/// draws and significance `level` rejects with probability ≥ `power` (noncentral
/// chi-square approximation).
pub fn detectable(bins: usize, n: usize, level: f64, power: f64) -> f64 {
    let k = (bins - 1) as f64;
    let crit = chi2_critical(k, level);
    let (mut lo, mut hi) = (0.0, 1.0);
    while 1.0 - noncentral_chi2_cdf(k, hi, crit) < power {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if 1.0 - noncentral_chi2_cdf(k, mid, crit) >= power {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi / n as f64
}

/// Pearson's statistic of `counts` against the expected probabilities `p` (every
/// bin's expected count must be ≥ 5 for the chi-square approximation).
pub fn pearson(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let total: f64 = p.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| {
            let e = n as f64 * pi / total;
            assert!(e >= 5.0, "a bin expects {e} < 5 draws: merge bins");
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Runs the test: panics naming `what` when Pearson's statistic exceeds the critical
/// value at `level`. Returns the statistic.
pub fn assert_fits(what: &str, counts: &[u64], p: &[f64], level: f64) -> f64 {
    let stat = pearson(counts, p);
    let crit = chi2_critical((counts.len() - 1) as f64, level);
    assert!(
        stat <= crit,
        "{what}: chi-square {stat} > critical {crit} at level {level} (counts {counts:?}, law {p:?})"
    );
    stat
}
