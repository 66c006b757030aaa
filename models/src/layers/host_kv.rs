//! Keys and values held in host memory (plain burn-flex only): a layer's
//! keys and values live in two `Vec`s with spare capacity, and a step
//! writes only its own slots. The attention over them is
//! [`crate::cpu::attention`]'s kernel.

use super::kv_precision::KvPrecision;
#[cfg(test)]
use crate::cpu::attention::KvRows;
use crate::cpu::attention::{self, HostScoring, KvElem, KvRowsMut, PrepareRows};
use crate::cpu::attention::{widen_filled, write_slots};
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
    ///
    /// Where every `keep[i] ≥ i` (rows kept in order, or a leaving row's place
    /// filled from the end), in place: only the rows that move are copied, each
    /// read before anything is written over it (destinations so far are all
    /// below `i ≤ keep[i]`), and the buffers keep their room for rows that join
    /// later. Otherwise into new buffers.
    pub(crate) fn select_rows(&mut self, keep: &[usize]) {
        let per_row = self.heads * self.capacity * self.dim;
        let in_place = keep.iter().enumerate().all(|(i, &r)| r >= i);
        with_store!(&mut self.store, |k_t, v| {
            for buf in [k_t, v] {
                if in_place {
                    for (i, &r) in keep.iter().enumerate() {
                        if r != i {
                            buf.copy_within(r * per_row..(r + 1) * per_row, i * per_row);
                        }
                    }
                    buf.truncate(keep.len() * per_row);
                } else {
                    let mut next = Vec::with_capacity(keep.len() * per_row);
                    for &r in keep {
                        next.extend_from_slice(&buf[r * per_row..(r + 1) * per_row]);
                    }
                    *buf = next;
                }
            }
        });
        self.batch = keep.len();
    }
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
        attention::attend_grouped(
            q,
            s,
            kv.rows(k_t, v),
            scoring,
            visible,
            attention::GROUP_MAX,
        )
    })
}

/// Appends this step's keys and values (`[batch, s, kv_heads, dim]`) to
/// `kv` and answers this step's queries (`[batch, s, heads, dim]`) as
/// `attend` does, by [`attention::append_and_attend`] (which see for
/// `visible`, `prepare` and `rotate`). The same values as rotating,
/// [`HostKv::append`] and `attend` (tested bit for bit).
pub(crate) fn append_and_attend(
    kv: &mut HostKv,
    qkv: (&mut [f32], &mut [f32], &mut [f32]),
    s: usize,
    scoring: HostScoring,
    visible: &(dyn Fn(usize, usize, usize) -> bool + Sync),
    prepare: &PrepareRows<'_>,
    rotate: &(dyn Fn(&mut [f32], usize, usize) + Sync),
) -> Vec<f32> {
    kv.reserve(s);
    let (batch, heads, dim, capacity, len) = (kv.batch, kv.heads, kv.dim, kv.capacity, kv.len);
    let out = with_store!(&mut kv.store, |k_t, v| {
        let layer = KvRowsMut {
            batch,
            heads,
            dim,
            capacity,
            len,
            k_t,
            v,
        };
        attention::append_and_attend(layer, qkv, s, scoring, visible, prepare, rotate)
    });
    kv.len = len + s;
    out
}

#[cfg(test)]
mod tests;
