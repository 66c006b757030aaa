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
/// [`super::blocks_f32`]): `privmix-simd`'s, the one `privmix-renyi`'s passes
/// use too.
pub use privmix_simd::Prefetch;
