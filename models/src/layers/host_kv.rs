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

use super::kv_precision::KvPrecision;
use crate::error::ModelError;

/// Keys and values of one layer, of which the first `len` slots of every
/// (row, head) are filled: keys dimension-major, `[batch, heads, dim,
/// capacity]`, so that one vector holds one coordinate of consecutive keys
/// and a query's scores need no horizontal sums; values `[batch, heads,
/// capacity, dim]`, added slot by slot. Held in f32, or in f16
/// ([`KvPrecision::F16`]: each entry rounded to f16 when written, widened
/// exactly when read).
#[derive(Debug, Clone)]
pub(crate) struct HostKv {
    batch: usize,
    heads: usize,
    dim: usize,
    capacity: usize,
    len: usize,
    store: Store,
}

/// The keys and values of a [`HostKv`], as its precision holds them.
#[derive(Debug, Clone)]
enum Store {
    F32 {
        k_t: Vec<f32>,
        v: Vec<f32>,
    },
    /// Bits of f16 values.
    F16 {
        k_t: Vec<u16>,
        v: Vec<u16>,
    },
}

/// Runs `$body` with `$k` and `$v` bound to the store's two vectors, of
/// either element type.
macro_rules! with_store {
    ($store:expr, |$k:ident, $v:ident| $body:expr) => {
        match $store {
            Store::F32 { k_t: $k, v: $v } => $body,
            Store::F16 { k_t: $k, v: $v } => $body,
        }
    };
}

/// An element of a [`HostKv`]'s vectors: an f32, or the bits of an f16.
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    /// `x` as held (rounded to the nearest f16 for f16).
    fn hold(x: f32) -> Self;
    /// `src` widened into `dst` (exact), of the same length.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `src` itself, where it holds f32 values.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// `src` itself, where it holds the bits of f16 values.
    fn as_f16_bits(src: &[Self]) -> Option<&[u16]>;
}

