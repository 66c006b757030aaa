//! The construction pass of [`super::fast::RatioTable`]: writes the ratios `r = p/q`,
//! their extremes, and the four sums of both directions at λ = 1 (where `t = r`), so
//! that a solve's first probe, λ = 1, costs no further pass whatever the ratios' range.
//!
//! The λ = 1 sums `Σ q·r^k`, `Σ q·r^{k−1}·d`, `Σ q·r·r^{−k}`, `Σ q·r^{−k}·d` (`d = r − 1`)
//! are kept scaled by powers of two chosen from the running extremes of r: the forward
//! terms use `x = r·2^{−E}` with `2^E` at least every ratio seen so far, the reverse terms
//! `z = r·2^{−F}` with `2^F` at most every positive ratio seen so far, so every
//! `x^k ≤ 1` and every `z^{−k} ≤ 1`: nothing overflows. When a block of ratios leaves
//! `[2^F, 2^E]`, `E` (or `F`) moves to the block's extreme and the sums kept so far are
//! multiplied by the matching power of two. Scaling by a power of two is exact wherever
//! the result is a normal number, so the scaled sums are the unscaled ones times
//! `2^{−Ek}` (forward) and `2^{Fk}` (reverse), up to the roundings of results that fall
//! below `2^{−1022}`: the caller accepts them only where each scaled value sum is at least
//! [`MIN_SCALED_SUM`], which makes those roundings negligible (`proof.md` beside this
//! file, P5).
//!
//! Scales move only for orders up to [`SCALED_MAX_ORDER`], where the largest scaled
//! term is provably far above [`MIN_SCALED_SUM`]; above it both scales stay 1 and the
//! sums are the unscaled ones, trusted by the caller only where the ratios' range keeps
//! them representable.

use crate::kernel::powi_u32;

/// Largest order whose λ = 1 sums are scaled. At the ratio attaining a scale, the scaled
/// term is at least `RATIO_PATH_MIN·2^{−k} ≥ 2^{−498−256} = 2^{−754}`, far above
/// [`MIN_SCALED_SUM`].
pub(super) const SCALED_MAX_ORDER: u32 = 256;

/// Smallest scaled value sum (`Σ q·x^k`, `Σ q·r·z^{−k}`) the caller accepts: results
/// below `2^{−1022}` are rounded to multiples of `2^{−1074}`, and each of the pass's
/// operations adds at most `2^{−1075}` of such error, so a sum of at least `2^{−900}`
/// carries at most `2^{−175}` relative error per operation from them.
pub(super) const MIN_SCALED_SUM: f64 = f64::from_bits((1023 - 900) << 52);

/// Vectors per block: independent power chains that hide the multiplications' latency.
const U: usize = 4;

/// How far ahead of the pass `p` is prefetched, in entries (8 KB: about the DRAM
/// latency's worth of the pass's arithmetic, with room). Prefetching in the pass
/// instead of a separate warming loop before it overlaps the row's fetch with the
/// pass's arithmetic.
const AHEAD: usize = 1024;

/// The pass as a `pulp` operation (see the module docs).
///
/// Two variants. The quick one (`careful = false`) assumes q > 0 everywhere: it
/// divides without masks, and `check` (the sum of the ratios) comes out non-finite
/// exactly when some `q_x = 0` (a ratio `p/0` is `+∞` or NaN; every other ratio is at
/// most `1/RATIO_PATH_MIN`), in which case the caller runs the careful one, which
/// masks those entries (`r = 1`, weight 0, excluded from the extremes) and sums the
/// mass of p there.
pub(super) struct Ratios<'a> {
    pub(super) p: &'a [f64],
    pub(super) q: &'a [f64],
    pub(super) r: &'a mut [f64],
    pub(super) k: u32,
    pub(super) careful: bool,
}

/// What [`Ratios`] returns.
pub(super) struct PassOut {
    /// Smallest and largest ratio on q's support.
    pub(super) r_min: f64,
    pub(super) r_max: f64,
    /// `Σ p` where `q = 0` (careful pass only).
    pub(super) off: f64,
    /// `Σ r` (quick pass only): non-finite exactly when some `q = 0`.
    pub(super) check: f64,
    pub(super) at_one: AtOneSums,
}

/// The λ = 1 sums and their scales.
pub(super) struct AtOneSums {
    /// `[Σ q·x^{k−1}·x, Σ q·x^{k−1}·d, Σ q·z^{−k}·r, Σ q·z^{−k}·d]`.
    pub(super) sums: [f64; 4],
    /// `E` and `F`: the forward sums are the unscaled ones times `2^{−Ek}` (the first)
    /// and `2^{−E(k−1)}` (the second), the reverse ones times `2^{Fk}`.
    pub(super) e_hi: i32,
    pub(super) e_lo: i32,
    /// Some ratio was not a positive normal number or 0 (only in a quick pass that
    /// met `q = 0`, which the caller discards): the sums mean nothing.
    pub(super) failed: bool,
}

