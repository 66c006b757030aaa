//! A [`super::Linear`]'s quantised copy in the form its decode products read,
//! and the products of one `x` by several such weights in one parallel
//! region.
//!
//! Why one region: a decode step on plain burn-flex splits each product
//! over rayon's threads, and every split costs a hand-off and a wait at the
//! join (`runtime::on_hot_pool` keeps the hand-off short, not free). A
//! Llama block's query, key and value projections (or an MLP's gate and
//! up) read the same `x`: computed as one list of output columns cut into
//! one run per thread, they pay one split instead of three, and the small
//! key and value products, too small to split alone, are spread too.

use std::sync::OnceLock;

use super::f32_tiles::{self, InputRows};
use super::int8_activations::{self, Int8Weight, QuantizedRows};
use super::quantized::{self, QuantizedWeight};

/// Products of at least this many bytes of weights × rows of `x` are split
/// over rayon's threads (as in [`super::quantized`]).
const PARALLEL_MIN_WORK: usize = 128 << 10;

/// A quantised `[out, in]` weight.
#[derive(Debug)]
pub(crate) enum HostWeight {
    /// GGUF blocks, multiplied by f32 activations; from
    /// [`f32_tiles::MIN_ROWS`] rows on an AVX-512 CPU, by the same
    /// weights in 16-row tiles (made at the first such product, beside the
    /// blocks, which products of fewer rows keep reading: see
    /// [`super::f32_tiles`]).
    F32Activations(QuantizedWeight, OnceLock<Option<Int8Weight>>),
    /// 16-row tiles, multiplied by 8-bit activations.
    Int8Activations(Int8Weight),
}

/// Output columns `first..` of one weight, for every row of `x`: a piece
/// of a thread's share of [`HostWeight::matmul_many`].
struct Run<'a> {
    weight: usize,
    first: usize,
    y: Vec<&'a mut [f32]>,
}

impl HostWeight {
    /// GGUF blocks multiplied by f32 activations.
    pub(crate) fn f32_activations(w: QuantizedWeight) -> Self {
        Self::F32Activations(w, OnceLock::new())
    }

    /// The tiles that f32 products of `rows` rows read, where they take
    /// [`super::f32_tiles`]'s kernel (made here the first time).
    fn f32_tiles(&self, rows: usize) -> Option<&Int8Weight> {
        let Self::F32Activations(w, tiles) = self else {
            return None;
        };
        if rows < f32_tiles::MIN_ROWS || !f32_tiles::available() {
            return None;
        }
        tiles.get_or_init(|| Int8Weight::from_quantized(w)).as_ref()
    }

    pub(crate) fn in_features(&self) -> usize {
        match self {
            Self::F32Activations(w, _) => w.in_features(),
            Self::Int8Activations(w) => w.in_features(),
        }
    }

    fn out_features(&self) -> usize {
        match self {
            Self::F32Activations(w, _) => w.out_features(),
            Self::Int8Activations(w) => w.out_features(),
        }
    }

    fn bytes_per_column(&self) -> usize {
        match self {
            Self::F32Activations(w, _) => w.bytes_per_column(),
            Self::Int8Activations(w) => w.bytes_per_column(),
        }
    }

    /// Whether products take 8-bit activations (`x` quantised first).
    pub(crate) fn takes_int8(&self) -> bool {
        matches!(self, Self::Int8Activations(_))
    }

    /// The width of the column runs this weight computes.
    fn column_unit(&self) -> usize {
        match self {
            Self::F32Activations(..) => quantized::COLUMN_UNIT,
            Self::Int8Activations(_) => int8_activations::COLUMN_UNIT,
        }
    }

