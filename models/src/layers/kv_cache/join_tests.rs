//! [`KvCache::append_rows`] and [`KvCache::compact`] on caches built
//! by hand: each representation, precision and empty form, and the
//! typed errors.

use super::*;
use burn::backend::Flex;

/// How a test cache holds its layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Tensors,
    Host,
}

const DIM: usize = 4;

/// Entry `c` of head `h` of slot `slot` of row `row` (exact in f16).
fn entry(seed: f32, (rows, heads, slots): (usize, usize, usize), i: [usize; 4]) -> f32 {
    let [row, h, slot, c] = i;
    seed + (((row * heads + h) * slots + slot) * DIM + c) as f32 * 0.5
        - ((rows * heads * slots * DIM) as f32 * 0.25)
}

/// Keys (values: the keys plus 1000 · sign) of a one-layer cache of
/// `rows` rows of `slots` real slots, `heads` heads of width `DIM`,
/// `[rows, heads, slots, DIM]`.
fn entries(seed: f32, rows: usize, heads: usize, slots: usize) -> (Vec<f32>, Vec<f32>) {
    let mut k = Vec::new();
    for row in 0..rows {
        for h in 0..heads {
            for slot in 0..slots {
                for c in 0..DIM {
                    k.push(entry(seed, (rows, heads, slots), [row, h, slot, c]));
                }
            }
        }
    }
    let v = k.iter().map(|x| -x + 0.5).collect();
    (k, v)
}

fn filled(
    form: Form,
    precision: KvPrecision,
    (rows, heads, slots): (usize, usize, usize),
    seed: f32,
) -> KvCache<Flex> {
    let mut cache = KvCache::<Flex>::with_storage(1, rows, precision, true);
    cache.push_step(&vec![vec![true; slots]; rows]).unwrap();
    let (k, v) = entries(seed, rows, heads, slots);
    cache.layers[0] = match form {
        Form::Tensors => {
            let t = |x: Vec<f32>| {
                Tensor::from_data(
                    TensorData::new(x, [rows, heads, slots, DIM]),
                    &Default::default(),
                )
            };
            Layer::Tensors(t(k), t(v))
        }
        Form::Host => {
            // `[rows, slots, heads, DIM]`, the layout appends take.
            let seq_major = |x: &[f32]| {
                let mut out = Vec::with_capacity(x.len());
                for row in 0..rows {
                    for slot in 0..slots {
                        for h in 0..heads {
                            let at = ((row * heads + h) * slots + slot) * DIM;
                            out.extend_from_slice(&x[at..at + DIM]);
                        }
                    }
                }
                out
            };
            let mut kv = HostKv::new(rows, heads, DIM, precision);
            kv.append(&seq_major(&k), &seq_major(&v), slots);
            Layer::Host(kv)
        }
    };
    cache
}

/// Registers a step of `flags` in a two-head cache and appends keys and
/// values all equal to `value` to layer 0.
fn append_step(cache: &mut KvCache<Flex>, flags: &[Vec<bool>], value: f32) {
    cache.push_step(flags).unwrap();
    let (rows, s) = (flags.len(), flags[0].len());
    match &mut cache.layers[0] {
        Layer::Tensors(k, v) => {
            let new = Tensor::<Flex, 4>::full([rows, 2, s, DIM], value, &Default::default());
            *k = Tensor::cat(vec![k.clone(), new.clone()], 2);
            *v = Tensor::cat(vec![v.clone(), new], 2);
        }
        Layer::Host(kv) => {
            let new = vec![value; rows * s * 2 * DIM];
            kv.append(&new, &new, s);
        }
        Layer::Empty => unreachable!("filled caches hold keys"),
    }
}

/// Layer 0's keys and values, `[rows, heads, slots, DIM]` each.
fn held(cache: &KvCache<Flex>) -> (Vec<f32>, Vec<f32>) {
    match &cache.layers[0] {
        Layer::Empty => (vec![], vec![]),
        Layer::Tensors(k, v) => (
            crate::runtime::to_vec(k.clone()).unwrap(),
            crate::runtime::to_vec(v.clone()).unwrap(),
        ),
        Layer::Host(kv) => kv.contiguous(),
    }
}

