//! The attention passes over one (row, key/value head): scores, softmax
//! and the probability-weighted sum of values, for `Q` query heads at once,
//! generic over the SIMD level and over how the keys and values are held
//! ([`KvRead`]).

use pulp::{Simd, WithSimd};

use crate::cpu::vexp::exp_f32s;

/// Vectors of slots scored per pass over a query (independent chains).
const SWEEP: usize = 4;

/// Output vectors summed per pass over the probabilities.
const OUT_VECTORS: usize = 4;

/// `Q` consecutive query heads (`q: [Q, dim]`) of one key/value head
/// against `t` slots of `kv`; `scores` is `[Q, t]` scratch, `out` is
/// What an attention call needs besides the queries and the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostScoring {
    /// Query heads (a multiple of the cache's key/value heads).
    pub heads: usize,
    /// Multiplier of `q·k`.
    pub scale: f32,
    /// Soft-cap of the scores, if any.
    pub softcap: Option<f32>,
}

/// `[Q, dim]`.
pub(crate) struct Queries<'a, R> {
    pub q: &'a [f32],
    pub kv: R,
    pub seen: &'a [bool],
    pub scoring: HostScoring,
    pub scores: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// One (row, key/value head)'s keys (`[dim, capacity]`) and values (`[t,
/// dim]`) as the attention passes read them, widened to f32.
pub(crate) trait KvRead<S: Simd>: Copy {
    /// Slots `j..` of key coordinate `c`, one vector: whole lanes while
    /// they lie inside the row's capacity (slots past `t` are scored and
    /// dropped), a partial load past it, and zero when `j ≥ t` (the cache
    /// is read from memory at every step: its unused capacity is not). `t
    /// ≤ capacity`, so a vector that starts before `t` starts inside the row.
    fn keys(self, simd: S, c: usize, j: usize) -> S::f32s;
    /// Vector `i` of slot `j`'s value.
    fn value(self, simd: S, j: usize, i: usize) -> S::f32s;
    /// Entry `c` of slot `j`'s value.
    fn value_at(self, j: usize, c: usize) -> f32;
}

/// Keys and values held in f32.
#[derive(Clone, Copy)]
pub(crate) struct F32Kv<'a> {
    k_t: &'a [f32],
    capacity: usize,
    t: usize,
    v: &'a [f32],
    d: usize,
}

impl<'a> F32Kv<'a> {
    /// The keys `k_t: [dim, capacity]` and values `v: [t, dim]` at the
    /// start of the given slices.
    pub(crate) fn new(
        k_t: &'a [f32],
        capacity: usize,
        v: &'a [f32],
        (t, d): (usize, usize),
    ) -> Self {
        Self {
            k_t: &k_t[..capacity * d],
            capacity,
            t,
            v: &v[..t * d],
            d,
        }
    }
}

impl<S: Simd> KvRead<S> for F32Kv<'_> {
    #[inline(always)]
    fn keys(self, simd: S, c: usize, j: usize) -> S::f32s {
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        let row = &self.k_t[c * self.capacity..(c + 1) * self.capacity];
        if j >= self.t {
            simd.splat_f32s(0.0)
        } else if j + lanes <= row.len() {
            S::as_simd_f32s(&row[j..j + lanes]).0[0]
        } else {
            simd.partial_load_f32s(&row[j..])
        }
    }
    #[inline(always)]
    fn value(self, _: S, j: usize, i: usize) -> S::f32s {
        S::as_simd_f32s(&self.v[j * self.d..(j + 1) * self.d]).0[i]
    }
    #[inline(always)]
    fn value_at(self, j: usize, c: usize) -> f32 {
        self.v[j * self.d + c]
    }
}

/// [`Queries`] answered together over f32 keys and values, on whatever
/// SIMD level the CPU has.
pub(crate) struct Group<'a, const Q: usize>(pub Queries<'a, F32Kv<'a>>);

impl<const Q: usize> WithSimd for Group<'_, Q> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        answer::<S, F32Kv<'_>, Q>(simd, self.0);
    }
}

