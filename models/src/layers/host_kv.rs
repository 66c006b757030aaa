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
        debug_assert_eq!(k.len(), self.batch * s * self.heads * self.dim);
        self.reserve(s);
        let (h, d, cap, len) = (self.heads, self.dim, self.capacity, self.len);
        let per_row = h * d * cap;
        for (row, (k_t, vs)) in self
            .k_t
            .chunks_exact_mut(per_row)
            .zip(self.v.chunks_exact_mut(per_row))
            .enumerate()
        {
            let new = s * h * d;
            write_slots(
                (k_t, vs),
                (&k[row * new..][..new], &v[row * new..][..new]),
                (h, d, cap, len),
            );
        }
        self.len += s;
    }

    /// Makes room for `s` more slots per (row, head).
    fn reserve(&mut self, s: usize) {
        let need = self.len + s;
        if need > self.capacity {
            self.grow((2 * need).max(16));
        }
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

/// Writes one row's new keys and values, `[s, heads, dim]` each, into its
/// slots `len..len + s` of `k_t: [heads, dim, capacity]` and `v: [heads,
/// capacity, dim]`.
fn write_slots(
    (k_t, v): (&mut [f32], &mut [f32]),
    (k_new, v_new): (&[f32], &[f32]),
    (heads, d, cap, len): (usize, usize, usize, usize),
) {
    for (i, (k_tok, v_tok)) in k_new
        .chunks_exact(heads * d)
        .zip(v_new.chunks_exact(heads * d))
        .enumerate()
    {
        let slot = len + i;
        for head in 0..heads {
            let to = (head * cap + slot) * d;
            v[to..to + d].copy_from_slice(&v_tok[head * d..][..d]);
            let kt = &mut k_t[head * d * cap..][..d * cap];
            for (c, x) in k_tok[head * d..][..d].iter().enumerate() {
                kt[c * cap + slot] = *x;
            }
        }
    }
}

/// The filled slots of consecutive rows of a [`HostKv`] (all of them, or
/// one thread's share), read-only: what attention reads.
#[derive(Debug, Clone, Copy)]
struct KvRows<'a> {
    batch: usize,
    heads: usize,
    dim: usize,
    capacity: usize,
    len: usize,
    k_t: &'a [f32],
    v: &'a [f32],
}

impl KvRows<'_> {
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
}

impl HostKv {
    #[cfg(test)]
    fn rows(&self) -> KvRows<'_> {
        KvRows {
            batch: self.batch,
            heads: self.heads,
            dim: self.dim,
            capacity: self.capacity,
            len: self.len,
            k_t: &self.k_t,
            v: &self.v,
        }
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
/// (The tests' form of [`append_and_attend`]'s attention.)
#[cfg(test)]
pub(crate) fn attend(
    q: &[f32],
    s: usize,
    kv: &HostKv,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
) -> Vec<f32> {
    attend_grouped(q, s, kv.rows(), scoring, visible, GROUP_MAX)
}

/// [`attend`] with the query heads of each key/value head taken up to
/// `group` at a time (1: one query per pass, the plain form the tests
/// compare with), rows split over threads where there is enough work.
#[cfg(test)]
fn attend_grouped(
    q: &[f32],
    s: usize,
    kv: KvRows<'_>,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
    group: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; q.len()];
    let per_row = s * scoring.heads * kv.dim;
    let per = rows_per_task(kv.batch, q.len() * kv.len);
    let buf = kv.heads * kv.dim * kv.capacity;
    let tasks: Vec<&mut [f32]> = out.chunks_mut(per * per_row).collect();
    crate::runtime::for_each_task(tasks, |task, out| {
        let (r0, rows) = (task * per, out.len() / per_row);
        let view = KvRows {
            batch: rows,
            k_t: &kv.k_t[r0 * buf..(r0 + rows) * buf],
            v: &kv.v[r0 * buf..(r0 + rows) * buf],
            ..kv
        };
        let q = &q[r0 * per_row..(r0 + rows) * per_row];
        attend_rows(
            q,
            s,
            view,
            scoring,
            &|r, i, j| visible(r0 + r, i, j),
            group,
            out,
        );
    });
    out
}

/// Rows per thread for attention over `batch` rows with `work` query
/// entries × slots: all on one thread below [`PARALLEL_MIN_WORK`].
fn rows_per_task(batch: usize, work: usize) -> usize {
    crate::runtime::rows_per_task(batch, batch > 1 && work >= PARALLEL_MIN_WORK)
}

/// `prepare(first_row, q, k, v)` of [`append_and_attend`]: changes a run of
/// rows' queries, keys and values in place before rotation.
pub(crate) type PrepareRows<'a> = dyn Fn(usize, &mut [f32], &mut [f32], &mut [f32]) + Sync + 'a;