impl KvElem for f32 {
    #[inline(always)]
    fn hold(x: f32) -> Self {
        x
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
    fn as_f16_bits(_: &[Self]) -> Option<&[u16]> {
        None
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn hold(x: f32) -> Self {
        half::f16::from_f32(x).to_bits()
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        src.reinterpret_cast::<half::f16>()
            .convert_to_f32_slice(dst);
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f16_bits(src: &[Self]) -> Option<&[u16]> {
        Some(src)
    }
}

impl HostKv {
    /// An empty layer for `batch` rows of `heads` heads of width `dim`,
    /// held in `precision`.
    pub(crate) fn new(batch: usize, heads: usize, dim: usize, precision: KvPrecision) -> Self {
        let store = match precision {
            KvPrecision::F32 => Store::F32 {
                k_t: Vec::new(),
                v: Vec::new(),
            },
            KvPrecision::F16 => Store::F16 {
                k_t: Vec::new(),
                v: Vec::new(),
            },
        };
        Self {
            batch,
            heads,
            dim,
            capacity: 0,
            len: 0,
            store,
        }
    }

    /// Filled slots per (row, head).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Rows.
    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// Key/value heads per row.
    pub(crate) fn heads(&self) -> usize {
        self.heads
    }

    /// Width of one head.
    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// How entries are held.
    pub(crate) fn precision(&self) -> KvPrecision {
        match self.store {
            Store::F32 { .. } => KvPrecision::F32,
            Store::F16 { .. } => KvPrecision::F16,
        }
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
        with_store!(&mut self.store, |k_all, v_all| {
            for (row, (k_t, vs)) in k_all
                .chunks_exact_mut(per_row)
                .zip(v_all.chunks_exact_mut(per_row))
                .enumerate()
            {
                let new = s * h * d;
                write_slots(
                    (k_t, vs),
                    (&k[row * new..][..new], &v[row * new..][..new]),
                    (h, d, cap, len),
                );
            }
        });
        self.len += s;
    }

    /// Makes room for `s` more slots per (row, head).
    fn reserve(&mut self, s: usize) {
        let need = self.len + s;
        if need > self.capacity {
            self.grow((2 * need).max(16));
        }
    }

    /// Moves the filled slots into buffers of `capacity` (at least `len`) slots.
    fn grow(&mut self, capacity: usize) {
        let (b, h, d, len, old) = (self.batch, self.heads, self.dim, self.len, self.capacity);
        with_store!(&mut self.store, |k_t, v| {
            *k_t = moved(k_t, b * h * d, (old, capacity), len, 0);
            *v = moved(v, b * h, (old * d, capacity * d), len * d, 0);
        });
        self.capacity = capacity;
    }

    /// Adds the rows of `other` after this layer's rows. Rows are aligned
    /// at their last filled slot: the layer with fewer slots gets zero
    /// slots at the front of each row, so that both hold `max(len)` (the
    /// caller records those slots as masked padding). An error where the
    /// two differ in heads, head width or precision; `self` is then
    /// unchanged.
    pub(crate) fn append_rows(&mut self, other: &HostKv) -> Result<(), ModelError> {
        let own = (self.heads, self.dim, self.precision());
        let mismatch = || {
            ModelError::CacheMismatch(format!(
                "host-held layers of {} heads of width {} in {:?} and of {} heads of width {} in {:?}",
                own.0,
                own.1,
                own.2,
                other.heads,
                other.dim,
                other.precision()
            ))
        };
        if (self.heads, self.dim) != (other.heads, other.dim) {
            return Err(mismatch());
        }
        let len = self.len.max(other.len);
        let capacity = self.capacity.max(other.capacity).max(len);
        let shape = (self.heads, self.dim, capacity, len);
        let (mine, theirs) = (
            (self.batch, self.capacity, self.len),
            (other.batch, other.capacity, other.len),
        );
        match (&mut self.store, &other.store) {
            (Store::F32 { k_t, v }, Store::F32 { k_t: ok, v: ov }) => {
                append_relaid((k_t, v), (ok, ov), mine, theirs, shape);
            }
            (Store::F16 { k_t, v }, Store::F16 { k_t: ok, v: ov }) => {
                append_relaid((k_t, v), (ok, ov), mine, theirs, shape);
            }
            _ => return Err(mismatch()),
        }
        self.batch += other.batch;
        self.capacity = capacity;
        self.len = len;
        Ok(())
    }

    /// Keeps slots `keep` (ascending, each below `len`) of every (row,
    /// head), in that order, and zeroes the slots they leave. The buffers
    /// shrink when they would hold more than four times the slots kept (32
    /// at least), so a batch whose long rows left does not keep their room.
    pub(crate) fn keep_slots(&mut self, keep: &[usize]) {
        debug_assert!(keep.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(keep.last().is_none_or(|&j| j < self.len));
        let (d, cap, len, kept) = (self.dim, self.capacity, self.len, keep.len());
        with_store!(&mut self.store, |k_t, v| {
            // `keep[i] ≥ i`, so moving slots forward in order reads each
            // slot before it is overwritten.
            for chunk in k_t.chunks_exact_mut(cap.max(1)) {
                for (i, &j) in keep.iter().enumerate() {
                    chunk[i] = chunk[j];
                }
                chunk[kept..len].fill(Default::default());
            }
            for chunk in v.chunks_exact_mut((cap * d).max(1)) {
                for (i, &j) in keep.iter().enumerate() {
                    chunk.copy_within(j * d..(j + 1) * d, i * d);
                }
                chunk[kept * d..len * d].fill(Default::default());
            }
        });
        self.len = kept;
        let roomy = (2 * kept).max(16);
        if self.capacity > 2 * roomy {
            self.grow(roomy);
        }
    }

    /// Keys and values as contiguous `[batch, heads, len, dim]` f32 vectors.
    pub(crate) fn contiguous(&self) -> (Vec<f32>, Vec<f32>) {
        let (b, h, d, len, cap) = (self.batch, self.heads, self.dim, self.len, self.capacity);
        let mut k = Vec::with_capacity(b * h * len * d);
        let mut v = vec![0.0f32; b * h * len * d];
        with_store!(&self.store, |k_all, v_all| {
            let mut k_t = vec![0.0f32; d * len];
            for (bh, v) in v.chunks_exact_mut((len * d).max(1)).enumerate() {
                let group = (&k_all[bh * d * cap..], &v_all[bh * cap * d..]);
                widen_filled(group, (cap, len, d), (&mut k_t, v));
                for j in 0..len {
                    k.extend((0..d).map(|c| k_t[c * len + j]));
                }
            }
        });
        (k, v)
    }

    /// Keeps rows `keep` (in range, checked by the caller), in that order.
    pub(crate) fn select_rows(&mut self, keep: &[usize]) {
        let per_row = self.heads * self.capacity * self.dim;
        with_store!(&mut self.store, |k_t, v| {
            for buf in [k_t, v] {
                let mut next = Vec::with_capacity(keep.len() * per_row);
                for &r in keep {
                    next.extend_from_slice(&buf[r * per_row..(r + 1) * per_row]);
                }
                *buf = next;
            }
        });
        self.batch = keep.len();
    }
}

/// One (row, head)'s filled slots widened to f32: `k_all: [dim, capacity]`
/// into `k_t: [dim, t]`, and `v_all: [t, dim]` (or more) into `v`.
fn widen_filled<E: KvElem>(
    (k_all, v_all): (&[E], &[E]),
    (capacity, t, d): (usize, usize, usize),
    (k_t, v): (&mut [f32], &mut [f32]),
) {
    for (c, wide) in k_t.chunks_exact_mut(t.max(1)).enumerate() {
        E::widen(&k_all[c * capacity..][..t], wide);
    }
    E::widen(&v_all[..t * d], &mut v[..t * d]);
}

/// `chunks` chunks of `from` (each `sizes.0` long, the first `filled`
/// entries kept) moved into chunks of `sizes.1`, at offset `at` of each,
/// the rest zero.
fn moved<E: KvElem>(
    from: &[E],
    chunks: usize,
    (old, new): (usize, usize),
    filled: usize,
    at: usize,
) -> Vec<E> {
    let mut to = vec![E::default(); chunks * new];
    for (to, from) in to
        .chunks_exact_mut(new.max(1))
        .zip(from.chunks_exact(old.max(1)))
    {
        to[at..at + filled].copy_from_slice(&from[..filled]);
    }
    to
}

/// [`HostKv::append_rows`] on the store's vectors: `own` and `theirs` are
/// (rows, capacity, filled slots) of the two sides, `shape` (heads, dim,
/// capacity, filled slots) of the result. Each side's filled slots end at
/// the result's last filled slot; the vectors are rebuilt only where they
/// change.
fn append_relaid<E: KvElem>(
    (k_t, v): (&mut Vec<E>, &mut Vec<E>),
    (their_k, their_v): (&[E], &[E]),
    own: (usize, usize, usize),
    theirs: (usize, usize, usize),
    (h, d, capacity, len): (usize, usize, usize, usize),
) {
    let relaid = |(k, v): (&[E], &[E]), (rows, cap, filled): (usize, usize, usize)| {
        let pad = len - filled;
        (
            moved(k, rows * h * d, (cap, capacity), filled, pad),
            moved(v, rows * h, (cap * d, capacity * d), filled * d, pad * d),
        )
    };
    if (own.1, own.2) != (capacity, len) {
        (*k_t, *v) = relaid((&k_t[..], &v[..]), own);
    }
    let (k_new, v_new) = relaid((their_k, their_v), theirs);
    k_t.extend_from_slice(&k_new);
    v.extend_from_slice(&v_new);
}

/// Writes one row's new keys and values, `[s, heads, dim]` each, into its
/// slots `len..len + s` of `k_t: [heads, dim, capacity]` and `v: [heads,
/// capacity, dim]`, each entry as held.
fn write_slots<E: KvElem>(
    (k_t, v): (&mut [E], &mut [E]),
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
            for (to, x) in v[to..to + d].iter_mut().zip(&v_tok[head * d..][..d]) {
                *to = E::hold(*x);
            }
            let kt = &mut k_t[head * d * cap..][..d * cap];
            for (c, x) in k_tok[head * d..][..d].iter().enumerate() {
                kt[c * cap + slot] = E::hold(*x);
            }
        }
    }
}

/// The filled slots of consecutive rows of a [`HostKv`] (all of them, or
/// one thread's share), read-only: what attention reads.
#[derive(Debug, Clone, Copy)]
struct KvRows<'a, E> {
    batch: usize,
    heads: usize,
    dim: usize,
    capacity: usize,
    len: usize,
    k_t: &'a [E],
    v: &'a [E],
}

impl<E: KvElem> KvRows<'_, E> {
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
        // Entries per cache line.
        let line = 64 / size_of::<E>();
        if group >= self.batch * self.heads || parts == 0 {
            return;
        }
        let (d, cap, t) = (self.dim, self.capacity, self.len);
        let per_dim = t.div_ceil(line);
        let k_lines = d * per_dim;
        let total = k_lines + (t * d).div_ceil(line);
        let k_t = &self.k_t[group * d * cap..][..d * cap];
        let v = &self.v[group * cap * d..][..t * d];
        for l in share.start * total / parts..share.end * total / parts {
            if l < k_lines {
                prefetch.line(k_t, (l / per_dim) * cap + (l % per_dim) * line);
            } else {
                prefetch.line(v, (l - k_lines) * line);
            }
        }
    }
}

