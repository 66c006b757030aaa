//! Keys and values held in host memory, with attention for a few queries
//! computed straight from them (plain burn-flex only).
//!
//! Why: with burn's tensor ops a decode step copies the whole cache to
//! append one slot (`cat`; burn-flex's `slice_assign` copies too), and its
//! attention is two tiny `gemm` calls per (row, key/value head), each paying
//! gemm's packing and dispatch. For the ensemble's N + 1 rows that was a
//! third of a decode step. Here a layer's keys and values live in two `Vec`s
//! with spare capacity, a step writes only its own slots, and the few
//! queries of a decode step are answered by one pass over the visible slots.
//!
//! The query heads that share a key/value head (grouped-query attention) are
//! answered together, so each key and value vector is loaded once for all of
//! them, and the next key/value head's slots are prefetched while one is in
//! use: an ensemble step reads 9 rows' caches from memory at every layer.
//! Measured on SmolLM2 (3 query heads per key/value head), 9 rows after a
//! 32-token context: attention 1.05 → 0.67 ms per step.
//!
//! Semantics are those of the tensor path (HF eager attention): scores
//! `q·k · scale`, optional soft-capping `cap·tanh(s/cap)`, masked scores set
//! to `f32::MIN`, softmax in f32, then the probability-weighted sum of
//! values. Masked slots get probability exactly 0 there too (`exp(f32::MIN −
//! max)` underflows), except when every slot is masked, where both give the
//! uniform average. Only the order of the f32 sums differs.

use pulp::{Simd, WithSimd};

/// Keys and values of one layer, of which the first `len` slots of every
/// (row, head) are filled: keys dimension-major, `[batch, heads, dim,
/// capacity]`, so that one vector holds one coordinate of consecutive keys
/// and a query's scores need no horizontal sums; values `[batch, heads,
/// capacity, dim]`, added slot by slot.
#[derive(Debug, Clone)]
pub(crate) struct HostKv {
    batch: usize,
    heads: usize,
    dim: usize,
    capacity: usize,
    len: usize,
    k_t: Vec<f32>,
    v: Vec<f32>,
}

impl HostKv {
    /// An empty layer for `batch` rows of `heads` heads of width `dim`.
    pub(crate) fn new(batch: usize, heads: usize, dim: usize) -> Self {
        Self {
            batch,
            heads,
            dim,
            capacity: 0,
            len: 0,
            k_t: Vec::new(),
            v: Vec::new(),
        }
    }

    /// Filled slots per (row, head).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `s` slots; `k` and `v` are `[batch, s, heads, dim]` (the
    /// projections' own layout). When the capacity runs out it becomes twice
    /// what is needed: appending one slot at a time copies each slot O(1)
    /// times, and a prefill leaves room for as many decode steps.
    pub(crate) fn append(&mut self, k: &[f32], v: &[f32], s: usize) {
        let (b, h, d) = (self.batch, self.heads, self.dim);
        debug_assert_eq!(k.len(), b * s * h * d);
        let need = self.len + s;
        if need > self.capacity {
            self.grow((2 * need).max(16));
        }
        let cap = self.capacity;
        for row in 0..b {
            for i in 0..s {
                for head in 0..h {
                    let from = ((row * s + i) * h + head) * d;
                    let slot = self.len + i;
                    let to = ((row * h + head) * cap + slot) * d;
                    self.v[to..to + d].copy_from_slice(&v[from..from + d]);
                    let kt = &mut self.k_t[(row * h + head) * d * cap..][..d * cap];
                    for (c, x) in k[from..from + d].iter().enumerate() {
                        kt[c * cap + slot] = *x;
                    }
                }
            }
        }
        self.len = need;
    }

    /// Moves the filled slots into buffers of `capacity` slots.
    fn grow(&mut self, capacity: usize) {
        let (b, h, d, len, old) = (self.batch, self.heads, self.dim, self.len, self.capacity);
        let mut k_t = vec![0.0f32; b * h * d * capacity];
        for (to, from) in k_t
            .chunks_exact_mut(capacity)
            .zip(self.k_t.chunks_exact(old.max(1)))
        {
            to[..len].copy_from_slice(&from[..len]);
        }
        let mut v = vec![0.0f32; b * h * capacity * d];
        for (to, from) in v
            .chunks_exact_mut(capacity * d)
            .zip(self.v.chunks_exact((old * d).max(1)))
        {
            to[..len * d].copy_from_slice(&from[..len * d]);
        }
        self.k_t = k_t;
        self.v = v;
        self.capacity = capacity;
    }

