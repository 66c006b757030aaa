//! The DP-SGD mechanism's pieces (Abadi et al. 2016, "Deep Learning with
//! Differential Privacy", Alg. 1, with Poisson sampling as analysed by
//! Mironov, Talwar & Zhang 2019): Poisson sampling, per-example clipping,
//! Gaussian noise on the clipped sum, and the accounting of ε through
//! `privmix-accountant`.
//!
//! The coins are floating-point safe (proof in `privacy.md`): the Poisson draw
//! is an exact Bernoulli(q) per example and the noise is the exact discrete
//! Gaussian on a grid, both from `privmix_mechanisms::noise`; the clipped
//! gradients are rounded to the grid and summed as integers, and the accountant
//! is that of the discrete Gaussian (the Poisson-subsampled RDP of a mechanism
//! whose RDP is at most the Gaussian's, for the sensitivity enlarged by the
//! rounding).

use privmix_accountant::{EpsilonDelta, Orders, RdpCurve, gaussian, poisson_gaussian_sigma};
use privmix_mechanisms::noise::{
    gaussian_on_grid, round_to_grid, rounded_l2_sensitivity, sample_bernoulli,
};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use super::error::TrainError;

/// Poisson sampling: each of `n` examples is included independently with
/// probability exactly `q` (an exact Bernoulli(q) per example, in index order:
/// `privmix_mechanisms::noise::sample_bernoulli`, which compares a uniform real
/// with `q` bit by bit, so that `P(included) = q` as a real number for every
/// f64 `q` — `u < q` with a 53-bit `u` realises `⌈q·2⁵³⌉/2⁵³` instead). The
/// indices come out strictly increasing — an example is never drawn twice,
/// which the subsampled-Gaussian analysis requires.
///
/// Errors: `q` NaN or outside [0, 1].
pub fn poisson_sample(
    n: usize,
    q: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<Vec<usize>, TrainError> {
    let mut picked = Vec::new();
    for i in 0..n {
        if sample_bernoulli(q, &mut *rng)
            .map_err(|e| TrainError::bad("sampling_rate", e.public_description()))?
        {
            picked.push(i);
        }
    }
    Ok(picked)
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

/// The grid is chosen so that the rounding adds at most `C·2^-GRID_BITS` to the
/// sensitivity: `√len·g ≤ C·2^-GRID_BITS`.
pub const GRID_BITS: i32 = 16;

/// Coordinates per independent noise stream (see [`DpSgdNoise::release`]).
const NOISE_CHUNK: usize = 4096;

/// DP-SGD's noise: the exact discrete Gaussian on a grid of granularity `g` (a
/// power of two), for `len` coordinates, clip norm C and noise multiplier σ.
///
/// Each clipped gradient is rounded to the grid ([`Self::to_grid`]) and the
/// rounded gradients are summed as integers, exactly. One example then moves the
/// integer sum by its rounded gradient, whose L2 norm is at most
/// [`Self::sensitivity`] `Δ' = C + √len·g` (`rounded_l2_sensitivity`: each
/// coordinate moves by at most g/2 in the rounding, and the bound is enforced
/// exactly on the integers). The noise on each coordinate is a discrete Gaussian
/// with parameter `σ·Δ'` (value units), so the noise multiplier relative to the
/// enlarged sensitivity is σ and the accountant is called with σ
/// ([`dp_sgd_epsilon`]): the rounding is paid for in noise, not in ε.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpSgdNoise {
    clip: f64,
    len: usize,
    granularity: f64,
    sensitivity: f64,
    std: f64,
    /// `⌊Δ'/g⌋`: the bound on a rounded gradient's norm, in grid units.
    radius: u64,
}

impl DpSgdNoise {
    /// The noise for `len` coordinates, clip norm `clip` and noise multiplier
    /// `noise_multiplier`, on the largest power-of-two grid with
    /// `√len·g ≤ clip·2^-GRID_BITS`.
    pub fn new(clip: f64, noise_multiplier: f64, len: usize) -> Result<Self, TrainError> {
        positive("clip_norm", clip)?;
        let root = (len.max(1) as f64).sqrt().next_up();
        // The largest power of two ≤ clip·2^-GRID_BITS/√len (rounded down).
        let target = (clip / root).next_down() * f64::powi(2.0, -GRID_BITS);
        if !(target.is_normal() && target > 0.0) {
            return Err(TrainError::bad(
                "clip_norm",
                format!("{clip} leaves no grid for {len} coordinates"),
            ));
        }
        let granularity = f64::from_bits(target.to_bits() & !((1u64 << 52) - 1));
        Self::with_granularity(clip, noise_multiplier, len, granularity)
    }

    /// The same on the grid `granularity` (a positive normal power of two).
    pub fn with_granularity(
        clip: f64,
        noise_multiplier: f64,
        len: usize,
        granularity: f64,
    ) -> Result<Self, TrainError> {
        positive("clip_norm", clip)?;
        positive("noise_multiplier", noise_multiplier)?;
        privmix_mechanisms::noise::check_granularity(granularity)
            .map_err(|e| TrainError::bad("granularity", e.public_description()))?;
        let sensitivity = rounded_l2_sensitivity(clip, len, granularity);
        let std = (noise_multiplier * sensitivity).next_up();
        let radius = (sensitivity / granularity).floor();
        if !(std.is_finite() && radius < 2f64.powi(62)) {
            return Err(TrainError::bad(
                "granularity",
                format!("{granularity} is too fine for clip norm {clip}"),
            ));
        }
        Ok(Self {
            clip,
            len,
            granularity,
            sensitivity,
            std,
            radius: radius as u64,
        })
    }

    /// The grid's granularity g.
    pub fn granularity(&self) -> f64 {
        self.granularity
    }

    /// The L2 sensitivity of the integer sum to one example, in value units:
    /// `C + √len·g`, rounded up — the clip norm enlarged by the rounding.
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }

    /// The noise's parameter (value units): `σ·`[`Self::sensitivity`], rounded up.
    pub fn std(&self) -> f64 {
        self.std
    }

    /// `g` rounded to the grid (`round(g_j/g)`, halves away from zero), then,
    /// if the integer vector's norm exceeds `⌊Δ'/g⌋` (it cannot for a gradient
    /// clipped to C as evaluated, by a margin of `√len/2` grid units; this makes
    /// the bound exact whatever the f64 evaluation of the norm), scaled by
    /// `⌊Δ'/g⌋/⌈‖r‖⌉` with truncation toward zero.
    ///
    /// Guarantee: `Σ r_j² ≤ ⌊Δ'/g⌋²`, computed exactly on integers.
    ///
    /// Errors: a length other than `len`, a non-finite entry, an entry (or a norm)
    /// too large for the grid (2⁶² grid units; a clipped gradient never is).
    pub fn to_grid(&self, g: &[f32]) -> Result<Vec<i64>, TrainError> {
        if g.len() != self.len {
            return Err(TrainError::bad(
                "gradient",
                format!("{} entries, the noise was set up for {}", g.len(), self.len),
            ));
        }
        let mut r = Vec::with_capacity(g.len());
        for &x in g {
            if !x.is_finite() {
                return Err(TrainError::NonFinite("per-example gradient", 0));
            }
            let v = round_to_grid(f64::from(x), self.granularity).map_err(|_| {
                TrainError::bad("gradient", "too large for the grid: clip it first")
            })?;
            r.push(v);
        }
        let norm2 = r
            .iter()
            .try_fold(0u128, |acc, &v| {
                acc.checked_add((v.unsigned_abs() as u128).pow(2))
            })
            .ok_or_else(|| TrainError::bad("gradient", "too large for the grid: clip it first"))?;
        let k = u128::from(self.radius);
        if norm2 > k * k {
            let n = ceil_sqrt(norm2);
            for v in &mut r {
                *v = (i128::from(*v) * k as i128 / n as i128) as i64;
            }
        }
        Ok(r)
    }

    /// `sum += r`, exactly (errors past the i64 range, which grid sums of
    /// 2⁶² / ⌊Δ'/g⌋ examples cannot reach).
    pub fn accumulate(&self, sum: &mut [i64], r: &[i64]) -> Result<(), TrainError> {
        if sum.len() != r.len() {
            return Err(TrainError::bad("gradient", "length mismatch"));
        }
        for (s, &x) in sum.iter_mut().zip(r) {
            *s = s
                .checked_add(x)
                .ok_or_else(|| TrainError::bad("gradient", "the grid sum overflows"))?;
        }
        Ok(())
    }

    /// The noised sum in value units, `g·(R_j + Z_j)` as f64, `Z_j` i.i.d.
    /// discrete Gaussian with parameter `std/g` grid units
    /// (`privmix_mechanisms::noise::gaussian_on_grid`, exact). The coordinates
    /// are drawn in chunks of 4096, each from its own ChaCha20 stream seeded with
    /// 256 bits of `rng` (in order, so a seeded run is reproducible), in parallel.
    ///
    /// Errors: a sum of magnitude 2⁵³ grid units or more.
    pub fn noised_sum(
        &self,
        sum: &[i64],
        rng: &mut (impl RngCore + ?Sized),
    ) -> Result<Vec<f64>, TrainError> {
        const EXACT: i64 = 1 << 53;
        let query = sum
            .iter()
            .map(|&v| {
                if v.unsigned_abs() < EXACT as u64 {
                    Ok(v as f64 * self.granularity)
                } else {
                    Err(TrainError::bad(
                        "gradient",
                        "the grid sum reaches 2^53 units",
                    ))
                }
            })
            .collect::<Result<Vec<f64>, _>>()?;
        let seeds: Vec<[u8; 32]> = (0..query.len().div_ceil(NOISE_CHUNK))
            .map(|_| {
                let mut seed = [0u8; 32];
                rng.fill_bytes(&mut seed);
                seed
            })
            .collect();
        let chunks = query
            .par_chunks(NOISE_CHUNK)
            .zip(seeds.par_iter())
            .map(|(q, seed)| {
                let mut stream = ChaCha20Rng::from_seed(*seed);
                gaussian_on_grid(q, self.std, self.granularity, &mut stream)
                    .map_err(|e| TrainError::bad("noise", e.public_description()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(chunks.concat())
    }

    /// The privatised mean: [`Self::noised_sum`] divided by `expected_batch` (`q·n`,
    /// DP-SGD's normalisation by the expected — not the realised — batch size,
    /// which would leak it) and rounded to f32. Both steps are post-processing of
    /// the exact integer `R + Z`.
    pub fn release(
        &self,
        sum: &[i64],
        expected_batch: f64,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Result<Vec<f32>, TrainError> {
        positive("expected_batch", expected_batch)?;
        Ok(self
            .noised_sum(sum, rng)?
            .into_iter()
            .map(|x| (x / expected_batch) as f32)
            .collect())
    }

    /// The clip norm C.
    pub fn clip(&self) -> f64 {
        self.clip
    }
}

/// `⌈√n⌉`, exactly.
fn ceil_sqrt(n: u128) -> u128 {
    let mut x = (n as f64).sqrt() as u128;
    while x * x > n {
        x -= 1;
    }
    while x * x < n {
        x += 1;
    }
    x
}

fn positive(name: &'static str, v: f64) -> Result<(), TrainError> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(TrainError::bad(
            name,
            format!("{v} is not positive and finite"),
        ))
    }
}

/// Which accountant gave a DP-SGD ε.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DpSgdAccountant {
    /// The Poisson-subsampled RDP of the discrete Gaussian ([`dp_sgd_rdp_curve`])
    /// converted at this Rényi order (Balle et al., arXiv:1905.09982, Thm 21).
    Rdp {
        /// The order of the conversion.
        order: f64,
    },
    /// The privacy-loss-distribution accountant of the continuous Gaussian. No
    /// longer used: the noise is the discrete Gaussian, whose multivariate privacy
    /// loss the continuous PLD does not bound (see `privacy.md`); kept so that
    /// code matching on the enum still builds.
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
/// multiplier `sigma` (the noise parameter over the sensitivity
/// [`DpSgdNoise::sensitivity`]), add/remove-one adjacency: the RDP bound of
/// [`dp_sgd_rdp_epsilon_at`] at dp_accounting's default orders (plus every
/// integer order up to the largest, where the subsampling bound is tight).
///
/// This is the accountant of what [`DpSgdNoise`] implements, the discrete
/// Gaussian: unlike the continuous Gaussian's, its multivariate privacy loss is
/// not a function of the shift's norm alone, so the PLD accountant of the
/// continuous mechanism is not used (`privacy.md`).
pub fn dp_sgd_epsilon(
    q: f64,
    sigma: f64,
    steps: u64,
    delta: f64,
) -> Result<DpSgdEpsilon, TrainError> {
    let rdp = dp_sgd_rdp_epsilon_at(&Orders::dp_accounting_default(), q, sigma, steps, delta)?;
    Ok(DpSgdEpsilon {
        epsilon: rdp.epsilon,
        delta,
        accountant: DpSgdAccountant::Rdp { order: rdp.order },
    })
}

/// Largest integer order added to the orders of [`dp_sgd_rdp_curve`].
const MAX_INTEGER_ORDER: u32 = 1024;

/// The RDP curve of one DP-SGD step with the discrete Gaussian noise, over
/// `orders` and every integer order from 2 to the largest of them (at most 1024):
/// the accountant's Poisson amplification (`RdpCurve::poisson_subsampled`, Zhu &
/// Wang, ICML 2019, Thm 6, at integer orders; convex interpolation between them)
/// of the curve `α/(2σ²)` (`privmix_accountant::gaussian` at sensitivity 1), which
/// bounds the discrete Gaussian's RDP at every order (Canonne, Kamath & Steinke,
/// arXiv:2004.00010). At integer orders the bound equals the exact moment of the
/// sampled continuous Gaussian (Mironov, Talwar & Zhang, arXiv:1908.10530).
pub fn dp_sgd_rdp_curve(orders: &Orders, q: f64, sigma: f64) -> Result<RdpCurve, TrainError> {
    let top = orders
        .as_slice()
        .last()
        .map_or(2.0, |&a| a.min(f64::from(MAX_INTEGER_ORDER)));
    let mut all = orders.as_slice().to_vec();
    all.extend((2..=top.floor() as u32).map(f64::from));
    let all = Orders::new(all)?;
    Ok(gaussian(&all, sigma, 1.0)?.poisson_subsampled(q)?)
}

/// ε at `delta` by the RDP accountant over the given orders (and the integers
/// [`dp_sgd_rdp_curve`] adds): one step's [`dp_sgd_rdp_curve`], composed `steps`
/// times and converted (Balle et al., arXiv:1905.09982), all rounded up by the
/// accountant.
pub fn dp_sgd_rdp_epsilon_at(
    orders: &Orders,
    q: f64,
    sigma: f64,
    steps: u64,
    delta: f64,
) -> Result<EpsilonDelta, TrainError> {
    Ok(dp_sgd_rdp_curve(orders, q, sigma)?
        .self_compose(steps)
        .epsilon(delta)?)
}

/// Relative precision of [`dp_sgd_sigma`]'s search.
pub const SIGMA_REL_TOL: f64 = 1e-4;

/// The smallest noise multiplier σ (to a relative [`SIGMA_REL_TOL`]) for which
/// `steps` DP-SGD steps at rate `q` stay within (`epsilon`, `delta`) by
/// [`dp_sgd_epsilon`] (Opacus' `get_noise_multiplier`, with this accountant).
///
/// Guarantee: `dp_sgd_epsilon(q, σ, steps, delta).epsilon ≤ epsilon` as
/// evaluated. The search starts from the accountant's `poisson_gaussian_sigma`
/// at dp_accounting's default orders, doubles it until feasible (the integer
/// orders' interpolation can be a little looser at fractional orders), and
/// bisects; it returns the smallest σ evaluated feasible.
pub fn dp_sgd_sigma(epsilon: f64, delta: f64, steps: u64, q: f64) -> Result<f64, TrainError> {
    let start = poisson_gaussian_sigma(&Orders::dp_accounting_default(), q, steps, epsilon, delta)?;
    let feasible = |sigma: f64| -> Result<bool, TrainError> {
        Ok(dp_sgd_epsilon(q, sigma, steps, delta)?.epsilon <= epsilon)
    };
    // `hi` is always feasible as evaluated, `lo` infeasible (or the search's floor).
    let mut hi = start;
    let mut doublings = 0;
    while !feasible(hi)? {
        hi *= 2.0;
        doublings += 1;
        if doublings > 60 {
            return Err(TrainError::bad(
                "epsilon",
                format!("no noise multiplier reaches ε = {epsilon} at δ = {delta}"),
            ));
        }
    }
    let mut lo = hi / 2.0;
    while feasible(lo)? {
        hi = lo;
        lo /= 2.0;
        if lo < start * 1e-3 {
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
        let s = poisson_sample(100_000, 0.1, &mut rng).unwrap();
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert!(s.len().abs_diff(10_000) < 570, "{}", s.len());
        assert!(poisson_sample(10, 0.0, &mut rng).unwrap().is_empty());
        assert_eq!(poisson_sample(10, 1.0, &mut rng).unwrap().len(), 10);
        assert!(poisson_sample(10, 1.5, &mut rng).is_err());
    }
}
