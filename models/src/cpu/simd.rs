//! The two f32 vector loops the host-memory decode paths share, for use
//! inside a `pulp` dispatch (`#[inline(always)]`, so they take on the
//! caller's instruction set).

use pulp::Simd;

/// `y ← y + a·x` (`x` and `y` of one length), one fused multiply-add per
/// entry.
#[inline(always)]
pub fn axpy<S: Simd>(simd: S, a: f32, x: &[f32], y: &mut [f32]) {
    let (xv, xt) = S::as_simd_f32s(x);
    let (yv, yt) = S::as_mut_simd_f32s(y);
    let av = simd.splat_f32s(a);
    for (o, v) in yv.iter_mut().zip(xv) {
        *o = simd.mul_add_e_f32s(av, *v, *o);
    }
    for (o, v) in yt.iter_mut().zip(xt) {
        *o += a * v;
    }
}

/// `Σ x_i y_i`, summed lane by lane, then across lanes, then the tail.
#[inline(always)]
pub fn dot<S: Simd>(simd: S, x: &[f32], y: &[f32]) -> f32 {
    let (xv, xt) = S::as_simd_f32s(x);
    let (yv, yt) = S::as_simd_f32s(y);
    let mut acc = simd.splat_f32s(0.0);
    for (a, b) in xv.iter().zip(yv) {
        acc = simd.mul_add_e_f32s(*a, *b, acc);
    }
    let mut sum = simd.reduce_sum_f32s(acc);
    for (a, b) in xt.iter().zip(yt) {
        sum += a * b;
    }
    sum
}

/// Software prefetch of the cache line holding a value, so that memory
/// latency overlaps with the current computation. A hint only: it reads
/// nothing architecturally, never faults and changes no result. Through
/// `pulp`'s safe wrapper of SSE's `prefetcht0` (`pulp::x86::V1`, on every
/// x86-64 CPU); a no-op elsewhere.
#[derive(Debug, Clone, Copy)]
pub struct Prefetch {
    #[cfg(target_arch = "x86_64")]
    v1: Option<pulp::x86::V1>,
}

impl Default for Prefetch {
    fn default() -> Self {
        Self::new()
    }
}

impl Prefetch {
    /// The CPU's prefetch instruction, if it has one this crate can use.
    pub fn new() -> Self {
        Prefetch {
            #[cfg(target_arch = "x86_64")]
            v1: pulp::x86::V1::try_new(),
        }
    }

    /// Asks for the cache line holding `x[index]` (nothing past the end).
    #[inline(always)]
    pub fn line<T>(&self, x: &[T], index: usize) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(v1), Some(e)) = (self.v1, x.get(index)) {
            let at: *const T = e;
            v1.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (x, index);
    }
}