/// [`Queries`] answered together: each key and value vector is loaded once
/// for the `Q` queries (grouped-query attention shares them), and each
/// query's every sum is formed in the same order as alone, so the result
/// does not depend on `Q` (nor on how the keys and values are held, as
/// long as they widen to the same f32 values).
#[inline(always)]
pub(crate) fn answer<S: Simd, R: KvRead<S>, const Q: usize>(simd: S, query: Queries<'_, R>) {
    let Queries {
        q,
        kv,
        seen,
        scoring,
        scores,
        out,
    } = query;
    let d = q.len() / Q;
    let t = scores.len() / Q;
    // Scores of SWEEP vectors of consecutive keys per pass over the
    // queries: Σ_c q_c·k_t[c, j..], in Q × SWEEP independent chains of
    // multiply-adds, c in order.
    let lanes = size_of::<S::f32s>() / size_of::<f32>();
    let zero = simd.splat_f32s(0.0);
    let mut j0 = 0;
    while j0 < t {
        let mut acc = [[zero; SWEEP]; Q];
        for c in 0..d {
            let mut k = [zero; SWEEP];
            for (u, ku) in k.iter_mut().enumerate() {
                *ku = kv.keys(simd, c, j0 + u * lanes);
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let qc = simd.splat_f32s(q[h * d + c]);
                for (a, ku) in acc.iter_mut().zip(&k) {
                    *a = simd.mul_add_e_f32s(qc, *ku, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let scores = &mut scores[h * t..(h + 1) * t];
            for (u, a) in acc.iter().enumerate() {
                let j = j0 + u * lanes;
                if j < t {
                    let n = (t - j).min(lanes);
                    simd.partial_store_f32s(&mut scores[j..j + n], *a);
                }
            }
        }
        j0 += SWEEP * lanes;
    }
    for scores in scores.chunks_exact_mut(t) {
        let mut max = f32::NEG_INFINITY;
        for (j, score) in scores.iter_mut().enumerate() {
            let mut x = *score * scoring.scale;
            if let Some(cap) = scoring.softcap {
                x = (x / cap).tanh() * cap;
            }
            if !seen[j] {
                x = f32::MIN;
            }
            *score = x;
            max = max.max(x);
        }
        let m = simd.splat_f32s(max);
        let (sv, st) = S::as_mut_simd_f32s(scores);
        for v in sv.iter_mut() {
            *v = exp_f32s(simd, simd.sub_f32s(*v, m));
        }
        let e = exp_f32s(simd, simd.sub_f32s(simd.partial_load_f32s(st), m));
        simd.partial_store_f32s(st, e);
        let sum: f32 = scores.iter().sum();
        for p in scores.iter_mut() {
            *p /= sum;
        }
    }
    // Σ_j p_j·v_j, OUT_VECTORS output vectors of every query at a time
    // in registers, j in order (zero probabilities skipped).
    let vectors = d / lanes;
    let mut i0 = 0;
    while i0 < vectors {
        let width = (vectors - i0).min(OUT_VECTORS);
        let mut acc = [[zero; OUT_VECTORS]; Q];
        for j in 0..t {
            let vj: [S::f32s; OUT_VECTORS] = std::array::from_fn(|x| {
                if x < width {
                    kv.value(simd, j, i0 + x)
                } else {
                    zero
                }
            });
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = scores[h * t + j];
                if p != 0.0 {
                    let p = simd.splat_f32s(p);
                    for (a, x) in acc[..width].iter_mut().zip(&vj) {
                        *a = simd.mul_add_e_f32s(p, *x, *a);
                    }
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let (ov, _) = S::as_mut_simd_f32s(&mut out[h * d..(h + 1) * d]);
            ov[i0..i0 + width].copy_from_slice(&acc[..width]);
        }
        i0 += width;
    }
    let done = vectors * lanes;
    for h in 0..Q {
        let scores = &scores[h * t..(h + 1) * t];
        for c in done..d {
            out[h * d + c] = scores
                .iter()
                .enumerate()
                .filter(|&(_, &p)| p != 0.0)
                .fold(0.0, |a, (j, &p)| p.mul_add(kv.value_at(j, c), a));
        }
    }
}
