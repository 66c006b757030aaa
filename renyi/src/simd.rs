//! SIMD building blocks shared by this crate's kernels and by other crates'
//! kernels (`privmix-mechanisms`'s fused kernels use [`pow_vectors`] and
//! [`Prefetch`]), for `pulp`'s vector types (used inside a
//! `pulp::WithSimd` operation, so that they compile for the CPU's widest vectors).

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

/// Loads one entry per 64-byte cache line of `row`, discarding the values, so that a
/// kernel that reads `row` next finds it in cache.
///
/// Why: a loop that does arithmetic on each element keeps only a few cache misses in
/// flight, and a short stream (a vocabulary-sized row, or a slice of one) ends before
/// the hardware prefetchers get ahead of it. This loop does nothing else, so the core
/// keeps many misses in flight (`cargo bench -p privmix-mechanisms --bench steps`
/// measures the passes that use it).
/// `black_box` keeps the loads; if a compiler ever dropped them, only speed would
/// change. Where a pass has arithmetic to overlap with the fetch, [`Prefetch`] is
/// better still (the ratio pass of the mixture kernels and the fused leave-one-out
/// pass use it instead).
pub fn warm(row: &[f64]) {
    // f64 entries per cache line.
    const LINE: usize = 8;
    let mut acc = [0.0_f64; 4];
    for (k, &x) in row.iter().step_by(LINE).enumerate() {
        acc[k % 4] += x;
    }
    std::hint::black_box(acc);
}

/// Software prefetch of the cache lines a kernel reads next (`privmix-simd`'s,
/// the one the model runtime's kernels use too): the mechanisms' leave-one-out
/// pass uses it as `privmix_renyi::simd::Prefetch`, this crate's ratio pass of
/// the mixture kernels as [`crate::simd::Prefetch`].
pub use privmix_simd::Prefetch;
