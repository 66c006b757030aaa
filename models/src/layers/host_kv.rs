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
mod tests {
    use super::*;
    use crate::cpu::attention::{WIDEN_FIRST, attend_grouped, rows_per_task};
    use proptest::prelude::*;

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
