//! The verifier's own arithmetic: log-softmax, the top-k support, DPS-MOZO's
//! max-divergence constraint and its largest feasible λ, the normalised product of the
//! mixtures, and Rényi divergences between transcript laws. Written from the paper and
//! the mechanism's documentation ("Differentially private in-context learning via
//! sampling few-shot mixed with zero-shot outputs", arXiv 2501.19287, §4 and Alg. 1);
//! nothing here calls `privmix_mixing`, `privmix_renyi` or the mechanism's helpers.
//!
//! # Error bound (f64, log space)
//!
//! Every world the verifier builds keeps its finite logits within ±[`LOGIT_BOUND`] and
//! every λ ≤ [`LAMBDA_BOUND`], so a mixed logit `l₀ + λ(l₁ − l₀)` is at most
//! `M = 64 + 4·128 = 576` in magnitude. Each f64 operation is exact up to a relative
//! `u = 2⁻⁵³`; a mixed logit then carries an absolute error ≤ `3uM`, a log-sum-exp over
//! ≤ 4 terms (shifted by its maximum) ≤ `(3M + 8)u`, so a mixture's log-probability
//! ≤ `(6M + 8)u ≈ 3.9e-13`, and the normalised sum of ≤ 4 of them ≤ `8·(6M + 8)u + (4M +
//! 8)u ≈ 3.4e-12`. [`ETA_TOKEN`] = 1e-10 bounds it with a factor ≈ 30 to spare, and also
//! covers (i) the distance between this law and the mechanism's own f64 output vector,
//! which the verifier *checks* entry by entry (so the law the mechanism samples from is
//! within `ETA_TOKEN` of the numbers used here, whatever its own rounding), and (ii) the
//! bias of the integer sampler behind the demonstration draw (rand 0.9's single-range
//! method: each outcome's probability is within `r/2⁶⁴` of `1/r` for a range `r ≤ 8`, a
//! relative `< 2⁻⁵⁸` per index, `< 1e-16` in log per token for ≤ 3 draws).
//!
//! A token's law given the context is the uniform mixture over subsets
//! (`lse_S log out_S(x) − ln C`, error ≤ `ETA_TOKEN + 16u`), a transcript's
//! log-probability the sum over its ≤ 3 tokens (error ≤ `3·(ETA_TOKEN + 20u)`), and
//! [`renyi`] returns, beside `D_α`, a bound on its error from those and from its own
//! rounding: each term `α·lp + (1−α)·lq` is off by ≤ `(2α−1)η + 4uα(|lp| + |lq|)`, the
//! log-sum-exp over N terms adds ≤ `(N + 4)u`, and the result is divided by `α − 1`.
//! Assertions compare `D + error ≤ charge`.
//!
//! # The realised law (the token sampler's)
//!
//! [`realised_weights`] transcribes the weights `sample_log_index` documents (written
//! here from its documentation, not by calling it): with `L` the largest log-probability
//! and `δ = l − L` as a real number (`h = l − L` in f64 plus its TwoSum remainder `t`),
//! `ŵ = 0` for `l = −∞`, `ŵ = exp(−708)` (an f64, ≈ 3.3e-308) when `δ < −708`, else
//! `ŵ = e + e·t` with `e = exp(h)`; the token is drawn with probability exactly `ŵ/Σŵ`.
//! [`realised`] returns `ln ŵ − ln Σŵ` in f64: `ŵ ∈ [e^{−708}(1 − 2⁻⁵²), 1]` is normal, so
//! `ln ŵ` (|·| < 1024) is within one ulp ≤ `2⁻⁴³ = 1024u`, the f64 sum of ≤ 4 weights
//! within a relative `3u` (its logarithm, in `[0, ln 4]`, within `5.1u`), the difference
//! (|·| ≤ 710) within `710u`: `1740u`. The uniform mixture over subsets (`lse − ln C`)
//! adds at most `2·711u + 16u`, so [`ETA_REAL`] = 4096u bounds a token's error.