    /// Prefetches parts `share` of `parts` equal parts of the filled slots
    /// of (row, head) `group` (`row · heads + head`; nothing past the last
    /// one): the lines of each key coordinate's filled slots, then of the
    /// values.
    fn prefetch_share(
        &self,
        prefetch: super::simd::Prefetch,
        group: usize,
        share: std::ops::Range<usize>,
        parts: usize,
    ) {
        /// `f32` entries per cache line.
        const LINE: usize = 16;
        if group >= self.batch * self.heads || parts == 0 {
            return;
        }
        let (d, cap, t) = (self.dim, self.capacity, self.len);
        let per_dim = t.div_ceil(LINE);
        let k_lines = d * per_dim;
        let total = k_lines + (t * d).div_ceil(LINE);
        let k_t = &self.k_t[group * d * cap..][..d * cap];
        let v = &self.v[group * cap * d..][..t * d];
        for l in share.start * total / parts..share.end * total / parts {
            if l < k_lines {
                prefetch.line(k_t, (l / per_dim) * cap + (l % per_dim) * LINE);
            } else {
                prefetch.line(v, (l - k_lines) * LINE);
            }
        }
    }

    /// Keys and values as contiguous `[batch, heads, len, dim]` vectors.
    pub(crate) fn contiguous(&self) -> (Vec<f32>, Vec<f32>) {
        let (b, h, d, len, cap) = (self.batch, self.heads, self.dim, self.len, self.capacity);
        let mut k = Vec::with_capacity(b * h * len * d);
        let mut v = Vec::with_capacity(b * h * len * d);
        for bh in 0..b * h {
            let kt = &self.k_t[bh * d * cap..][..d * cap];
            for j in 0..len {
                k.extend((0..d).map(|c| kt[c * cap + j]));
            }
            v.extend_from_slice(&self.v[bh * cap * d..][..len * d]);
        }
        (k, v)
    }

    /// Keeps rows `keep` (in range, checked by the caller), in that order.
    pub(crate) fn select_rows(&mut self, keep: &[usize]) {
        let per_row = self.heads * self.capacity * self.dim;
        for buf in [&mut self.k_t, &mut self.v] {
            let mut next = Vec::with_capacity(keep.len() * per_row);
            for &r in keep {
                next.extend_from_slice(&buf[r * per_row..(r + 1) * per_row]);
            }
            *buf = next;
        }
        self.batch = keep.len();
    }
}

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

/// Attention of `s` new queries per row, `q: [batch, s, heads, dim]`,
/// against every slot of `kv`; `visible(row, i, slot)` says whether query
/// `i` of `row` may attend to `slot`. Returns `[batch, s, heads, dim]`.
pub(crate) fn attend(
    q: &[f32],
    s: usize,
    kv: &HostKv,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
) -> Vec<f32> {
    attend_grouped(q, s, kv, scoring, visible, GROUP_MAX)
}

