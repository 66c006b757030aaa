//! Inner loops shared by every kernel: fixed-size chunks, lane-wise reductions that the
//! compiler vectorises, integer powers by repeated squaring, and a streaming log-sum-exp.
//!
//! Every kernel walks its vectors in chunks of [`CHUNK`] elements copied (widened to f64)
//! into stack buffers. A chunk is reduced on its own (its maximum, then its scaled sum)
//! and merged into a running state by rescaling, so each vector is read from memory once
//! and no intermediate value can overflow. The last chunk is padded with neutral values,
//! so every chunk has the same shape and summation order: two computations on bitwise
//! equal inputs give bitwise equal sums, which is how `D(p‖p)` comes out exactly 0.

/// Elements per chunk: 8 buffers of this many f64 fit comfortably in L1.
pub(crate) const CHUNK: usize = 256;
/// Independent accumulators per reduction: lets the compiler keep them in SIMD registers.
pub(crate) const LANES: usize = 4;

/// A chunk-sized f64 buffer.
pub(crate) type Buf = [f64; CHUNK];

/// Entries of both vectors at least this large keep every ratio `p/q` within
/// `[1e-150, 1e150]` (for vectors that sum to about 1), so that ratio-based kernels can
/// neither overflow nor lose precision to subnormal numbers. Vectors with smaller
/// non-zero entries go through the log-space kernels.
pub(crate) const RATIO_PATH_MIN: f64 = 1e-150;

/// Orders `α − 1` below this go through `expm1` formulations: `log Σ p·r^{α−1}` is then
/// close to 0 and the direct formula would lose about `ε/(α−1)` to cancellation.
pub(crate) const SMALL_EXPONENT: f64 = 0.125;

/// Sum of a buffer: `LANES` interleaved partial sums, then a fixed pairwise combination.
#[inline]
pub(crate) fn lane_sum(buf: &Buf) -> f64 {
    let mut acc = [0.0_f64; LANES];
    for block in buf.chunks_exact(LANES) {
        for j in 0..LANES {
            acc[j] += block[j];
        }
    }
    combine(acc)
}

/// The fixed order in which lane accumulators are added up (every sum that must be
/// reproducible bitwise uses it).
pub(crate) fn combine(acc: [f64; LANES]) -> f64 {
    (acc[0] + acc[2]) + (acc[1] + acc[3])
}

/// Maximum of a buffer that holds no NaN (`init` is returned for a buffer below it).
#[inline]
pub(crate) fn lane_max(buf: &Buf, init: f64) -> f64 {
    let mut acc = [init; LANES];
    for block in buf.chunks_exact(LANES) {
        for j in 0..LANES {
            acc[j] = if block[j] > acc[j] { block[j] } else { acc[j] };
        }
    }
    acc.into_iter().fold(init, |m, x| if x > m { x } else { m })
}

/// Elements per block of the powering loop: two accumulator lanes' worth, for more
/// independent multiplications in flight.
pub(crate) const PW: usize = 2 * LANES;

/// `x^n` for a block, by binary powering with both operands in registers.
#[inline(always)]
pub(crate) fn pow8(x: [f64; PW], n: u32) -> [f64; PW] {
    if n == 0 {
        return [1.0; PW];
    }
    let mut base = x;
    let mut e = n;
    while e & 1 == 0 {
        for j in 0..PW {
            base[j] *= base[j];
        }
        e >>= 1;
    }
    let mut acc = base;
    e >>= 1;
    if e == 0 {
        return acc;
    }
    for j in 0..PW {
        base[j] *= base[j];
    }
    loop {
        if e & 1 == 1 {
            for j in 0..PW {
                acc[j] *= base[j];
            }
        }
        e >>= 1;
        if e == 0 {
            return acc;
        }
        for j in 0..PW {
            base[j] *= base[j];
        }
    }
}

/// `x^n` for one value, by the same binary powering (used to merge chunk scales).
pub(crate) fn powi_u32(mut x: f64, mut n: u32) -> f64 {
    let mut acc = 1.0;
    while n > 0 {
        if n & 1 == 1 {
            acc *= x;
        }
        n >>= 1;
        if n > 0 {
            x *= x;
        }
    }
    acc
}

/// A divergence is ≥ 0 for normalised inputs (Gibbs / Hölder), and every kernel computes
/// the divergence of the *normalised* inputs; a negative result can therefore only be
/// rounding error, and 0 is nearer the true value. NaN is passed through untouched (it
/// would be a bug, and the tests must see it).
#[inline]
pub(crate) fn non_negative(d: f64) -> f64 {
    if d < 0.0 { 0.0 } else { d }
}

