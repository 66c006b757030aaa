//! The f64 slack of an averaged release: how far the token law that PMixED, SubMix and
//! AdaPMixED's private answer *realise* (an f64 average of f64 mixture rows, sampled
//! exactly in proportion to its entries) can be from the real-arithmetic average of the
//! certified distributions that `proof.md` bounds, and what that adds to the charge.
//!
//! The argument is written out in `proof.md` beside this file (section "Rounding");
//! in short, with `u = 2⁻⁵³` and `γ_n = n·u/(1 − n·u)`:
//!
//! * every row of an [`Ensemble`](crate::Ensemble) (at most [`MAX_VOCAB`] entries) and
//!   every f64 mixture row formed from two of them has an exact mass within `1 ± ν`,
//!   `ν` = [`row_mass_deviation`];
//! * the sum of m such rows in f64, divided by m by [`average_in_place`], is the exact
//!   average times `1 + θₓ` per entry, `|θₓ| ≤ γ_m` (where a quotient would be
//!   subnormal, the sum is kept undivided: the sampler draws in proportion to the
//!   entries, so the law is the same up to that factor);
//! * so every probability of the realised token law lies within a factor `κ` of the
//!   ideal one, `ln κ` = [`averaging_log_ratio`], on each neighbouring dataset, and
//!   `D_α` of the realised laws exceeds that of the ideal ones by at most
//!   `(2α − 1)/(α − 1)·ln κ` = [`averaging_slack`].
//!
//! Every value is rounded up with `privmix_renyi::round`.

use privmix_renyi::round::{
    add_up, div_up, ln_1p_up, mul_up, sqrt_up, sub_down, sub_up, u64_up, usize_up,
};
use rayon::prelude::*;

/// The unit roundoff `u = 2⁻⁵³`.
const UNIT_ROUNDOFF: f64 = 1.0 / 9_007_199_254_740_992.0;

/// The largest vocabulary an [`Ensemble`](crate::Ensemble) accepts: 2²⁰ = 1 048 576
/// entries per row (four times the largest tokenizers in use). The mass bound
/// [`row_mass_deviation`], and with it every charge of PMixED, SubMix and AdaPMixED,
/// holds for rows up to this length.
pub const MAX_VOCAB: usize = 1 << 20;

/// `2⁻¹⁰⁷³`, four times the largest absolute error of one rounding into the subnormal
/// range (`2⁻¹⁰⁷⁵`).
const TINY: f64 = f64::from_bits(2);

/// `γ_n = n·u/(1 − n·u)` rounded up (`+∞` when `n·u ≥ 1`): the relative error bound of
/// n successive roundings (Higham, *Accuracy and Stability of Numerical Algorithms*,
/// 2nd ed., Lemma 3.1).
pub fn gamma_up(n: u64) -> f64 {
    let nu = mul_up(u64_up(n), UNIT_ROUNDOFF);
    if nu >= 1.0 {
        return f64::INFINITY;
    }
    div_up(nu, sub_down(1.0, nu))
}

/// `ν = γ_{2V+2} + V·2⁻¹⁰⁷³` at `V =` [`MAX_VOCAB`], rounded up (about `2.3·10⁻¹⁰`):
/// every ensemble row and every f64 mixture `fl(fl(λp) + fl(fl(1 − λ)·p₀))` of two
/// rows has an exact mass within `[1 − ν, 1 + ν]` (`proof.md`, "Rounding", step 1).
pub fn row_mass_deviation() -> f64 {
    let v = MAX_VOCAB as u64;
    add_up(gamma_up(2 * v + 2), mul_up(usize_up(MAX_VOCAB), TINY))
}

/// `ln((1 + x)/(1 − x)) = ln(1 + 2x/(1 − x))` rounded up, for `0 ≤ x < 1`.
fn log_ratio_up(x: f64) -> f64 {
    ln_1p_up(div_up(mul_up(2.0, x), sub_down(1.0, x)))
}

/// `ln κ = ln((1 + ν)/(1 − ν)) + ln((1 + γ_m)/(1 − γ_m))` rounded up, `ν` =
/// [`row_mass_deviation`], `m = members`: the realised token law of an f64 average of
/// at most `members` mixture rows is within a factor `κ` of the ideal average of
/// their certified distributions at every token (`proof.md`, "Rounding", step 2).
pub fn averaging_log_ratio(members: u64) -> f64 {
    add_up(
        log_ratio_up(row_mass_deviation()),
        log_ratio_up(gamma_up(members)),
    )
}

/// `(2α − 1)/(α − 1)·ln κ` rounded up, `ln κ` = [`averaging_log_ratio`]`(members)`:
/// what the f64 average of at most `members` mixture rows can add to `D_α` between the
/// token laws on two neighbouring datasets, both of them rounded (`proof.md`,
/// "Rounding", step 3). `+∞` for `α ≤ 1`.
pub fn averaging_slack(alpha: f64, members: u64) -> f64 {
    let am1 = sub_down(alpha, 1.0);
    if am1 <= 0.0 {
        return f64::INFINITY;
    }
    let coefficient = div_up(sub_up(mul_up(2.0, alpha), 1.0), am1);
    mul_up(coefficient, averaging_log_ratio(members))
}

