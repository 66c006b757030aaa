//! Attention of a few queries per row over keys and values held in host
//! memory (plain burn-flex's decode steps): the kernel over the layout
//! that `layers::host_kv` stores (keys dimension-major, `[batch, heads,
//! dim, capacity]`, so that one vector holds one coordinate of consecutive
//! keys and a query's scores need no horizontal sums; values `[batch,
//! heads, capacity, dim]`, added slot by slot; entries f32 or f16).
//!
//! Why: with burn's tensor ops a decode step copies the whole cache to
//! append one slot, and its attention is two tiny `gemm` calls per (row,
//! key/value head), each paying gemm's packing and dispatch. Here a step
//! writes only its own slots, and the few queries of a decode step are
//! answered by one pass over the visible slots.
//!
//! The query heads that share a key/value head (grouped-query attention)
//! are answered together, so each key and value vector is loaded once for
//! all of them, and the next key/value head's slots are prefetched while
//! one is in use: an ensemble step reads every row's cache from memory at
//! every layer.
//!
//! Semantics are those of the tensor path (HF eager attention): scores
//! `q·k · scale`, optional soft-capping `cap·tanh(s/cap)`, masked scores set
//! to `f32::MIN`, softmax in f32, then the probability-weighted sum of
//! values. Masked slots get probability exactly 0 there too (`exp(f32::MIN −
//! max)` underflows), except when every slot is masked, where both give the
//! uniform average. Only the order of the f32 sums differs.

mod answer;
#[cfg(target_arch = "x86_64")]
mod avx512_f16;

use self::answer::{F32Kv, Group, Queries};
use super::simd::Prefetch;

/// An element of a cache's key and value vectors: an f32, or the bits of
/// an f16 (held rounded to the nearest f16, widened exactly when read).
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Each entry of `src` as held into `dst` (of the same length): as is for
    /// f32, rounded to the nearest f16 (ties to even) for f16.
    fn hold_slice(src: &[f32], dst: &mut [Self]);
    /// `src` widened into `dst` (exact), of the same length.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `src` itself, where it holds f32 values.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// `src` itself, where it holds the bits of f16 values.
    fn as_f16_bits(src: &[Self]) -> Option<&[u16]>;
}

