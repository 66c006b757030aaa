//! The two f32 vector loops the host-memory decode paths share, for use
//! inside a `pulp` dispatch (`#[inline(always)]`, so they take on the
//! caller's instruction set), and the kernels' software prefetch.

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

/// Software prefetch of the cache lines a kernel reads next (the next key/value
/// head's slots in the attention kernel, the next weight blocks in
/// [`super::blocks_f32`]), so that memory latency overlaps with the current
/// computation. A hint only: it reads nothing architecturally, never faults,
/// and changes no result. Through `pulp`'s safe wrapper of SSE's `prefetcht0`
/// (`pulp::x86::V1`, present on every x86-64 CPU); a no-op elsewhere.
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
    /// The CPU's prefetch instruction, if it has one these kernels can use.
    pub fn new() -> Self {
        Prefetch {
            #[cfg(target_arch = "x86_64")]
            v1: pulp::x86::V1::try_new(),
        }
    }

    /// Asks for the cache line holding `row[index]` (nothing past the row's end).
    #[inline(always)]
    pub fn line<T>(&self, row: &[T], index: usize) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(v1), Some(x)) = (self.v1, row.get(index)) {
            let at: *const T = x;
            v1.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row, index);
    }
}

#[cfg(test)]
mod tests {
    use super::Prefetch;

    /// A prefetch changes nothing: in range, at the end and past it.
    #[test]
    fn prefetch_is_a_hint_only() {
        let row: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let prefetch = Prefetch::new();
        let mut sum = 0.0f64;
        for (i, x) in row.iter().enumerate() {
            if i % 16 == 0 {
                prefetch.line(&row, i + 256);
            }
            sum += f64::from(*x);
        }
        prefetch.line(&row, usize::MAX);
        prefetch.line::<u8>(&[], 0);
        assert_eq!(sum, 4095.0 * 4096.0 / 2.0);
    }
}