/// `entries` of `rows` rows with `pad` zero slots in front of each.
fn padded(
    seed: f32,
    (rows, heads, slots): (usize, usize, usize),
    pad: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (k, v) = entries(seed, rows, heads, slots);
    let put = |x: Vec<f32>| {
        let mut out = Vec::new();
        for run in x.chunks(slots * DIM) {
            out.extend(std::iter::repeat_n(0.0, pad * DIM));
            out.extend_from_slice(run);
        }
        out
    };
    (put(k), put(v))
}

fn bookkeeping(cache: &KvCache<Flex>) -> Vec<(Vec<bool>, Vec<usize>, usize)> {
    cache
        .rows
        .iter()
        .map(|r| (r.valid.clone(), r.position.clone(), r.next_position))
        .collect()
}

const FORMS: [(Form, KvPrecision); 4] = [
    (Form::Tensors, KvPrecision::F32),
    (Form::Tensors, KvPrecision::F16),
    (Form::Host, KvPrecision::F32),
    (Form::Host, KvPrecision::F16),
];

#[test]
fn the_shorter_cache_is_padded_at_the_front_with_masked_slots() {
    for (form, precision) in FORMS {
        let short = filled(form, precision, (2, 2, 3), 0.0);
        let long = filled(form, precision, (1, 2, 5), 100.0);
        // Short first, then long first.
        let mut a = short.clone();
        a.append_rows(long.clone()).unwrap();
        let mut b = long.clone();
        b.append_rows(short.clone()).unwrap();
        let (short_k, short_v) = padded(0.0, (2, 2, 3), 2);
        let (long_k, long_v) = entries(100.0, 1, 2, 5);
        assert_eq!(
            held(&a),
            (
                [&short_k[..], &long_k].concat(),
                [&short_v[..], &long_v].concat()
            )
        );
        assert_eq!(
            held(&b),
            (
                [&long_k[..], &short_k].concat(),
                [&long_v[..], &short_v].concat()
            )
        );
        for (cache, short_rows) in [(&a, 0..2), (&b, 1..3)] {
            assert_eq!((cache.batch_size(), cache.slots()), (3, 5));
            for (r, (valid, position, next)) in bookkeeping(cache).into_iter().enumerate() {
                if short_rows.contains(&r) {
                    assert_eq!(valid, [false, false, true, true, true]);
                    assert_eq!(position, [0, 0, 0, 1, 2]);
                    assert_eq!(next, 3);
                } else {
                    assert_eq!(
                        (valid, position, next),
                        (vec![true; 5], vec![0, 1, 2, 3, 4], 5)
                    );
                }
            }
        }
        // A short row's next query sees its own three slots only.
        a.push_step(&[vec![true], vec![true], vec![true]]).unwrap();
        let mask = a
            .mask(1, None, &Default::default())
            .into_data()
            .to_vec::<bool>()
            .unwrap();
        assert_eq!(&mask[..6], &[true, true, false, false, false, false]);
        assert_eq!(&mask[12..18], &[false; 6]);
    }
}

#[test]
fn caches_without_rows_or_slots_join_either_way() {
    for (form, precision) in FORMS {
        let full = filled(form, precision, (2, 2, 3), 7.0);
        // No rows: the other cache as it is.
        let mut none = KvCache::<Flex>::with_storage(1, 0, precision, true);
        none.append_rows(full.clone()).unwrap();
        assert_eq!(
            (held(&none), bookkeeping(&none)),
            (held(&full), bookkeeping(&full))
        );
        let mut same = full.clone();
        same.append_rows(KvCache::with_storage(1, 0, precision, true))
            .unwrap();
        assert_eq!(
            (held(&same), bookkeeping(&same)),
            (held(&full), bookkeeping(&full))
        );
        // Rows that hold no slots yet: masked zero slots.
        let (k, v) = entries(7.0, 2, 2, 3);
        let zeros = vec![0.0; 2 * 2 * 3 * DIM];
        let mut after = full.clone();
        after
            .append_rows(KvCache::with_storage(1, 2, precision, true))
            .unwrap();
        assert_eq!(
            held(&after),
            ([&k[..], &zeros].concat(), [&v[..], &zeros].concat())
        );
        let mut before = KvCache::<Flex>::with_storage(1, 2, precision, true);
        before.append_rows(full.clone()).unwrap();
        assert_eq!(
            held(&before),
            ([&zeros[..], &k].concat(), [&zeros[..], &v].concat())
        );
        assert_eq!(
            bookkeeping(&before)[..2],
            [
                (vec![false; 3], vec![0; 3], 0),
                (vec![false; 3], vec![0; 3], 0)
            ]
        );
        // Two fresh caches.
        let mut fresh = KvCache::<Flex>::with_storage(1, 1, precision, true);
        fresh
            .append_rows(KvCache::with_storage(1, 2, precision, true))
            .unwrap();
        assert_eq!((fresh.batch_size(), fresh.slots()), (3, 0));
        assert!(matches!(fresh.layers[0], Layer::Empty));
    }
}

