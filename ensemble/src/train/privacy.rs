//! The DP-SGD mechanism's pieces (Abadi et al. 2016, "Deep Learning with
//! Differential Privacy", Alg. 1, with Poisson sampling as analysed by
//! Mironov, Talwar & Zhang 2019): Poisson sampling, per-example clipping,
//! Gaussian noise on the clipped sum, and the accounting of ε through
//! `privmix-accountant`'s Poisson-subsampled Gaussian RDP.

use privmix_accountant::{
    EpsilonDelta, Orders, poisson_gaussian_sigma, poisson_subsampled_gaussian,
};
use rand::Rng;
use rand_distr::{Distribution, Normal};

use super::error::TrainError;

/// Poisson sampling: each of `n` examples is included independently with
/// probability `q` (one uniform draw per example, in index order). The
/// indices come out strictly increasing — an example is never drawn twice,
/// which the subsampled-Gaussian analysis requires (sampling with
/// replacement would break it).
pub fn poisson_sample(n: usize, q: f64, rng: &mut impl Rng) -> Vec<usize> {
    (0..n).filter(|_| rng.random::<f64>() < q).collect()
}

/// The Euclidean norm of `g`, accumulated in f64.
pub fn l2_norm(g: &[f32]) -> f64 {
    g.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

/// Clips `g` in place to L2 norm at most `clip` (`g · min(1, clip/‖g‖)`)
/// and returns the norm before clipping.
///
/// Guarantee: afterwards `l2_norm(g) ≤ clip` as evaluated — the factor is
/// shrunk by a relative 2⁻²⁰ until rounding to f32 cannot push it over — so
/// each example's contribution to the sum is bounded by `clip`, the
/// sensitivity the noise is calibrated to. A non-finite gradient is an error
/// (clipping NaN would not bound it).
pub fn clip_to_norm(g: &mut [f32], clip: f64) -> Result<f64, TrainError> {
    if !(clip > 0.0 && clip.is_finite()) {
        return Err(TrainError::bad(
            "clip_norm",
            format!("{clip} is not positive and finite"),
        ));
    }
    if g.iter().any(|x| !x.is_finite()) {
        return Err(TrainError::NonFinite("per-example gradient", 0));
    }
    let norm = l2_norm(g);
    if norm <= clip {
        return Ok(norm);
    }
    let original = g.to_vec();
    let mut factor = clip / norm;
    loop {
        for (x, &o) in g.iter_mut().zip(&original) {
            *x = (f64::from(o) * factor) as f32;
        }
        if l2_norm(g) <= clip {
            return Ok(norm);
        }
        factor *= 1.0 - f64::powi(2.0, -20);
    }
}

/// Adds i.i.d. `N(0, std²)` to every entry of `sum` (drawn from `rng`) and
/// divides by `expected_batch` (`q · n`, DP-SGD's normalisation by the
/// expected — not the realised — batch size, which would leak it).
pub fn privatize(
    sum: &mut [f32],
    std: f64,
    expected_batch: f64,
    rng: &mut impl Rng,
) -> Result<(), TrainError> {
    if !(std > 0.0 && std.is_finite()) {
        return Err(TrainError::bad(
            "noise std",
            format!("{std} is not positive and finite"),
        ));
    }
    let normal = Normal::new(0.0, std).map_err(|e| TrainError::bad("noise std", e.to_string()))?;
    if !(expected_batch > 0.0 && expected_batch.is_finite()) {
        return Err(TrainError::bad(
            "expected_batch",
            format!("{expected_batch}"),
        ));
    }
    for x in sum.iter_mut() {
        *x = ((f64::from(*x) + normal.sample(rng)) / expected_batch) as f32;
    }
    Ok(())
}

/// Which accountant gave a DP-SGD ε.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DpSgdAccountant {
    /// The Poisson-subsampled Gaussian RDP (Mironov, Talwar & Zhang, arXiv:1908.10530)
    /// converted at this Rényi order (Balle et al., arXiv:1905.09982, Thm 21).
    Rdp {
        /// The order of the conversion.
        order: f64,
    },
    /// The privacy-loss-distribution accountant (`privmix_accountant::pld`:
    /// pessimistic connect-the-dots discretisation, FFT composition, both
    /// neighbouring directions), as dp_accounting's PLD and Opacus' PRV accountants.
    Pld,
}

/// ε at δ for a DP-SGD run, with the accountant that gave it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpSgdEpsilon {
    /// The privacy-loss bound ε (rounded up).
    pub epsilon: f64,
    /// The failure probability δ.
    pub delta: f64,
    /// Which accountant's bound this is.
    pub accountant: DpSgdAccountant,
}