/// Appends this step's keys and values (`[batch, s, kv_heads, dim]`) to
/// `kv` and answers this step's queries (`[batch, s, heads, dim]`) as
/// [`attend`] does; first `prepare(first_row, q, k, v)` may change a run of
/// rows' queries, keys and values in place (the decode step adds LoRA
/// updates there) and `rotate(x, first, heads)` rotates the queries and
/// keys in place (`first`: the index of `x`'s first token among the step's
/// `batch · s`). Each thread rotates, appends and answers its own run of
/// rows, so all of it is one parallel pass (the rotation and the append
/// ran on one thread before). The same values as rotating, [`HostKv::append`]
/// and [`attend`] (tested bit for bit).
pub(crate) fn append_and_attend(
    kv: &mut HostKv,
    (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
    s: usize,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
    prepare: &PrepareRows<'_>,
    rotate: &(dyn Fn(&mut [f32], usize, usize) + Sync),
) -> Vec<f32> {
    kv.reserve(s);
    let (b, h, d, cap, len) = (kv.batch, kv.heads, kv.dim, kv.capacity, kv.len);
    let t = len + s;
    let per_row = s * scoring.heads * d;
    let new = s * h * d;
    let buf = h * d * cap;
    let per = rows_per_task(b, q.len() * t);
    let mut out = vec![0.0f32; q.len()];
    let tasks: Vec<_> = out
        .chunks_mut(per * per_row)
        .zip(q.chunks_mut(per * per_row))
        .zip(k.chunks_mut(per * new).zip(v.chunks_mut(per * new)))
        .zip(kv.k_t.chunks_mut(per * buf).zip(kv.v.chunks_mut(per * buf)))
        .collect();
    crate::runtime::for_each_task(tasks, |task, (((out, q), (k, v)), (k_t, vs))| {
        let (r0, rows) = (task * per, out.len() / per_row);
        prepare(r0, q, k, v);
        rotate(q, r0 * s, scoring.heads);
        rotate(k, r0 * s, h);
        for r in 0..rows {
            write_slots(
                (&mut k_t[r * buf..][..buf], &mut vs[r * buf..][..buf]),
                (&k[r * new..][..new], &v[r * new..][..new]),
                (h, d, cap, len),
            );
        }
        let view = KvRows {
            batch: rows,
            heads: h,
            dim: d,
            capacity: cap,
            len: t,
            k_t,
            v: vs,
        };
        attend_rows(
            q,
            s,
            view,
            scoring,
            &|r, i, j| visible(r0 + r, i, j),
            GROUP_MAX,
            out,
        );
    });
    kv.len = t;
    out
}

/// [`attend_grouped`] of the rows of `kv` (row indices from 0 for
/// `visible`), one after another on the calling thread; `out` and `q`
/// hold those rows only.
fn attend_rows(
    q: &[f32],
    s: usize,
    kv: KvRows<'_>,
    scoring: HostScoring,
    visible: &dyn Fn(usize, usize, usize) -> bool,
    group: usize,
    out: &mut [f32],
) {
    let (d, t) = (kv.dim, kv.len);
    let per_row = s * scoring.heads * d;
    let rep = scoring.heads / kv.heads;
    let prefetch = super::simd::Prefetch::new();
    // Scratch shared by the rows, which run one after another here.
    let mut scores = vec![0.0f32; group.min(rep) * t];
    let mut seen = vec![false; t];
    let mut one_row = |row: usize, out: &mut [f32]| {
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
    for (row, out) in out.chunks_mut(per_row).enumerate() {
        one_row(row, out);
    }
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
            let alone = attend_grouped(&q, s, kv.rows(), sc, &visible, 1);
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

    /// Rotating, appending and attending in one pass per thread gives the
    /// same bits as rotating, [`HostKv::append`] and [`attend`] one after
    /// another, on one thread and on three, through capacity growth.
    #[test]
    fn append_and_attend_equals_its_steps() {
        let (b, kvh, rep, d) = (5, 2, 3, 64);
        let f = |i: usize| ((i * 2654435761) % 2001) as f32 / 1000.0 - 1.0;
        // A stand-in rotation that depends on the token index: x · (1 + first/8).
        let rotate = |x: &mut [f32], first: usize, heads: usize| {
            for (at, v) in x.chunks_exact_mut(heads * d).enumerate() {
                let m = 1.0 + (first + at) as f32 / 8.0;
                v.iter_mut().for_each(|v| *v *= m);
            }
        };
        let sc = HostScoring {
            heads: kvh * rep,
            scale: 0.25,
            softcap: None,
        };
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut one, mut fused) = (HostKv::new(b, kvh, d), HostKv::new(b, kvh, d));
            let mut split = false;
            let steps = [3usize, 1, 2].into_iter().chain([1; 30]);
            for (step, s) in steps.enumerate() {
                let n = b * s * kvh * d;
                let k: Vec<f32> = (0..n).map(|i| f(i + 1000 * step)).collect();
                let v: Vec<f32> = (0..n).map(|i| f(i + 77 + 1000 * step)).collect();
                let q: Vec<f32> = (0..b * s * sc.heads * d)
                    .map(|i| 2.0 * f(i + 31 + 1000 * step))
                    .collect();
                let t = one.len() + s;
                let visible =
                    |row: usize, i: usize, j: usize| j <= t - s + i && !(row == 2 && j == 1);
                let (mut q1, mut k1) = (q.clone(), k.clone());
                rotate(&mut q1, 0, sc.heads);
                rotate(&mut k1, 0, kvh);
                one.append(&k1, &v, s);
                let want = attend(&q1, s, &one, sc, &visible);
                let (mut q2, mut k2, mut v2) = (q, k, v.clone());
                let got = pool.install(|| {
                    let qkv = (&mut q2[..], &mut k2[..], &mut v2[..]);
                    append_and_attend(&mut fused, qkv, s, sc, &visible, &|_, _, _, _| {}, &rotate)
                });
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits())
                );
                assert_eq!(fused.contiguous(), one.contiguous());
                split |= pool.install(|| rows_per_task(b, q2.len() * t)) < b;
            }
            assert_eq!(split, threads > 1, "the rows were split over threads");
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