impl HostKv {
    /// The filled slots of every row, read-only, with the store's vectors.
    #[cfg(test)]
    fn rows<'a, E>(&self, k_t: &'a [E], v: &'a [E]) -> KvRows<'a, E> {
        KvRows {
            batch: self.batch,
            heads: self.heads,
            dim: self.dim,
            capacity: self.capacity,
            len: self.len,
            k_t,
            v,
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
    with_store!(&kv.store, |k_t, v| {
        attend_grouped(q, s, kv.rows(k_t, v), scoring, visible, GROUP_MAX)
    })
}

/// [`attend`] with the query heads of each key/value head taken up to
/// `group` at a time (1: one query per pass, the plain form the tests
/// compare with), rows split over threads where there is enough work.
#[cfg(test)]
fn attend_grouped<E: KvElem>(
    q: &[f32],
    s: usize,
    kv: KvRows<'_, E>,
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
    with_store!(&mut kv.store, |k_all, v_all| {
        let tasks: Vec<_> = out
            .chunks_mut(per * per_row)
            .zip(q.chunks_mut(per * per_row))
            .zip(k.chunks_mut(per * new).zip(v.chunks_mut(per * new)))
            .zip(k_all.chunks_mut(per * buf).zip(v_all.chunks_mut(per * buf)))
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
    });
    kv.len = t;
    out
}

/// [`attend_grouped`] of the rows of `kv` (row indices from 0 for
/// `visible`), one after another on the calling thread; `out` and `q`
/// hold those rows only.
fn attend_rows<E: KvElem>(
    q: &[f32],
    s: usize,
    kv: KvRows<'_, E>,
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
    // How each (row, head)'s keys and values are read: f32 as held; f16
    // widened in registers on AVX-512, else widened here first (exactly),
    // into scratch the f32 passes then read.
    #[cfg(target_arch = "x86_64")]
    let half_v4 = E::as_f16_bits(kv.k_t)
        .zip(E::as_f16_bits(kv.v))
        .zip(pulp::x86::V4::try_new());
    #[cfg(all(test, target_arch = "x86_64"))]
    let half_v4 =
        half_v4.filter(|_| !tests::WIDEN_FIRST.load(std::sync::atomic::Ordering::Relaxed));
    let held_f32 = E::as_f32(kv.k_t).zip(E::as_f32(kv.v));
    let (mut wide_k, mut wide_v) = (Vec::new(), Vec::new());
    let mut one_row = |row: usize, out: &mut [f32]| {
        for i in 0..s {
            for (j, v) in seen.iter_mut().enumerate() {
                *v = visible(row, i, j);
            }
            for g in 0..kv.heads {
                let base = (row * kv.heads + g) * kv.capacity * d;
                #[cfg(target_arch = "x86_64")]
                let half = half_v4.map(|((k_t, v), v4)| {
                    let kv = half_kv::HalfKv {
                        k_t: &k_t[base..base + kv.capacity * d],
                        capacity: kv.capacity,
                        t,
                        v: &v[base..base + t * d],
                        d,
                    };
                    Source::Half(v4, kv)
                });
                #[cfg(not(target_arch = "x86_64"))]
                let half: Option<Source<'_>> = None;
                let source = match (half, held_f32) {
                    (Some(half), _) => half,
                    (None, Some((k_t, v))) => {
                        Source::F32(F32Kv::new(&k_t[base..], kv.capacity, &v[base..], (t, d)))
                    }
                    (None, None) => {
                        wide_k.resize(d * t, 0.0);
                        wide_v.resize(t * d, 0.0);
                        let group = (&kv.k_t[base..], &kv.v[base..]);
                        widen_filled(group, (kv.capacity, t, d), (&mut wide_k, &mut wide_v));
                        Source::F32(F32Kv::new(&wide_k, t, &wide_v, (t, d)))
                    }
                };
                let mut head = g * rep;
                while head < (g + 1) * rep {
                    let n = ((g + 1) * rep - head).min(group);
                    // The next key/value head's slots (of this row, else of
                    // the next) are fetched while this one is used: a share
                    // of them before each pass.
                    let share = head - g * rep;
                    kv.prefetch_share(prefetch, row * kv.heads + g + 1, share..share + n, rep);
                    let at = (i * scoring.heads + head) * d;
                    let parts = (
                        &q[row * per_row + at..][..n * d],
                        &seen[..],
                        &mut scores[..n * t],
                        &mut out[at..at + n * d],
                    );
                    match n {
                        1 => answer_group::<1>(source, scoring, parts),
                        2 => answer_group::<2>(source, scoring, parts),
                        3 => answer_group::<3>(source, scoring, parts),
                        _ => answer_group::<4>(source, scoring, parts),
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

/// Where one (row, key/value head)'s keys and values are read from.
#[derive(Clone, Copy)]
enum Source<'a> {
    F32(F32Kv<'a>),
    #[cfg(target_arch = "x86_64")]
    Half(pulp::x86::V4, half_kv::HalfKv<'a>),
}

/// `Q` query heads (`q`, with `seen`, `scores` scratch and `out` as in
/// [`Queries`]) answered over `source`.
fn answer_group<const Q: usize>(
    source: Source<'_>,
    scoring: HostScoring,
    (q, seen, scores, out): (&[f32], &[bool], &mut [f32], &mut [f32]),
) {
    match source {
        Source::F32(kv) => pulp::Arch::new().dispatch(Group::<Q>(Queries {
            q,
            kv,
            seen,
            scoring,
            scores,
            out,
        })),
        #[cfg(target_arch = "x86_64")]
        Source::Half(v4, kv) => v4.vectorize(half_kv::Group::<Q> {
            v4,
            query: Queries {
                q,
                kv,
                seen,
                scoring,
                scores,
                out,
            },
        }),
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
/// against `t` slots of `kv`; `scores` is `[Q, t]` scratch, `out` is
/// `[Q, dim]`.
struct Queries<'a, R> {
    q: &'a [f32],
    kv: R,
    seen: &'a [bool],
    scoring: HostScoring,
    scores: &'a mut [f32],
    out: &'a mut [f32],
}

/// One (row, key/value head)'s keys (`[dim, capacity]`) and values (`[t,
/// dim]`) as the attention passes read them, widened to f32.
trait KvRead<S: Simd>: Copy {
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
struct F32Kv<'a> {
    k_t: &'a [f32],
    capacity: usize,
    t: usize,
    v: &'a [f32],
    d: usize,
}

impl<'a> F32Kv<'a> {
    /// The keys `k_t: [dim, capacity]` and values `v: [t, dim]` at the
    /// start of the given slices.
    fn new(k_t: &'a [f32], capacity: usize, v: &'a [f32], (t, d): (usize, usize)) -> Self {
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
struct Group<'a, const Q: usize>(Queries<'a, F32Kv<'a>>);

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
fn answer<S: Simd, R: KvRead<S>, const Q: usize>(simd: S, query: Queries<'_, R>) {
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

#[cfg(target_arch = "x86_64")]
mod half_kv {
    //! Keys and values held in f16, read on AVX-512: each vector widened
    //! by `vcvtph2ps` (exact) right where [`super::answer`] uses it, so the
    //! attention is bit for bit that of an f32 cache holding the same
    //! values, with half the bytes read.

    use pulp::x86::V4;

    use super::{KvRead, Queries, answer};

    /// Entries of a vector.
    const LANES: usize = 16;

    /// Keys `[dim, capacity]` and values `[t, dim]` as f16 bits.
    #[derive(Clone, Copy)]
    pub(super) struct HalfKv<'a> {
        pub k_t: &'a [u16],
        pub capacity: usize,
        pub t: usize,
        pub v: &'a [u16],
        pub d: usize,
    }

    #[inline(always)]
    fn widen(simd: V4, h: [u16; LANES]) -> pulp::f32x16 {
        pulp::bytemuck::cast(simd.avx512f._mm512_cvtph_ps(pulp::bytemuck::cast(h)))
    }

    impl KvRead<V4> for HalfKv<'_> {
        #[inline(always)]
        fn keys(self, simd: V4, c: usize, j: usize) -> pulp::f32x16 {
            let row = &self.k_t[c * self.capacity..(c + 1) * self.capacity];
            if j >= self.t {
                return pulp::bytemuck::cast([0.0f32; LANES]);
            }
            let mut h = [0u16; LANES];
            let n = (row.len() - j).min(LANES);
            h[..n].copy_from_slice(&row[j..j + n]);
            widen(simd, h)
        }
        #[inline(always)]
        fn value(self, simd: V4, j: usize, i: usize) -> pulp::f32x16 {
            let at = j * self.d + i * LANES;
            widen(simd, self.v[at..at + LANES].try_into().expect("16 entries"))
        }
        #[inline(always)]
        fn value_at(self, j: usize, c: usize) -> f32 {
            half::f16::from_bits(self.v[j * self.d + c]).to_f32()
        }
    }

    /// [`Queries`] of `Q` heads answered over f16 keys and values.
    pub(super) struct Group<'a, const Q: usize> {
        pub v4: V4,
        pub query: Queries<'a, HalfKv<'a>>,
    }

    impl<const Q: usize> pulp::NullaryFnOnce for Group<'_, Q> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            answer::<V4, HalfKv<'_>, Q>(self.v4, self.query);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Makes f16 caches take the widen-first path even on AVX-512 (the
    /// path of CPUs without it). Other tests may run meanwhile: both paths
    /// give the same bits, which is what the test that sets it checks.
    pub(super) static WIDEN_FIRST: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Multiples of 10⁻³ in `[-range, range]`, from a xorshift stream.
    fn draws(seed: u64, range: u64) -> impl FnMut() -> f32 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (2000 * range + 1)) as f32 / 1000.0 - range as f32
        }
    }

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
            precision in prop::sample::select(vec![KvPrecision::F32, KvPrecision::F16]),
            seed in any::<u64>(),
        ) {
            let mut next = draws(seed, 1);
            let mut kv = HostKv::new(b, kvh, d, precision);
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
            let alone = with_store!(&kv.store, |k_t, v| {
                attend_grouped(&q, s, kv.rows(k_t, v), sc, &visible, 1)
            });
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
        for (threads, precision) in [
            (1, KvPrecision::F32),
            (3, KvPrecision::F32),
            (1, KvPrecision::F16),
            (3, KvPrecision::F16),
        ] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut one, mut fused) = (
                HostKv::new(b, kvh, d, precision),
                HostKv::new(b, kvh, d, precision),
            );
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

    /// Keeping few of many slots gives back the room past four times
    /// them; appends after it grow again as usual.
    #[test]
    fn keep_slots_shrinks_roomy_buffers() {
        for precision in [KvPrecision::F32, KvPrecision::F16] {
            let mut kv = HostKv::new(2, 1, 4, precision);
            let k: Vec<f32> = (0..2 * 40 * 4).map(|i| (i % 50) as f32).collect();
            kv.append(&k, &k, 40);
            assert_eq!(kv.capacity, 80);
            kv.keep_slots(&[1, 39]);
            assert_eq!((kv.len(), kv.capacity), (2, 16));
            let (keys, _) = kv.contiguous();
            let slot = |row: usize, j: usize| &k[(row * 40 + j) * 4..][..4];
            assert_eq!(
                keys,
                [slot(0, 1), slot(0, 39), slot(1, 1), slot(1, 39)].concat()
            );
            kv.keep_slots(&[0, 1]);
            assert_eq!((kv.len(), kv.capacity), (2, 16));
            kv.append(&k[..2 * 30 * 4], &k[..2 * 30 * 4], 30);
            assert_eq!((kv.len(), kv.capacity), (32, 64));
        }
    }

    #[test]
    fn select_rows_keeps_the_named_rows() {
        for precision in [KvPrecision::F32, KvPrecision::F16] {
            let mut kv = HostKv::new(3, 1, 2, precision);
            let k: Vec<f32> = (0..6).map(|i| i as f32).collect();
            kv.append(&k, &k, 1);
            kv.select_rows(&[2, 0]);
            assert_eq!(kv.contiguous().0, vec![4.0, 5.0, 0.0, 1.0]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Rows joined into one layer (the shorter side padded at the
        /// front with zero slots that no query sees) attend bit for bit as
        /// in their own layer; dropping the other side's rows and the slots
        /// no row holds gives back their own layer, attention included.
        #[test]
        fn joined_rows_attend_as_in_their_own_layer(
            sizes in (1usize..4, 1usize..4),
            kvh in 1usize..3,
            rep in 1usize..4,
            d in prop::sample::select(vec![4usize, 16, 20]),
            steps in (
                prop::collection::vec(1usize..24, 1..4),
                prop::collection::vec(1usize..24, 1..4),
            ),
            precision in prop::sample::select(vec![KvPrecision::F32, KvPrecision::F16]),
            seed in any::<u64>(),
        ) {
            let mut next = draws(seed, 1);
            let mut build = |b: usize, steps: &[usize]| {
                let mut kv = HostKv::new(b, kvh, d, precision);
                for &n in steps {
                    let k: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                    let v: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                    kv.append(&k, &v, n);
                }
                kv
            };
            let parts = [build(sizes.0, &steps.0), build(sizes.1, &steps.1)];
            let mut joined = parts[0].clone();
            joined.append_rows(&parts[1]).unwrap();
            let t = joined.len();
            prop_assert_eq!((joined.batch, t), (sizes.0 + sizes.1, parts[0].len.max(parts[1].len)));
            let sc = HostScoring { heads: kvh * rep, scale: 0.3, softcap: None };
            let per_row = sc.heads * d;
            let q: Vec<f32> = (0..joined.batch * per_row).map(|_| 3.0 * next()).collect();
            // Each part's own mask: some slots hidden, the last always seen.
            let own = |row: usize, j: usize, len: usize| j + 1 == len || !(row + j).is_multiple_of(3);
            let got = attend(&q, 1, &joined, sc, &|row, _, j| {
                let (row, kv) = if row < sizes.0 { (row, &parts[0]) } else { (row - sizes.0, &parts[1]) };
                let pad = t - kv.len;
                j >= pad && own(row, j - pad, kv.len)
            });
            let mut first = 0;
            for kv in &parts {
                let q = &q[first * per_row..(first + kv.batch) * per_row];
                let want = attend(q, 1, kv, sc, &|row, _, j| own(row, j, kv.len));
                let got = &got[first * per_row..(first + kv.batch) * per_row];
                prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()));
                first += kv.batch;
            }
            // The second part alone again: its rows, then its slots.
            let mut second = joined.clone();
            second.select_rows(&(sizes.0..sizes.0 + sizes.1).collect::<Vec<_>>());
            second.keep_slots(&(t - parts[1].len..t).collect::<Vec<_>>());
            prop_assert_eq!(second.contiguous(), parts[1].contiguous());
            let q = &q[sizes.0 * per_row..];
            let visible = |row: usize, _: usize, j: usize| own(row, j, parts[1].len);
            let (a, b) = (attend(q, 1, &second, sc, &visible), attend(q, 1, &parts[1], sc, &visible));
            prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }

        /// An f16 cache holds each key and value rounded to the nearest f16
        /// (in half the memory) and answers exactly, bit for bit, what an
        /// f32 cache answers over those rounded values, through capacity
        /// growth and row selection.
        #[test]
        fn f16_cache_equals_f32_cache_of_rounded_values(
            b in 1usize..4,
            kvh in 1usize..3,
            rep in 1usize..5,
            d in prop::sample::select(vec![4usize, 20, 64]),
            steps in prop::collection::vec(1usize..40, 1..4),
            seed in any::<u64>(),
        ) {
            let mut next = draws(seed, 100);
            let round = |v: &[f32]| -> Vec<f32> {
                v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
            };
            let (mut half, mut single) = (
                HostKv::new(b, kvh, d, KvPrecision::F16),
                HostKv::new(b, kvh, d, KvPrecision::F32),
            );
            let mut moved = false;
            for &n in &steps {
                let k: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                let v: Vec<f32> = (0..b * n * kvh * d).map(|_| next()).collect();
                half.append(&k, &v, n);
                single.append(&round(&k), &round(&v), n);
                moved |= round(&k) != k;
            }
            prop_assert!(moved, "some entry was not an f16 already");
            if b > 1 {
                half.select_rows(&[b - 1, 0]);
                single.select_rows(&[b - 1, 0]);
            }
            let (Store::F16 { k_t: hk, .. }, Store::F32 { k_t: sk, .. }) = (&half.store, &single.store) else {
                unreachable!()
            };
            prop_assert_eq!(hk.len(), sk.len());
            prop_assert_eq!(half.contiguous(), single.contiguous());
            let t = half.len();
            let sc = HostScoring { heads: kvh * rep, scale: 0.02, softcap: None };
            let rows = b.min(2);
            let q: Vec<f32> = (0..rows * sc.heads * d).map(|_| next() / 50.0).collect();
            let visible = |row: usize, _: usize, j: usize| j + row < t;
            let want = attend(&q, 1, &single, sc, &visible);
            for widen_first in [false, true] {
                WIDEN_FIRST.store(widen_first, std::sync::atomic::Ordering::Relaxed);
                let got = attend(&q, 1, &half, sc, &visible);
                WIDEN_FIRST.store(false, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()));
            }
        }
    }
}