/// ε at `delta` after `steps` DP-SGD steps at sampling rate `q` and noise
/// multiplier `sigma` (noise std `sigma · C` for clip norm C), add/remove-one
/// adjacency: the smaller of two upper bounds, both rounded up —
/// the PLD accountant's and the Poisson-subsampled Gaussian RDP at
/// dp_accounting's default orders ([`dp_sgd_rdp_epsilon_at`]). The PLD bound is the
/// tighter one in every DP-SGD regime (as tight as dp_accounting's PLD and
/// Opacus' PRV accountants); the RDP bound is kept beside it because the minimum
/// of two valid bounds is valid.
pub fn dp_sgd_epsilon(
    q: f64,
    sigma: f64,
    steps: u64,
    delta: f64,
) -> Result<DpSgdEpsilon, TrainError> {
    let rdp = dp_sgd_rdp_epsilon_at(&Orders::dp_accounting_default(), q, sigma, steps, delta)?;
    let pld = privmix_accountant::dp_sgd_epsilon(sigma, q, steps, delta)?;
    Ok(if pld < rdp.epsilon {
        DpSgdEpsilon {
            epsilon: pld,
            delta,
            accountant: DpSgdAccountant::Pld,
        }
    } else {
        DpSgdEpsilon {
            epsilon: rdp.epsilon,
            delta,
            accountant: DpSgdAccountant::Rdp { order: rdp.order },
        }
    })
}

/// ε at `delta` by the RDP accountant alone, over the given orders: the
/// Poisson-subsampled Gaussian RDP (Mironov, Talwar & Zhang, arXiv:1908.10530),
/// composed `steps` times and converted (Balle et al., arXiv:1905.09982), all
/// rounded up by the accountant.
pub fn dp_sgd_rdp_epsilon_at(
    orders: &Orders,
    q: f64,
    sigma: f64,
    steps: u64,
    delta: f64,
) -> Result<EpsilonDelta, TrainError> {
    let per_step = poisson_subsampled_gaussian(orders, q, sigma)?;
    Ok(per_step.self_compose(steps).epsilon(delta)?)
}

/// Relative precision of [`dp_sgd_sigma`]'s search below the RDP calibration.
pub const SIGMA_REL_TOL: f64 = 1e-4;

/// The smallest noise multiplier σ (to a relative [`SIGMA_REL_TOL`]) for which
/// `steps` DP-SGD steps at rate `q` stay within (`epsilon`, `delta`) by
/// [`dp_sgd_epsilon`] (Opacus' `get_noise_multiplier`, with its PRV accountant).
///
/// Guarantee: `dp_sgd_epsilon(q, σ, steps, delta).epsilon ≤ epsilon` as
/// evaluated. The search starts from the RDP calibration (the accountant's
/// `poisson_gaussian_sigma` at dp_accounting's default orders), which is
/// feasible, and bisects below it on the PLD bound; it returns the smallest σ
/// evaluated feasible.
pub fn dp_sgd_sigma(epsilon: f64, delta: f64, steps: u64, q: f64) -> Result<f64, TrainError> {
    let rdp_sigma =
        poisson_gaussian_sigma(&Orders::dp_accounting_default(), q, steps, epsilon, delta)?;
    let feasible = |sigma: f64| -> Result<bool, TrainError> {
        Ok(dp_sgd_epsilon(q, sigma, steps, delta)?.epsilon <= epsilon)
    };
    // `hi` is always feasible as evaluated, `lo` infeasible (or the search's floor).
    let mut hi = rdp_sigma;
    let mut lo = rdp_sigma / 2.0;
    while feasible(lo)? {
        hi = lo;
        lo /= 2.0;
        if lo < rdp_sigma * 1e-3 {
            return Ok(hi);
        }
    }
    while hi - lo > SIGMA_REL_TOL * hi {
        let mid = 0.5 * (lo + hi);
        if feasible(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn clipping_keeps_short_gradients_and_scales_long_ones() {
        let mut g = vec![3.0f32, 4.0];
        assert_eq!(clip_to_norm(&mut g, 10.0).unwrap(), 5.0);
        assert_eq!(g, vec![3.0, 4.0]);
        assert_eq!(clip_to_norm(&mut g, 1.0).unwrap(), 5.0);
        assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
        assert!(clip_to_norm(&mut [f32::NAN], 1.0).is_err());
        assert!(clip_to_norm(&mut [1.0], 0.0).is_err());
    }

    /// 100 000 draws at rate 0.1: the count is Binomial(10⁵, 0.1), sd ≈ 95;
    /// 6 sd is 570. Indices strictly increase: no example twice.
    #[test]
    fn poisson_sampling_rate_and_no_repeats() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let s = poisson_sample(100_000, 0.1, &mut rng);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert!(s.len().abs_diff(10_000) < 570, "{}", s.len());
        assert!(poisson_sample(10, 0.0, &mut rng).is_empty());
        assert_eq!(poisson_sample(10, 1.0, &mut rng).len(), 10);
    }
}