/// Largest finite logit magnitude any world may use (checked when rows are built).
pub const LOGIT_BOUND: f64 = 64.0;

/// Largest λ_max any configuration here uses.
pub const LAMBDA_BOUND: f64 = 4.0;

/// Stated bound on the absolute error of a per-subset, per-token log-probability (see the
/// module documentation).
pub const ETA_TOKEN: f64 = 1e-10;

/// Stated bound on the absolute error of a token's realised log-probability (module
/// documentation).
pub const ETA_REAL: f64 = 4096.0 * U;

/// Unit roundoff of f64.
pub const U: f64 = f64::EPSILON / 2.0;

/// The Rényi orders every check runs at.
pub const ORDERS: [f64; 6] = [1.5, 2.0, 4.0, 8.0, 16.0, 32.0];

/// `ln Σ exp(v)`, −∞ for an empty or all-(−∞) vector.
pub fn lse(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + v.iter().map(|&x| (x - m).exp()).sum::<f64>().ln()
}

/// `v − lse(v)`: normalised log-weights (−∞ entries stay −∞).
pub fn normalise(v: &[f64]) -> Vec<f64> {
    let z = lse(v);
    v.iter().map(|&x| x - z).collect()
}

/// The top-k support of the zero-shot logits: the `k` largest, ties to the smaller index
/// (the rule the mechanism documents), then without −∞ logits (zero public mass).
/// Returned in increasing index order: the law does not depend on the order.
pub fn support(zero: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..zero.len()).collect();
    idx.sort_by(|&i, &j| zero[j].partial_cmp(&zero[i]).unwrap().then(i.cmp(&j)));
    let mut s: Vec<usize> = idx
        .into_iter()
        .take(k)
        .filter(|&i| zero[i] != f64::NEG_INFINITY)
        .collect();
    s.sort_unstable();
    s
}

/// One demonstration's mixing problem on the support: zero-shot logits `l₀`, the shift
/// `t = l₁ − l₀` (None when the one-shot row has −∞ on the support: no λ > 0 keeps a
/// finite max divergence), and `A(0) = ln Σ exp l₀`.
pub struct Mix {
    l0: Vec<f64>,
    t: Option<Vec<f64>>,
    a0: f64,
}

impl Mix {
    /// On the support `k` of full-vocabulary rows.
    pub fn new(zero: &[f64], one: &[f64], k: &[usize]) -> Self {
        let l0: Vec<f64> = k.iter().map(|&i| zero[i]).collect();
        let l1: Vec<f64> = k.iter().map(|&i| one[i]).collect();
        let t = if l1.iter().all(|x| x.is_finite()) {
            Some(l1.iter().zip(&l0).map(|(a, b)| a - b).collect())
        } else {
            None
        };
        let a0 = lse(&l0);
        Mix { l0, t, a0 }
    }

    /// `Dsym_∞(m_λ, z) = max_x |r_λ(x)|` with `r_λ(x) = ln m_λ(x) − ln z(x)
    /// = λ·t(x) − (A(λ) − A(0))`, `A(λ) = ln Σ exp(l₀ + λt)`: the two max divergences
    /// `max r` and `max (−r)` at once.
    pub fn constraint(&self, lambda: f64) -> f64 {
        match &self.t {
            None => {
                if lambda == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            }
            Some(t) => {
                let shifted: Vec<f64> =
                    self.l0.iter().zip(t).map(|(l, t)| l + lambda * t).collect();
                let a = lse(&shifted) - self.a0;
                t.iter()
                    .map(|&tx| (lambda * tx - a).abs())
                    .fold(0.0, f64::max)
            }
        }
    }

    /// `ln m_λ` on the support.
    pub fn log_mixed(&self, lambda: f64) -> Vec<f64> {
        match &self.t {
            Some(t) if lambda != 0.0 => {
                let shifted: Vec<f64> =
                    self.l0.iter().zip(t).map(|(l, t)| l + lambda * t).collect();
                normalise(&shifted)
            }
            _ => normalise(&self.l0),
        }
    }