/// `E = γ_{N+3}·(1 + ν) + √k·2⁻¹⁰⁷³` rounded up: a bound on the L2 distance between
/// AdaPMixED's f64 screening vector `fl((1/N)Σᵢ(λ_s pᵢ + (1 − λ_s)p₀))` on `k` indices
/// and the same average in real arithmetic of the f64 rows (`../adapmixed/proof.md`,
/// "Per-step losses against W").
pub fn screening_sum_error(members: usize, k: usize) -> f64 {
    let relative = mul_up(
        gamma_up(members as u64 + 3),
        add_up(1.0, row_mass_deviation()),
    );
    // 2⁻¹⁰⁷³ = 4·2⁻¹⁰⁷⁵: the absolute errors of the products and of the division.
    add_up(relative, mul_up(sqrt_up(usize_up(k)), TINY))
}

/// Divides the f64 sum of `m ≥ 1` mixture rows by m in place, unless some positive
/// entry is below `m·2⁻¹⁰²²` (its quotient would be subnormal, with an error that is
/// not relative): then the sum is left undivided. Either way every entry is the
/// exact sum times a factor within `[1 − u, 1 + u]` up to one common positive scale,
/// which is all the charge relies on (`proof.md`, "Rounding", step 2); the undivided
/// case sums to about m instead of 1.
pub(crate) fn average_in_place(values: &mut [f64], m: usize) {
    let mf = m as f64;
    // m·2⁻¹⁰²² is exact: m < 2⁵³ scaled by a power of two, in the normal range.
    let smallest = mf * f64::MIN_POSITIVE;
    if values.par_iter().any(|&s| s > 0.0 && s < smallest) {
        return;
    }
    values.par_iter_mut().for_each(|s| *s /= mf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_what_they_say() {
        assert_eq!(TINY, 2f64.powi(-1073));
        assert_eq!(UNIT_ROUNDOFF, 2f64.powi(-53));
    }

    #[test]
    fn gamma_and_mass_bound_match_their_closed_forms() {
        let u = 2f64.powi(-53);
        for n in [1u64, 3, 100, 1 << 21] {
            let exact = n as f64 * u / (1.0 - n as f64 * u);
            let got = gamma_up(n);
            assert!(got >= exact && got <= exact * (1.0 + 1e-15), "{n}: {got}");
        }
        assert_eq!(gamma_up(1 << 53), f64::INFINITY);
        let nu = row_mass_deviation();
        let v = MAX_VOCAB as f64;
        let exact = (2.0 * v + 2.0) * u / (1.0 - (2.0 * v + 2.0) * u);
        assert!(nu >= exact && nu <= exact * (1.0 + 1e-12), "{nu}");
        assert!((2.3e-10..2.4e-10).contains(&nu), "{nu}");
    }

    #[test]
    fn slack_matches_its_closed_form() {
        let nu = row_mass_deviation();
        for (alpha, m) in [(2.0f64, 100u64), (1.25, 1), (18.0, 7), (1.0001, 1000)] {
            let g = gamma_up(m);
            // ln((1 + x)/(1 − x)) = ln(1 + x) − ln(1 − x), without the cancellation of 1 ± x.
            let ln_kappa = nu.ln_1p() - (-nu).ln_1p() + g.ln_1p() - (-g).ln_1p();
            let exact = (2.0 * alpha - 1.0) / (alpha - 1.0) * ln_kappa;
            let got = averaging_slack(alpha, m);
            assert!(
                got >= exact * (1.0 - 1e-9) && got <= exact * (1.0 + 1e-9),
                "{alpha} {m}: {got} vs {exact}"
            );
        }
        // Non-decreasing in the number of members, non-increasing in the order.
        assert!(averaging_slack(2.0, 1000) > averaging_slack(2.0, 10));
        assert!(averaging_slack(4.0, 10) < averaging_slack(2.0, 10));
        assert_eq!(averaging_slack(1.0, 10), f64::INFINITY);
    }

    #[test]
    fn the_average_divides_unless_a_quotient_would_be_subnormal() {
        let mut v = vec![0.3, 0.0, 0.9];
        average_in_place(&mut v, 3);
        assert_eq!(v, vec![0.3 / 3.0, 0.0, 0.9 / 3.0]);
        // 2⁻¹⁰²¹ / 3 is subnormal: the sum stays as it is.
        let tiny = 2f64.powi(-1021);
        let mut w = vec![1.0, tiny, 0.0];
        average_in_place(&mut w, 3);
        assert_eq!(w, vec![1.0, tiny, 0.0]);
        // Exactly m·2⁻¹⁰²²: the quotient is 2⁻¹⁰²², normal.
        let mut x = vec![1.0, 3.0 * f64::MIN_POSITIVE];
        average_in_place(&mut x, 3);
        assert_eq!(x, vec![1.0 / 3.0, f64::MIN_POSITIVE]);
    }

    #[test]
    fn screening_error_matches_its_closed_form() {
        let (n, k) = (100usize, 16usize);
        let exact = gamma_up(103) * (1.0 + row_mass_deviation()) + 4.0 * 2f64.powi(-1073);
        let got = screening_sum_error(n, k);
        assert!(got >= exact && got <= exact * (1.0 + 1e-14), "{got}");
    }
}