impl KvElem for f32 {
    fn hold_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
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
    fn hold_slice(src: &[f32], dst: &mut [Self]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        // half's slice conversion rounds as `f16::from_f32` does.
        dst.reinterpret_cast_mut::<half::f16>()
            .convert_from_f32_slice(src);
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

/// One (row, head)'s filled slots widened to f32: `k_all: [dim, capacity]`
/// into `k_t: [dim, t]`, and `v_all: [t, dim]` (or more) into `v`.
pub(crate) fn widen_filled<E: KvElem>(
    (k_all, v_all): (&[E], &[E]),
    (capacity, t, d): (usize, usize, usize),
    (k_t, v): (&mut [f32], &mut [f32]),
) {
    for (c, wide) in k_t.chunks_exact_mut(t.max(1)).enumerate() {
        E::widen(&k_all[c * capacity..][..t], wide);
    }
    E::widen(&v_all[..t * d], &mut v[..t * d]);
}

/// Writes one row's new keys and values, `[s, heads, dim]` each, into its
/// slots `len..len + s` of `k_t: [heads, dim, capacity]` and `v: [heads,
/// capacity, dim]`, each entry as held.
pub(crate) fn write_slots<E: KvElem>(
    (k_t, v): (&mut [E], &mut [E]),
    (k_new, v_new): (&[f32], &[f32]),
    (heads, d, cap, len): (usize, usize, usize, usize),
) {
    // A token's keys as held, then scattered one coordinate per line of `k_t`.
    let mut held = vec![E::default(); heads * d];
    for (i, (k_tok, v_tok)) in k_new
        .chunks_exact(heads * d)
        .zip(v_new.chunks_exact(heads * d))
        .enumerate()
    {
        let slot = len + i;
        E::hold_slice(k_tok, &mut held);
        for head in 0..heads {
            let to = (head * cap + slot) * d;
            E::hold_slice(&v_tok[head * d..][..d], &mut v[to..to + d]);
            let kt = &mut k_t[head * d * cap..][..d * cap];
            for (c, x) in held[head * d..][..d].iter().enumerate() {
                kt[c * cap + slot] = *x;
            }
        }
    }
}

/// The filled slots of consecutive rows of a cache layer (all of them, or
/// one thread's share), read-only: what attention reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvRows<'a, E> {
    pub batch: usize,
    pub heads: usize,
    pub dim: usize,
    pub capacity: usize,
    pub len: usize,
    pub k_t: &'a [E],
    pub v: &'a [E],
}

impl<E: KvElem> KvRows<'_, E> {
    /// Prefetches parts `share` of `parts` equal parts of the filled slots
    /// of (row, head) `group` (`row · heads + head`; nothing past the last
    /// one): the lines of each key coordinate's filled slots, then of the
    /// values.
    fn prefetch_share(
        &self,
        prefetch: Prefetch,
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

pub(crate) use answer::HostScoring;

/// Attention calls with at least this many query entries × slots run rows
/// in parallel.
const ATTENTION_PARALLEL_MIN_WORK: usize = 1 << 15;

/// Most query heads of one key/value head answered in one pass over its
/// keys and values (4 queries × `SWEEP` score vectors, or 4 queries × 4
/// output vectors, are 16 accumulators).
pub(crate) const GROUP_MAX: usize = 4;

/// Makes f16 caches take the widen-first path even on AVX-512 (the path of
/// CPUs without it), for the tests that compare the two. Other tests may
/// run meanwhile: both paths give the same bits.
#[cfg(test)]
pub(crate) static WIDEN_FIRST: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// One layer's keys and values, writable: `batch` rows of `heads` heads of
/// width `dim`, `capacity` slots each, of which `len` are filled.
pub(crate) struct KvRowsMut<'a, E> {
    pub batch: usize,
    pub heads: usize,
    pub dim: usize,
    pub capacity: usize,
    pub len: usize,
    pub k_t: &'a mut [E],
    pub v: &'a mut [E],
}

/// Attention (as `layers::host_kv`'s `attend`) with the query heads of each key/value head taken up to
/// `group` at a time (1: one query per pass, the plain form the tests
/// compare with), rows split over threads where there is enough work.
#[cfg(test)]
pub(crate) fn attend_grouped<E: KvElem>(
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
/// entries × slots: all on one thread below [`ATTENTION_PARALLEL_MIN_WORK`].
pub(crate) fn rows_per_task(batch: usize, work: usize) -> usize {
    crate::runtime::rows_per_task(batch, batch > 1 && work >= ATTENTION_PARALLEL_MIN_WORK)
}

/// `prepare(first_row, q, k, v)` of [`append_and_attend`]: changes a run of
/// rows' queries, keys and values in place before rotation.
pub(crate) type PrepareRows<'a> = dyn Fn(usize, &mut [f32], &mut [f32], &mut [f32]) + Sync + 'a;

/// Appends this step's keys and values (`[batch, s, kv_heads, dim]`) to
/// the layer `kv` (whose capacity holds them) and answers this step's
/// queries (`[batch, s, heads, dim]`) over its `len + s` slots;
/// `visible(row, i, slot)` says whether query `i` of `row` may attend to
/// `slot`. First `prepare(first_row, q, k, v)` may change a run of rows'
/// queries, keys and values in place (the decode step adds LoRA updates
/// there) and `rotate(x, first, heads)` rotates the queries and keys in
/// place (`first`: the index of `x`'s first token among the step's `batch
/// · s`). Each thread rotates, appends and answers its own run of rows, so
/// all of it is one parallel pass. Returns `[batch, s, heads, dim]`: the
/// same values as rotating, appending and [`attend_grouped`] (tested bit
/// for bit).
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_and_attend<E: KvElem>(
    kv: KvRowsMut<'_, E>,
    (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
    s: usize,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
    prepare: &PrepareRows<'_>,
    rotate: &(dyn Fn(&mut [f32], usize, usize) + Sync),
) -> Vec<f32> {
    let KvRowsMut {
        batch: b,
        heads: h,
        dim: d,
        capacity: cap,
        len,
        k_t: k_all,
        v: v_all,
    } = kv;
    debug_assert!(len + s <= cap);
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
        .zip(k_all.chunks_mut(per * buf).zip(v_all.chunks_mut(per * buf)))
        .collect();
    crate::runtime::for_each_task(tasks, |task, (((out, q), (k, v)), (k_t, vs))| {
        let (r0, rows) = (task * per, out.len() / per_row);
        prepare(r0, q, k, v);
        rotate(q, r0 * s, scoring.heads);
        rotate(k, r0 * s, h);
        // Row by row, each row's new slots written just before its attention reads
        // them: the lines of the keys' slots, one per coordinate, are then still in
        // cache (writing every row's first left them evicted by the attention).
        for r in 0..rows {
            let (k_t, vs) = (&mut k_t[r * buf..][..buf], &mut vs[r * buf..][..buf]);
            write_slots(
                (&mut *k_t, &mut *vs),
                (&k[r * new..][..new], &v[r * new..][..new]),
                (h, d, cap, len),
            );
            let view = KvRows {
                batch: 1,
                heads: h,
                dim: d,
                capacity: cap,
                len: t,
                k_t,
                v: vs,
            };
            attend_rows(
                &q[r * per_row..][..per_row],
                s,
                view,
                scoring,
                &|_, i, j| visible(r0 + r, i, j),
                GROUP_MAX,
                &mut out[r * per_row..][..per_row],
            );
        }
    });
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
    let prefetch = Prefetch::new();
    // Scratch shared by the rows, which run one after another here.
    let mut scores = vec![0.0f32; group.min(rep) * t];
    let mut seen = vec![false; t];
    // How each (row, head)'s keys and values are read: f32 as held; f16
    // widened in registers where the detected instruction set has AVX-512
    // (`dispatch::avx512`), else widened here first (exactly),
    // into scratch the f32 passes then read.
    #[cfg(target_arch = "x86_64")]
    let half_v4 = E::as_f16_bits(kv.k_t)
        .zip(E::as_f16_bits(kv.v))
        .zip(super::dispatch::avx512());
    #[cfg(all(test, target_arch = "x86_64"))]
    let half_v4 = half_v4.filter(|_| !WIDEN_FIRST.load(std::sync::atomic::Ordering::Relaxed));
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
                    let kv = avx512_f16::HalfKv {
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
    Half(pulp::x86::V4, avx512_f16::HalfKv<'a>),
}

/// `Q` query heads (`q`, with `seen`, `scores` scratch and `out` as in
/// [`Queries`]) answered over `source`.
fn answer_group<const Q: usize>(
    source: Source<'_>,
    scoring: HostScoring,
    (q, seen, scores, out): (&[f32], &[bool], &mut [f32], &mut [f32]),
) {
    match source {
        Source::F32(kv) => super::dispatch::vectorize(Group::<Q>(Queries {
            q,
            kv,
            seen,
            scoring,
            scores,
            out,
        })),
        #[cfg(target_arch = "x86_64")]
        Source::Half(v4, kv) => v4.vectorize(avx512_f16::Group::<Q> {
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