/// [`attend`] with the query heads of each key/value head taken up to
/// `group` at a time (1: one query per pass, the plain form the tests
/// compare with).
fn attend_grouped(
    q: &[f32],
    s: usize,
    kv: &HostKv,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
    group: usize,
) -> Vec<f32> {
    let (d, t) = (kv.dim, kv.len);
    let mut out = vec![0.0f32; q.len()];
    let per_row = s * scoring.heads * d;
    let rep = scoring.heads / kv.heads;
    let prefetch = super::simd::Prefetch::new();
    let one_row = |row: usize, out: &mut [f32]| {
        let mut scores = vec![0.0f32; group.min(rep) * t];
        let mut seen = vec![false; t];
        for i in 0..s {
            for (j, v) in seen.iter_mut().enumerate() {
                *v = visible(row, i, j);
            }
            for g in 0..kv.heads {
                let base = (row * kv.heads + g) * kv.capacity * d;
                let mut head = g * rep;
                while head < (g + 1) * rep {
                    let n = ((g + 1) * rep - head).min(group);
                    // The next key/value head's slots (of this row, else of
                    // the next) are fetched while this one is used: a share
                    // of them before each pass.
                    let share = head - g * rep;
                    kv.prefetch_share(prefetch, row * kv.heads + g + 1, share..share + n, rep);
                    let at = (i * scoring.heads + head) * d;
                    let query = Queries {
                        q: &q[row * per_row + at..][..n * d],
                        k_t: &kv.k_t[base..base + kv.capacity * d],
                        capacity: kv.capacity,
                        v: &kv.v[base..base + t * d],
                        seen: &seen,
                        scoring,
                        scores: &mut scores[..n * t],
                        out: &mut out[at..at + n * d],
                    };
                    match n {
                        1 => pulp::Arch::new().dispatch(Group::<1>(query)),
                        2 => pulp::Arch::new().dispatch(Group::<2>(query)),
                        3 => pulp::Arch::new().dispatch(Group::<3>(query)),
                        _ => pulp::Arch::new().dispatch(Group::<4>(query)),
                    }
                    head += n;
                }
            }
        }
    };
    // Rows in parallel where there is enough work.
    crate::runtime::for_each_row(
        &mut out,
        per_row,
        kv.batch > 1 && q.len() * t >= PARALLEL_MIN_WORK,
        one_row,
    );
    out
}

/// Attention calls with at least this many query entries × slots run rows
/// in parallel.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Most query heads of one key/value head answered in one pass over its
/// keys and values (4 queries × [`SWEEP`] score vectors, or 4 queries × 4
/// output vectors, are 16 accumulators).
const GROUP_MAX: usize = 4;

/// Vectors of slots scored per pass over a query (independent chains).
const SWEEP: usize = 4;

/// Output vectors summed per pass over the probabilities.
const OUT_VECTORS: usize = 4;

/// `Q` consecutive query heads (`q: [Q, dim]`) of one key/value head
/// against `t` slots: keys `[dim, capacity]`, values `[t, dim]`; `scores`
/// is `[Q, t]` scratch, `out` is `[Q, dim]`.
struct Queries<'a> {
    q: &'a [f32],
    k_t: &'a [f32],
    capacity: usize,
    v: &'a [f32],
    seen: &'a [bool],
    scoring: HostScoring,
    scores: &'a mut [f32],
    out: &'a mut [f32],
}

/// [`Queries`] answered together: each key and value vector is loaded once
/// for the `Q` queries (grouped-query attention shares them), and each
/// query's every sum is formed in the same order as alone, so the result
/// does not depend on `Q`.
struct Group<'a, const Q: usize>(Queries<'a>);