impl AtOneSums {
    /// The unscaled sums `[Σ q·r^k, Σ q·r^{k−1}·d, Σ q·r^{1−k}, Σ q·r^{−k}·d]`: exact
    /// multiples of the scaled ones where everything stays normal.
    pub(super) fn unscaled(&self, k: u32) -> [f64; 4] {
        let (k, e, f) = (i64::from(k), i64::from(self.e_hi), i64::from(self.e_lo));
        let [a, b, c, d] = self.sums;
        [
            scale2(a, e * k),
            scale2(b, e * (k - 1)),
            scale2(c, -f * k),
            scale2(d, -f * k),
        ]
    }
}

/// `x·2^n`, as two multiplications by powers of two (each representable for
/// `|n| ≤ 2044`; beyond, the result is 0 or ±∞ as the exact value's rounding would be).
fn scale2(x: f64, n: i64) -> f64 {
    let n = n.clamp(-2200, 2100);
    let half = n / 2;
    x * pow2(half) * pow2(n - half)
}

/// `2^n`, exactly: 0 below `2^{−1074}`, `+∞` above `2^{1023}`.
pub(super) fn pow2(n: i64) -> f64 {
    if n > 1023 {
        f64::INFINITY
    } else if n >= -1022 {
        f64::from_bits(((n + 1023) as u64) << 52)
    } else if n >= -1074 {
        f64::from_bits(1u64 << (n + 1074))
    } else {
        0.0
    }
}

/// The binary exponent of a positive normal `m`: `⌊log₂ m⌋`, and whether `m` is a power
/// of two.
fn exponent(m: f64) -> (i32, bool) {
    let bits = m.to_bits();
    (
        ((bits >> 52) & 0x7ff) as i32 - 1023,
        bits & ((1 << 52) - 1) == 0,
    )
}

/// `log₂` of the headroom every scaled power may take: `x^k ≤ 2^{HEADROOM}` and
/// `z^{−k} ≤ 2^{HEADROOM}`, so that every term, and every sum of fewer than `2^{120}` of
/// them, stays finite even multiplied by a ratio (`≤ 2^{499}`).
const HEADROOM: u32 = 400;

/// The running scales: `E ≥ 0` with every ratio seen at most `2^{E+G}`, `F ≤ 0` with
/// every positive ratio seen at least `2^{F−G}`, where `G = ⌊HEADROOM/k⌋` lets the
/// powers use the headroom. Both start at 0, where the scaled sums are the unscaled
/// ones; they move only where a ratio leaves `[2^{F−G}, 2^{E+G}]`.
struct Scales {
    k: u32,
    /// `⌊HEADROOM/k⌋`.
    g: i32,
    /// Whether the scales may move (orders up to [`SCALED_MAX_ORDER`]).
    moving: bool,
    e_hi: i32,
    e_lo: i32,
    failed: bool,
    /// Some ratio is 0 (p = 0 < q): the reverse sums are not needed (the reverse
    /// divergence at λ = 1 is `+∞`) and `F` stops moving.
    zero: bool,
}

/// What the sums kept so far are multiplied by when the scales move.
struct Rescale {
    forward: [f64; 2],
    reverse: f64,
}

impl Scales {
    fn new(k: u32) -> Self {
        Scales {
            k,
            g: (HEADROOM / k) as i32,
            moving: k <= SCALED_MAX_ORDER,
            e_hi: 0,
            e_lo: 0,
            failed: false,
            zero: false,
        }
    }

    /// Ratios above this move `E`.
    fn hi_threshold(&self) -> f64 {
        if self.failed || !self.moving {
            f64::INFINITY
        } else {
            pow2((self.e_hi + self.g).into())
        }
    }

    /// Positive ratios below this move `F` (0: nothing does).
    fn lo_threshold(&self) -> f64 {
        if self.failed || self.zero || !self.moving {
            0.0
        } else {
            pow2((self.e_lo - self.g).into())
        }
    }

    /// `2^{−E}` and `2^{−F}`.
    fn inverses(&self) -> (f64, f64) {
        (pow2((-self.e_hi).into()), pow2((-self.e_lo).into()))
    }