/// Streaming `log Σ_x exp(κ·v_x)`, kept as `κ·(max + log(s)/κ)` with `s = Σ exp(κ(v − max))`.
///
/// `κ = 1` is the usual log-sum-exp. `κ = α − 1` with `v = t/κ` serves orders so large
/// that `t` itself would overflow: `max` and `s` stay finite for any finite `v`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScaledLse {
    kappa: f64,
    max: f64,
    sum: f64,
}

impl ScaledLse {
    /// An empty sum (log 0 = −∞).
    pub(crate) fn new(kappa: f64) -> Self {
        ScaledLse {
            kappa,
            max: f64::NEG_INFINITY,
            sum: 0.0,
        }
    }

    /// Adds a chunk of values (`−∞` entries add nothing; no entry may be NaN or `+∞`).
    pub(crate) fn add_chunk(&mut self, v: &Buf) {
        let m = lane_max(v, f64::NEG_INFINITY);
        if m == f64::NEG_INFINITY {
            return;
        }
        let mut e = [0.0; CHUNK];
        for (dst, &x) in e.iter_mut().zip(v.iter()) {
            *dst = (self.kappa * (x - m)).exp();
        }
        self.merge(m, lane_sum(&e));
    }

    /// Adds one value.
    pub(crate) fn add(&mut self, v: f64) {
        if v > f64::NEG_INFINITY {
            self.merge(v, 1.0);
        }
    }

    fn merge(&mut self, m: f64, s: f64) {
        if m > self.max {
            self.sum = self.sum * (self.kappa * (self.max - m)).exp() + s;
            self.max = m;
        } else {
            self.sum += s * (self.kappa * (m - self.max)).exp();
        }
    }

    /// The scale κ this sum was built with.
    pub(crate) fn kappa(&self) -> f64 {
        self.kappa
    }

    /// `log Σ exp(κ·v) / κ`: finite whenever some value was finite.
    pub(crate) fn value_over_kappa(&self) -> f64 {
        if self.max == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            self.max + self.sum.ln() / self.kappa
        }
    }

    /// `log Σ exp(κ·v)` (may overflow to `+∞` for κ ≫ 1; never NaN).
    pub(crate) fn value(&self) -> f64 {
        if self.max == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            self.kappa * self.max + self.sum.ln()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_powering_matches_powi() {
        for n in [1_u32, 2, 3, 17, 64, 1000, 1_000_000] {
            let x: [f64; PW] = std::array::from_fn(|i| 0.5 + i as f64 / (2.0 * PW as f64));
            let got = pow8(x, n);
            for (g, base) in got.iter().zip(x) {
                let want = base.powi(n as i32);
                assert!(
                    (g - want).abs() <= 1e-12 * want.max(1e-300),
                    "{n}: {g} {want}"
                );
                // Same multiplications in the same order as the scalar version.
                assert_eq!(*g, powi_u32(base, n));
            }
        }
        assert_eq!(powi_u32(3.0, 0), 1.0);
        assert_eq!(pow8([3.0; PW], 0), [1.0; PW]);
    }

    #[test]
    fn reductions() {
        let mut b = [0.0; CHUNK];
        for (i, v) in b.iter_mut().enumerate() {
            *v = i as f64;
        }
        assert_eq!(lane_sum(&b), (CHUNK * (CHUNK - 1) / 2) as f64);
        assert_eq!(lane_max(&b, f64::NEG_INFINITY), (CHUNK - 1) as f64);
    }

    #[test]
    fn scaled_lse_matches_direct_sum_and_survives_huge_values() {
        let mut b = [f64::NEG_INFINITY; CHUNK];
        b[0] = 0.0;
        b[5] = 1.0_f64.ln();
        b[9] = 2.0_f64.ln();
        let mut acc = ScaledLse::new(1.0);
        acc.add_chunk(&b);
        assert!((acc.value() - 4.0_f64.ln()).abs() < 1e-15);
        // κ huge: value/κ stays finite, value overflows to +∞ rather than NaN.
        let mut big = ScaledLse::new(1e300);
        big.add_chunk(&b);
        big.add(0.5);
        big.add(0.75); // the new maximum: every other term is exp(−∞·…) = 0 beside it
        assert_eq!(big.value_over_kappa(), 0.75);
        assert_eq!(big.value(), 0.75e300);
        let mut huge = ScaledLse::new(f64::MAX);
        huge.add(2.0);
        huge.add(1.0);
        assert_eq!(huge.value_over_kappa(), 2.0);
        assert_eq!(huge.value(), f64::INFINITY);
        assert_eq!(ScaledLse::new(1.0).value(), f64::NEG_INFINITY);
    }
}