    /// `x Wᵀ` for row-major `x: [rows, in]`, row-major `[rows, out]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        if self.f32_tiles(rows).is_some() {
            let mut y = Self::matmul_many(&[self], x, rows, None);
            return y.pop().expect("one product");
        }
        match self {
            Self::F32Activations(w, _) => w.matmul(x, rows),
            Self::Int8Activations(w) => w.matmul(x, rows),
        }
    }

    /// `x Wᵢᵀ` for every weight (all of `x`'s width), in one parallel
    /// region: the output columns of all of them, in order, cut into one
    /// run per thread of about equal bytes. `x` is quantised once for the
    /// weights that take 8-bit activations (or `quantized` serves: `x`
    /// quantised already, by [`QuantizedRows::new`] or row by row). Each
    /// column gets the same bits as in [`HostWeight::matmul`] (tested below).
    pub(crate) fn matmul_many(
        weights: &[&Self],
        x: &[f32],
        rows: usize,
        quantized: Option<&QuantizedRows>,
    ) -> Vec<Vec<f32>> {
        match (weights, quantized) {
            ([Self::Int8Activations(w)], Some(xq)) => return vec![w.matmul_quantized(xq)],
            ([w], _) if w.f32_tiles(rows).is_none() => return vec![w.matmul(x, rows)],
            _ => {}
        }
        let inp = weights.first().map_or(0, |w| w.in_features());
        debug_assert!(weights.iter().all(|w| w.in_features() == inp));
        debug_assert_eq!(x.len(), rows * inp);
        let mut ys: Vec<Vec<f32>> = weights
            .iter()
            .map(|w| vec![0.0f32; rows * w.out_features()])
            .collect();
        if rows == 0 {
            return ys;
        }
        let own;
        let xq = match quantized {
            Some(xq) => Some(xq),
            None if weights.iter().any(|w| w.takes_int8()) => {
                own = QuantizedRows::new(x, rows, inp);
                Some(&own)
            }
            None => None,
        };
        // The tiles of the weights that f32 products of this many rows read
        // that way, and `x` arranged for them once.
        let tiles: Vec<Option<&Int8Weight>> = weights.iter().map(|w| w.f32_tiles(rows)).collect();
        let xt = tiles
            .iter()
            .any(Option::is_some)
            .then(|| InputRows::new(x, rows, inp));
        let bytes: usize = weights
            .iter()
            .map(|w| w.out_features() * w.bytes_per_column())
            .sum();
        let threads = if bytes * rows >= PARALLEL_MIN_WORK {
            rayon::current_num_threads().max(1)
        } else {
            1
        };
        // Each unit of columns goes to the thread whose share of the total
        // bytes holds the unit's middle.
        let mut shares: Vec<Vec<Run<'_>>> = (0..threads).map(|_| Vec::new()).collect();
        let mut done = 0;
        for (weight, (w, y)) in weights.iter().zip(&mut ys).enumerate() {
            let (out, unit) = (w.out_features(), w.column_unit());
            let unit_bytes = unit * w.bytes_per_column();
            // (thread, first column, end column) of each run of this weight.
            let mut runs: Vec<(usize, usize, usize)> = Vec::new();
            for first in (0..out).step_by(unit) {
                let thread = ((done + unit_bytes / 2) * threads / bytes.max(1)).min(threads - 1);
                done += unit_bytes;
                let end = (first + unit).min(out);
                match runs.last_mut() {
                    Some((t, _, e)) if *t == thread => *e = end,
                    _ => runs.push((thread, first, end)),
                }
            }
            let mut pieces: Vec<Run<'_>> = runs
                .iter()
                .map(|&(_, first, _)| Run {
                    weight,
                    first,
                    y: Vec::with_capacity(rows),
                })
                .collect();
            for mut row in y.chunks_exact_mut(out) {
                for (piece, &(_, first, end)) in pieces.iter_mut().zip(&runs) {
                    let (head, tail) = std::mem::take(&mut row).split_at_mut(end - first);
                    piece.y.push(head);
                    row = tail;
                }
            }
            for (piece, &(thread, _, _)) in pieces.into_iter().zip(&runs) {
                shares[thread].push(piece);
            }
        }
        let compute = |_, share: Vec<Run<'_>>| {
            for mut run in share {
                match (weights[run.weight], xq) {
                    (Self::F32Activations(w, _), _) => match (tiles[run.weight], &xt) {
                        (Some(t), Some(xt)) if t.f32_columns_into(xt, run.first, &mut run.y) => {}
                        _ => w.columns_into(x, run.first, run.y),
                    },
                    (Self::Int8Activations(w), Some(xq)) => {
                        w.columns_into(xq, run.first, &mut run.y);
                    }
                    (Self::Int8Activations(_), None) => unreachable!("quantised above"),
                }
            }
        };
        crate::runtime::for_each_task(shares, compute);
        ys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use half::f16;
    use proptest::prelude::*;

    /// A Q4_1 or Q8_0 weight `[out, in]` with block bytes cycled from `bytes`.
    fn weight(q8: bool, out: usize, inp: usize, bytes: &[u8], int8: bool) -> HostWeight {
        let mut raw = Vec::new();
        let mut next = bytes.iter().cycle();
        for i in 0..out * (inp / 32) {
            raw.extend(f16::from_f32(0.01 + (i % 7) as f32 * 0.003).to_le_bytes());
            if !q8 {
                raw.extend(f16::from_f32(-0.05 + (i % 5) as f32 * 0.01).to_le_bytes());
            }
            raw.extend((0..if q8 { 32 } else { 16 }).map(|_| *next.next().unwrap()));
        }
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
        let w = QuantizedWeight::from_ggml(ty, &raw, out, inp)
            .unwrap()
            .unwrap();
        if int8 {
            HostWeight::Int8Activations(Int8Weight::from_quantized(&w).unwrap())
        } else {
            HostWeight::f32_activations(w)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Several products in one region equal each product alone, bit for
        /// bit, on one thread and split over three (runs cut inside weights
        /// and across them).
        #[test]
        fn products_in_one_region_equal_each_product_alone(
            int8 in any::<bool>(),
            formats in prop::collection::vec(any::<bool>(), 1..4),
            outs in prop::collection::vec(1usize..12, 3),
            nb in 1usize..20,
            rows in 1usize..12,
            bytes in prop::collection::vec(any::<u8>(), 1..64),
        ) {
            let inp = 32 * nb;
            let weights: Vec<HostWeight> = formats
                .iter()
                .zip(&outs)
                .map(|(&q8, &tiles)| weight(q8, 16 * tiles, inp, &bytes, int8))
                .collect();
            let refs: Vec<&HostWeight> = weights.iter().collect();
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 2654435761) % 2001) as f32 / 500.0 - 2.0)
                .collect();
            let alone: Vec<Vec<f32>> = weights.iter().map(|w| w.matmul(&x, rows)).collect();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let together = pool.install(|| HostWeight::matmul_many(&refs, &x, rows, None));
                prop_assert_eq!(together.len(), alone.len());
                for (t, a) in together.iter().zip(&alone) {
                    prop_assert_eq!(t.len(), a.len());
                    prop_assert!(t.iter().zip(a).all(|(t, a)| t.to_bits() == a.to_bits()));
                }
            }
        }
    }
}