    /// `2^{(E−F)(k−1)}` where one power chain serves both directions: with
    /// `(E−F+G)(k−1) ≤ 1022` every power of `x ∈ [2^{F−G−E}, 2^G]` up to `x^{k−1}` is
    /// normal and every power of `z ∈ [2^{−G}, 2^{E+G−F}]` finite and normal, so
    /// `z^{k−1}` is exactly `x^{k−1}` times it (binary powering rounds the same at every
    /// scale of the normal range).
    fn chain_factor(&self) -> Option<f64> {
        let k1 = i64::from(self.k - 1);
        let span = i64::from(self.e_hi - self.e_lo);
        ((span + i64::from(self.g)) * k1 <= 1022).then(|| pow2(span * k1))
    }

    /// Moves the scales to cover `max` and `min` (a block's extremes), returning the
    /// factors for the sums kept so far.
    fn widen(&mut self, max: f64, min: f64) -> Rescale {
        let k = i64::from(self.k);
        let mut out = Rescale {
            forward: [1.0; 2],
            reverse: 1.0,
        };
        if max > self.hi_threshold() {
            if max.is_finite() {
                // The least E with max ≤ 2^{E+G}.
                let (e, exact) = exponent(max);
                let e = if exact { e } else { e + 1 } - self.g;
                let shift = i64::from(e - self.e_hi);
                out.forward = [pow2(-shift * k), pow2(-shift * (k - 1))];
                self.e_hi = e;
            } else {
                self.failed = true;
            }
        }
        if min < self.lo_threshold() {
            if min == 0.0 {
                self.zero = true;
            } else if min >= f64::MIN_POSITIVE {
                // The greatest F with 2^{F−G} ≤ min.
                let f = exponent(min).0 + self.g;
                out.reverse = pow2(-i64::from(self.e_lo - f) * k);
                self.e_lo = f;
            } else {
                self.failed = true;
            }
        }
        if max.is_nan() || min.is_nan() {
            self.failed = true;
        }
        out
    }
}