impl<const Q: usize> WithSimd for Group<'_, Q> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Queries {
            q,
            k_t,
            capacity,
            v,
            seen,
            scoring,
            scores,
            out,
        } = self.0;
        let d = q.len() / Q;
        let t = scores.len() / Q;
        // Scores of SWEEP vectors of consecutive keys per pass over the
        // queries: Σ_c q_c·k_t[c, j..], in Q × SWEEP independent chains of
        // multiply-adds, c in order. A vector reads whole lanes while they
        // lie inside the row's capacity (slots past `t` are scored and
        // dropped), a partial load past it, and nothing when it starts past
        // `t` (the cache is read from memory at every step: its unused
        // capacity is not). `t ≤ capacity`, so a vector that starts before
        // `t` starts inside the row.
        let lanes = core::mem::size_of::<S::f32s>() / core::mem::size_of::<f32>();
        let zero = simd.splat_f32s(0.0);
        let load = |row: &[f32], j: usize| {
            if j >= t {
                zero
            } else if j + lanes <= row.len() {
                S::as_simd_f32s(&row[j..j + lanes]).0[0]
            } else {
                simd.partial_load_f32s(&row[j..])
            }
        };
        let mut j0 = 0;
        while j0 < t {
            let mut acc = [[zero; SWEEP]; Q];
            for c in 0..d {
                let row = &k_t[c * capacity..(c + 1) * capacity];
                let mut k = [zero; SWEEP];
                for (u, ku) in k.iter_mut().enumerate() {
                    *ku = load(row, j0 + u * lanes);
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
                *v = super::vexp::exp_f32s(simd, simd.sub_f32s(*v, m));
            }
            let e = super::vexp::exp_f32s(simd, simd.sub_f32s(simd.partial_load_f32s(st), m));
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
                let vj = &S::as_simd_f32s(&v[j * d..(j + 1) * d]).0[i0..i0 + width];
                for (h, acc) in acc.iter_mut().enumerate() {
                    let p = scores[h * t + j];
                    if p != 0.0 {
                        let p = simd.splat_f32s(p);
                        for (a, x) in acc.iter_mut().zip(vj) {
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
                    .fold(0.0, |a, (j, &p)| p.mul_add(v[j * d + c], a));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Straightforward f64 attention over contiguous `[b, h, t, d]` keys and values.
    fn reference(
        q: &[f32],
        s: usize,
        (k, v): (&[f32], &[f32]),
        (b, kvh, t, d): (usize, usize, usize, usize),
        sc: HostScoring,
        visible: &dyn Fn(usize, usize, usize) -> bool,
    ) -> Vec<f64> {
        let mut out = vec![0.0; q.len()];
        for row in 0..b {
            for i in 0..s {
                for head in 0..sc.heads {
                    let at = ((row * s + i) * sc.heads + head) * d;
                    let base = (row * kvh + head / (sc.heads / kvh)) * t * d;
                    let scores: Vec<f64> = (0..t)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|c| f64::from(q[at + c]) * f64::from(k[base + j * d + c]))
                                .sum();
                            let mut x = dot * f64::from(sc.scale);
                            if let Some(cap) = sc.softcap {
                                x = (x / f64::from(cap)).tanh() * f64::from(cap);
                            }
                            if visible(row, i, j) {
                                x
                            } else {
                                f64::from(f32::MIN)
                            }
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for c in 0..d {
                        out[at + c] = (0..t)
                            .map(|j| e[j] / z * f64::from(v[base + j * d + c]))
                            .sum();
                    }
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Appending in several steps (through capacity growth) and attending
        /// gives HF eager attention on the contiguous cache, computed in f64.
        #[test]
        fn matches_eager_attention(
            b in 1usize..4,
            kvh in 1usize..3,
            rep in 1usize..7,
            d in prop::sample::select(vec![4usize, 16, 20, 64]),
            steps in prop::collection::vec(prop_oneof![1usize..5, 30usize..60], 1..6),
            s in 1usize..3,
            softcap in prop::option::of(1.0f32..30.0),
            window in prop::option::of(1usize..6),
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f32 / 1000.0 - 1.0
            };
            let mut kv = HostKv::new(b, kvh, d);
            for &n in steps.iter().chain([&s]) {
                let k: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                let v: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                kv.append(&k, &v, n);
            }
            let t = kv.len();
            let sc = HostScoring { heads: kvh * rep, scale: 0.3, softcap };
            let q: Vec<f32> = (0..b * s * sc.heads * d).map(|_| 3.0 * next()).collect();
            // Causal within the new slots, a window, and row 1 cannot see slot 0.
            let visible = |row: usize, i: usize, j: usize| {
                let qs = t - s + i;
                j <= qs && window.is_none_or(|w| qs - j < w) && !(row == 1 && j == 0)
            };
            let got = attend(&q, s, &kv, sc, &visible);
            // Query heads answered together give exactly what each gives
            // alone (every sum in the same order).
            let alone = attend_grouped(&q, s, &kv, sc, &visible, 1);
            prop_assert!(
                got.iter().zip(&alone).all(|(g, a)| g.to_bits() == a.to_bits()),
                "grouped and one-query passes differ"
            );
            let (k, v) = kv.contiguous();
            let want = reference(&q, s, (&k, &v), (b, kvh, t, d), sc, &visible);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((f64::from(*g) - w).abs() < 1e-5, "{} vs {}", g, w);
            }
        }
    }

    #[test]
    fn select_rows_keeps_the_named_rows() {
        let mut kv = HostKv::new(3, 1, 2);
        let k: Vec<f32> = (0..6).map(|i| i as f32).collect();
        kv.append(&k, &k, 1);
        kv.select_rows(&[2, 0]);
        assert_eq!(kv.contiguous().0, vec![4.0, 5.0, 0.0, 1.0]);
    }
}
