//! SIMD building blocks shared by this crate's kernels and by
//! `privmix-mechanisms`'s fused kernels, for `pulp`'s vector types (used inside
//! a `pulp::WithSimd` operation, so that they compile for the CPU's widest
//! vectors).

/// `x^e` (e ≥ 1) for a block of `U` vectors, by binary powering in registers:
/// `U` independent chains hide the multiplications' latency. The products are
/// formed in the order of the scalar binary powering this crate uses (`powi_u32`), so a scalar tail
/// computed with it rounds identically.
#[inline(always)]
pub fn pow_vectors<S: pulp::Simd, const U: usize>(
    simd: S,
    x: [S::f64s; U],
    e: u32,
) -> [S::f64s; U] {
    debug_assert!(e >= 1);
    let mut base = x;
    let mut e = e;
    // Skip the low zero bits, so that `acc` starts as a power of x, not as 1.
    while e & 1 == 0 {
        for b in base.iter_mut() {
            *b = simd.mul_f64s(*b, *b);
        }
        e >>= 1;
    }
    let mut acc = base;
    e >>= 1;
    while e != 0 {
        for b in base.iter_mut() {
            *b = simd.mul_f64s(*b, *b);
        }
        if e & 1 == 1 {
            for j in 0..U {
                acc[j] = simd.mul_f64s(acc[j], base[j]);
            }
        }
        e >>= 1;
    }
    acc
}
