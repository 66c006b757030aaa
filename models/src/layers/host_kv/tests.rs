//! Tests of [`super`].

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
            let visible = |row: usize, i: usize, j: usize| j <= t - s + i && !(row == 2 && j == 1);
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