    /// The feasible interval's end by bisection: `(lo, hi)` with `constraint(lo) ≤ b`
    /// evaluated here, and `hi` either `upper` (when `lo = upper`) or a point found
    /// infeasible, `hi − lo` at f64 resolution. The constraint is non-decreasing in λ ≥ 0
    /// (an exponential family in λ: both `max r` and `max(−r)` are).
    pub fn largest(&self, bound: f64, upper: f64) -> (f64, f64) {
        if self.constraint(upper) <= bound {
            return (upper, upper);
        }
        let (mut lo, mut hi) = (0.0f64, upper);
        for _ in 0..2000 {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            if self.constraint(mid) <= bound {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo, hi)
    }

    /// Largest |logit| of the problem's mixed logits over `[0, upper]`: what the error
    /// bound's M must cover.
    pub fn magnitude(&self, upper: f64) -> f64 {
        let l0 = self.l0.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let t = self
            .t
            .as_ref()
            .map_or(0.0, |t| t.iter().fold(0.0f64, |m, x| m.max(x.abs())));
        l0 + upper * t
    }
}

/// The normalised product of mixtures on the support: `ln out = normalise(Σᵢ ln mᵢ)`.
pub fn product(log_mixtures: &[Vec<f64>]) -> Vec<f64> {
    let mut w = vec![0.0; log_mixtures[0].len()];
    for m in log_mixtures {
        for (wx, mx) in w.iter_mut().zip(m) {
            *wx += mx;
        }
    }
    normalise(&w)
}

/// The weights `ŵ` the token sampler draws in proportion to, for the log-probabilities
/// `log_probs` (module documentation: "The realised law"). At least one entry finite.
pub fn realised_weights(log_probs: &[f64]) -> Vec<f64> {
    let top = log_probs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert!(top.is_finite(), "no finite log-probability");
    let floor = (-708f64).exp();
    log_probs
        .iter()
        .map(|&l| {
            if l == f64::NEG_INFINITY {
                return 0.0;
            }
            let h = l - top;
            if h < -708.0 {
                return floor;
            }
            // Knuth's TwoSum: l + (−top) = h + t exactly.
            let bv = h - l;
            let av = h - bv;
            let t = (l - av) + (-top - bv);
            if h == -708.0 && t < 0.0 {
                return floor;
            }
            let e = h.exp();
            e + e * t
        })
        .collect()
}

/// `ln(ŵ/Σŵ)` of [`realised_weights`]: the log-probabilities the sampler realises (−∞
/// where `ŵ = 0`), each within [`ETA_REAL`]'s per-subset share.
pub fn realised(log_probs: &[f64]) -> Vec<f64> {
    let w = realised_weights(log_probs);
    let ln_total = w.iter().sum::<f64>().ln();
    w.iter()
        .map(|&x| {
            if x == 0.0 {
                f64::NEG_INFINITY
            } else {
                x.ln() - ln_total
            }
        })
        .collect()
}

/// `D_α(P ‖ Q)` for log-probability vectors over the same outcomes, with a bound on its
/// absolute error given that every log-probability is within `eta` of the truth (module
/// documentation). +∞ when P has mass where Q has none.
pub fn renyi(lp: &[f64], lq: &[f64], alpha: f64, eta: f64) -> (f64, f64) {
    let mut terms = Vec::with_capacity(lp.len());
    let mut rounding = 0.0f64;
    for (&p, &q) in lp.iter().zip(lq) {
        if p == f64::NEG_INFINITY {
            continue;
        }
        if q == f64::NEG_INFINITY {
            return (f64::INFINITY, 0.0);
        }
        terms.push(alpha * p + (1.0 - alpha) * q);
        rounding = rounding.max(4.0 * U * alpha * (p.abs() + q.abs()));
    }
    let value = lse(&terms) / (alpha - 1.0);
    let error = ((2.0 * alpha - 1.0) * eta + rounding + (terms.len() as f64 + 4.0) * U)
        / (alpha - 1.0)
        + 4.0 * U * value.abs();
    (value, error)
}

#[cfg(test)]
mod tests {}