impl pulp::WithSimd for Ratios<'_> {
    type Output = PassOut;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> PassOut {
        let Ratios {
            p,
            q,
            r,
            k,
            careful,
        } = self;
        let (pv, p_tail) = S::as_simd_f64s(p);
        let (qv, q_tail) = S::as_simd_f64s(q);
        let (rv, r_tail) = S::as_mut_simd_f64s(r);
        let (zero, one) = (simd.splat_f64s(0.0), simd.splat_f64s(1.0));
        let (inf, neg_inf) = (
            simd.splat_f64s(f64::INFINITY),
            simd.splat_f64s(f64::NEG_INFINITY),
        );
        let (mut lo, mut hi, mut off, mut check) = (inf, neg_inf, zero, zero);
        let mut at_one = [zero; 4];
        let mut scales = Scales::new(k);
        // The scales as vectors, refreshed whenever they move.
        let mut hi_t = simd.splat_f64s(scales.hi_threshold());
        let mut lo_t = simd.splat_f64s(scales.lo_threshold());
        let (mut inv_hi, mut inv_lo) = (one, one);
        let mut chain = scales.chain_factor().map(|f| simd.splat_f64s(f));
        // Blocks of `U` vectors, so that the powers run in `U` independent chains,
        // then the remaining vectors one at a time.
        let blocks = pv.len() / U;
        let (p_blocks, p_rest) = pv.split_at(blocks * U);
        let (q_blocks, q_rest) = qv.split_at(blocks * U);
        let (r_blocks, r_rest) = rv.split_at_mut(blocks * U);
        let groups = p_blocks
            .chunks_exact(U)
            .zip(q_blocks.chunks_exact(U))
            .zip(r_blocks.chunks_exact_mut(U))
            .map(|((p, q), r)| (p, q, r))
            .chain(
                p_rest
                    .chunks(1)
                    .zip(q_rest.chunks(1))
                    .zip(r_rest.chunks_mut(1))
                    .map(|((p, q), r)| (p, q, r)),
            );
        let prefetch = crate::simd::Prefetch::new();
        let lanes = size_of::<S::f64s>() / size_of::<f64>();
        for (g, (pb, qb, rb)) in groups.enumerate() {
            // `p` is usually a fresh row (a member's) coming from memory: ask for it
            // well ahead, one line per vector (`q` is shared and in cache).
            for j in 0..U {
                prefetch.line(p, (g * U + j) * lanes + AHEAD);
            }
            // Unused vectors of a short group stay 1, within every scale, with no
            // weight read.
            let mut ratio = [one; U];
            for j in 0..pb.len() {
                let (p, q) = (pb[j], qb[j]);
                if careful {
                    let on = simd.greater_than_f64s(q, zero);
                    ratio[j] = simd.select_f64s(on, simd.div_f64s(p, q), one);
                    lo = simd.min_f64s(lo, simd.select_f64s(on, ratio[j], inf));
                    hi = simd.max_f64s(hi, simd.select_f64s(on, ratio[j], neg_inf));
                    off = simd.add_f64s(off, simd.select_f64s(on, zero, p));
                } else {
                    ratio[j] = simd.div_f64s(p, q);
                    lo = simd.min_f64s(lo, ratio[j]);
                    hi = simd.max_f64s(hi, ratio[j]);
                    check = simd.add_f64s(check, ratio[j]);
                }
                rb[j] = ratio[j];
            }
            // The block's extremes (masked entries are 1, inside every scale).
            let (mut g_max, mut g_min) = (ratio[0], ratio[0]);
            for v in &ratio[1..] {
                g_max = simd.max_f64s(g_max, *v);
                g_min = simd.min_f64s(g_min, *v);
            }
            let outside = simd.or_m64s(
                simd.greater_than_f64s(g_max, hi_t),
                simd.less_than_f64s(g_min, lo_t),
            );
            if simd.first_true_m64s(outside) < lanes {
                let f = scales.widen(simd.reduce_max_f64s(g_max), simd.reduce_min_f64s(g_min));
                let factors = [f.forward[0], f.forward[1], f.reverse, f.reverse];
                for (acc, f) in at_one.iter_mut().zip(factors) {
                    *acc = simd.mul_f64s(*acc, simd.splat_f64s(f));
                }
                hi_t = simd.splat_f64s(scales.hi_threshold());
                lo_t = simd.splat_f64s(scales.lo_threshold());
                let (ih, il) = scales.inverses();
                (inv_hi, inv_lo) = (simd.splat_f64s(ih), simd.splat_f64s(il));
                chain = scales.chain_factor().map(|f| simd.splat_f64s(f));
            }
            // λ = 1: t = r, forward powers of x = r·2^{−E}, reverse of z = r·2^{−F}.
            let mut x = ratio;
            let mut z = ratio;
            for j in 0..U {
                x[j] = simd.mul_f64s(ratio[j], inv_hi);
                z[j] = simd.mul_f64s(ratio[j], inv_lo);
            }
            let xk1 = crate::simd::pow_vectors(simd, x, k - 1);
            let zk1 = match chain {
                Some(f) => {
                    // A plain loop (not `array::map`), inlined into this frame.
                    let mut zk1 = xk1;
                    for v in zk1.iter_mut() {
                        *v = simd.mul_f64s(*v, f);
                    }
                    zk1
                }
                None => crate::simd::pow_vectors(simd, z, k - 1),
            };
            for j in 0..pb.len() {
                let (q, d) = (qb[j], simd.sub_f64s(ratio[j], one));
                let qk1 = simd.mul_f64s(q, xk1[j]);
                let qz = simd.div_f64s(q, simd.mul_f64s(zk1[j], z[j]));
                at_one[0] = simd.mul_add_f64s(qk1, x[j], at_one[0]);
                at_one[1] = simd.mul_add_f64s(qk1, d, at_one[1]);
                at_one[2] = simd.mul_add_f64s(qz, ratio[j], at_one[2]);
                at_one[3] = simd.mul_add_f64s(qz, d, at_one[3]);
            }
        }
        let mut sums = at_one.map(|v| simd.reduce_sum_f64s(v));
        let (mut lo, mut hi) = (simd.reduce_min_f64s(lo), simd.reduce_max_f64s(hi));
        let (mut off, mut check) = (simd.reduce_sum_f64s(off), simd.reduce_sum_f64s(check));
        for ((&p, &q), r) in p_tail.iter().zip(q_tail).zip(r_tail.iter_mut()) {
            if q > 0.0 || !careful {
                let ratio = p / q;
                *r = ratio;
                check += ratio;
                lo = lo.min(ratio);
                hi = hi.max(ratio);
                if ratio > scales.hi_threshold() || ratio < scales.lo_threshold() {
                    let f = scales.widen(ratio, ratio);
                    let factors = [f.forward[0], f.forward[1], f.reverse, f.reverse];
                    for (s, f) in sums.iter_mut().zip(factors) {
                        *s *= f;
                    }
                }
                let (inv_hi, inv_lo) = scales.inverses();
                let (x, z, d) = (ratio * inv_hi, ratio * inv_lo, ratio - 1.0);
                let xk1 = powi_u32(x, k - 1);
                let zk1 = match scales.chain_factor() {
                    Some(f) => xk1 * f,
                    None => powi_u32(z, k - 1),
                };
                let (qk1, qz) = (q * xk1, q / (zk1 * z));
                sums[0] += qk1 * x;
                sums[1] += qk1 * d;
                sums[2] += qz * ratio;
                sums[3] += qz * d;
            } else {
                *r = 1.0;
                off += p;
            }
        }
        PassOut {
            r_min: lo,
            r_max: hi,
            off,
            check,
            at_one: AtOneSums {
                sums,
                e_hi: scales.e_hi,
                e_lo: scales.e_lo,
                failed: scales.failed,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_are_exact_at_every_exponent() {
        for n in -1100..1030_i64 {
            // (`powi` of a negative exponent inverts 2^|n|, which overflows below −1023.)
            let want = if n < -1000 {
                2f64.powi(-1000) * 2f64.powi(n as i32 + 1000)
            } else {
                2f64.powi(n as i32)
            };
            assert_eq!(pow2(n).to_bits(), want.to_bits(), "2^{n}");
        }
        assert_eq!(
            scale2(1.5, -2000),
            1.5 * 2f64.powi(-1000) * 2f64.powi(-1000)
        );
        assert_eq!(scale2(0.75, 1500), 0.75 * 2f64.powi(750) * 2f64.powi(750));
        assert_eq!(MIN_SCALED_SUM, 2f64.powi(-900));
    }

    #[test]
    fn exponents_are_floors_and_powers_are_seen() {
        assert_eq!(exponent(1.0), (0, true));
        assert_eq!(exponent(1.5), (0, false));
        assert_eq!(exponent(0.75), (-1, false));
        assert_eq!(exponent(2f64.powi(-1022)), (-1022, true));
        assert_eq!(exponent(1e150).0, 498);
    }

    /// The scales bracket every ratio they were widened to, with the powers' headroom,
    /// and the factors are the powers of two that move the sums kept so far to the new
    /// scales.
    #[test]
    fn widening_brackets_the_block_and_rescales_by_the_shift() {
        let mut s = Scales::new(7);
        assert_eq!(s.g, 57);
        // Within [2^-57, 2^57]: the scales stay 0 (the unscaled sums).
        let f = s.widen(1e17, 1e-17);
        assert_eq!(
            (s.e_hi, s.e_lo, f.forward, f.reverse),
            (0, 0, [1.0; 2], 1.0)
        );
        let f = s.widen(2f64.powi(60) * 1.5, 2f64.powi(-60) * 1.5);
        assert_eq!((s.e_hi, s.e_lo), (4, -3));
        assert_eq!(f.forward, [2f64.powi(-28), 2f64.powi(-24)]);
        assert_eq!(f.reverse, 2f64.powi(-21));
        assert_eq!(s.hi_threshold(), 2f64.powi(61));
        assert_eq!(s.lo_threshold(), 2f64.powi(-60));
        // Inside: nothing moves.
        let f = s.widen(2f64.powi(61), 2f64.powi(-60));
        assert_eq!(
            (s.e_hi, s.e_lo, f.forward, f.reverse),
            (4, -3, [1.0; 2], 1.0)
        );
        assert_eq!(s.chain_factor(), Some(2f64.powi(7 * 6)));
        let f = s.widen(1e150, 0.0);
        assert!(s.zero && !s.failed);
        assert_eq!((s.e_hi, s.lo_threshold()), (499 - 57, 0.0));
        assert_eq!(f.forward, [0.0; 2]);
        assert_eq!(s.chain_factor(), None);
        s.widen(f64::INFINITY, 1.0);
        assert!(s.failed);
        assert_eq!(s.hi_threshold(), f64::INFINITY);
        // One chain serves both directions while (E − F + G)(k − 1) ≤ 1022.
        let mut s = Scales::new(36);
        assert_eq!((s.g, s.chain_factor()), (11, Some(1.0)));
        s.widen(2f64.powi(20), 2f64.powi(-12));
        assert_eq!((s.e_hi, s.e_lo), (9, -1));
        assert_eq!(s.chain_factor(), Some(2f64.powi(10 * 35)));
        s.widen(1.0, 2f64.powi(-20));
        assert_eq!((s.e_lo, s.chain_factor()), (-9, Some(2f64.powi(18 * 35))));
        s.widen(1.0, 2f64.powi(-21));
        assert_eq!((s.e_hi, s.e_lo, s.chain_factor()), (9, -10, None));
        // Above the largest scaled order the scales never move.
        let s = Scales::new(SCALED_MAX_ORDER + 1);
        assert_eq!((s.hi_threshold(), s.lo_threshold()), (f64::INFINITY, 0.0));
    }
}
