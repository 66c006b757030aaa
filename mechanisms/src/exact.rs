//! Exact output distributions, with every internal coin of a mechanism
//! integrated out: the ground truth of the property tests and of audits.
//!
//! PMixED's only randomness before sampling is Poisson subsampling, so its
//! token distribution is `Σ_S P(S)·out(S)` over all 2^N subsets S of members,
//! `P(S) = q^{|S|}(1 − q)^{N − |S|}`. Exponential in N: audits and tests only
//! (N ≤ [`MAX_EXACT_MEMBERS`]).

use crate::pmixed::{mixture_sum, solve_lambdas};
use crate::{Ensemble, MechanismError, Pmixed};

/// The largest ensemble [`pmixed_exact_output`] enumerates.
pub const MAX_EXACT_MEMBERS: usize = 20;

/// Every subset of `0..n` (as a bit mask) with its Poisson probability under
/// rate q, in increasing mask order. Probabilities sum to 1 up to rounding.
pub fn poisson_subsets(n: usize, q: f64) -> Result<Vec<(u32, f64)>, MechanismError> {
    if n > MAX_EXACT_MEMBERS {
        return Err(MechanismError::InvalidParameter {
            name: "members",
            value: n as f64,
            reason: "exact enumeration is limited to 20 members",
        });
    }
    crate::pmixed::bounds::check_probability("q", q)?;
    Ok((0..1u32 << n)
        .map(|mask| {
            let k = mask.count_ones() as i32;
            (mask, q.powi(k) * (1.0 - q).powi(n as i32 - k))
        })
        .collect())
}

/// The exact distribution of the token PMixED releases on `ensemble`: the
/// Poisson-weighted average, over every subset of members, of the output
/// distribution for that draw. Each member's λ is solved once (it depends
/// only on that member and p₀, exactly as in a step) and the mixtures are
/// averaged by the same routine the mechanism uses.
pub fn pmixed_exact_output(
    mechanism: &Pmixed,
    ensemble: &Ensemble,
) -> Result<Vec<f64>, MechanismError> {
    let n = ensemble.len();
    let config = mechanism.config();
    let subsets = poisson_subsets(n, config.q())?;
    let all: Vec<usize> = (0..n).collect();
    let lambdas: Vec<f64> = solve_lambdas(ensemble, &all, config.alpha_c(), config.radius())?
        .iter()
        .map(|s| s.lambda)
        .collect();
    let v = ensemble.vocab();
    let mut out = vec![0.0; v];
    let mut scratch = vec![0.0; v];
    for (mask, prob) in subsets {
        if prob == 0.0 {
            continue;
        }
        let drawn: Vec<usize> = (0..n).filter(|&i| mask >> i & 1 == 1).collect();
        if drawn.is_empty() {
            for (o, &p) in out.iter_mut().zip(ensemble.public()) {
                *o += prob * p;
            }
            continue;
        }
        let ls: Vec<f64> = drawn.iter().map(|&i| lambdas[i]).collect();
        mixture_sum(ensemble, &drawn, &ls, &mut scratch);
        let m = drawn.len() as f64;
        for (o, &s) in out.iter_mut().zip(&scratch) {
            *o += prob * (s / m);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PmixedConfig;

    #[test]
    fn full_sampling_equals_the_single_full_draw() {
        let e = Ensemble::from_probabilities(&[0.5, 0.3, 0.2], &[0.1, 0.2, 0.7, 0.6, 0.3, 0.1])
            .unwrap();
        let p = Pmixed::new(PmixedConfig::new(4.0, 0.2, 1.0).unwrap());
        let exact = pmixed_exact_output(&p, &e).unwrap();
        let direct = p.output_distribution(&e, &[0, 1]).unwrap().distribution;
        assert_eq!(exact, direct);
        let subsets = poisson_subsets(3, 0.3).unwrap();
        let total: f64 = subsets.iter().map(|s| s.1).sum();
        assert!((total - 1.0).abs() < 1e-15);
        assert!(poisson_subsets(21, 0.3).is_err());
        assert!(poisson_subsets(3, 1.3).is_err());
    }
}