#[test]
fn mismatched_caches_are_refused_and_left_unchanged() {
    let base = filled(Form::Host, KvPrecision::F32, (2, 2, 3), 0.0);
    let refused = [
        KvCache::<Flex>::with_storage(2, 1, KvPrecision::F32, true),
        filled(Form::Host, KvPrecision::F16, (1, 2, 3), 0.0),
        filled(Form::Host, KvPrecision::F32, (1, 1, 3), 0.0),
        filled(Form::Tensors, KvPrecision::F32, (1, 2, 3), 0.0),
        // Rows with slots but a layer without keys (a failed step).
        {
            let mut c = KvCache::<Flex>::with_storage(1, 1, KvPrecision::F32, true);
            c.push_step(&[vec![true]]).unwrap();
            c
        },
    ];
    for other in refused {
        let mut cache = base.clone();
        let e = cache.append_rows(other).unwrap_err();
        assert!(matches!(e, ModelError::CacheMismatch(_)), "{e}");
        assert_eq!(
            (held(&cache), bookkeeping(&cache)),
            (held(&base), bookkeeping(&base))
        );
    }
    // Tensors of other head widths.
    let mut t = filled(Form::Tensors, KvPrecision::F32, (1, 2, 3), 0.0);
    let Layer::Tensors(k, v) = &t.layers[0] else {
        unreachable!()
    };
    let (k, v) = (
        k.clone().slice([0..1, 0..2, 0..3, 0..2]),
        v.clone().slice([0..1, 0..2, 0..3, 0..2]),
    );
    let mut narrow = t.clone();
    narrow.layers[0] = Layer::Tensors(k, v);
    assert!(matches!(
        t.append_rows(narrow),
        Err(ModelError::CacheMismatch(_))
    ));
}

#[test]
fn compact_drops_the_slots_no_row_holds() {
    for (form, precision) in FORMS {
        let short = filled(form, precision, (2, 2, 3), 0.0);
        let mut joined = short.clone();
        joined
            .append_rows(filled(form, precision, (1, 2, 5), 100.0))
            .unwrap();
        assert_eq!(joined.compact(), 0);
        // The long row leaves: its first two slots are no row's.
        joined.select_rows(&[1, 0]).unwrap();
        assert_eq!(joined.slots(), 5);
        assert_eq!(joined.compact(), 2);
        let mut want = short.clone();
        want.select_rows(&[1, 0]).unwrap();
        assert_eq!(
            (held(&joined), bookkeeping(&joined)),
            (held(&want), bookkeeping(&want))
        );
        // Slots masked in every row between real ones go too.
        append_step(&mut joined, &[vec![false, true], vec![false, false]], 9.0);
        assert_eq!(joined.compact(), 1);
        assert_eq!(bookkeeping(&joined)[0].0, [true; 4]);
        assert_eq!(bookkeeping(&joined)[1].0, [true, true, true, false]);
        let with_nines = |x: Vec<f32>| -> Vec<f32> {
            x.chunks(3 * DIM)
                .flat_map(|run| run.iter().copied().chain([9.0; DIM]))
                .collect()
        };
        let (k, v) = held(&want);
        assert_eq!(held(&joined), (with_nines(k), with_nines(v)));
        // No rows, no slots.
        joined.select_rows(&[]).unwrap();
        assert_eq!((joined.batch_size(), joined.compact()), (0, 0));
        assert!(matches!(joined.layers[0], Layer::Empty));
    }
}
