//! A projection's quantised copy in the form its decode products read,
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

use super::dispatch::{self, ActivationFormat, WeightFormat};
use super::quants::{BlockWeight, Q8Rows};
use super::repack::TiledWeight;
use super::tiles_f32::{InterleavedRows, TILES_F32_MIN_ROWS};
use super::{COLUMN_UNIT, PARALLEL_MIN_WORK};

/// A quantised `[out, in]` weight.
#[derive(Debug)]
pub(crate) enum CpuWeight {
    /// GGUF blocks, multiplied by f32 activations; from
    /// [`TILES_F32_MIN_ROWS`] rows, where the CPU has a tile × f32 kernel,
    /// by the same weights in 16-row tiles (made at the first such product,
    /// beside the blocks, which products of fewer rows keep reading: see
    /// [`super::tiles_f32`]).
    Blocks(BlockWeight, OnceLock<Option<TiledWeight>>),
    /// 16-row tiles, multiplied by 8-bit activations.
    Tiles(TiledWeight),
}

/// Output columns `first..` of one weight, for every row of `x`: a piece
/// of a thread's share of [`CpuWeight::matmul_many`].
struct Run<'a> {
    weight: usize,
    first: usize,
    y: Vec<&'a mut [f32]>,
}

impl CpuWeight {
    /// GGUF blocks multiplied by f32 activations.
    pub(crate) fn blocks(w: BlockWeight) -> Self {
        Self::Blocks(w, OnceLock::new())
    }

    /// The tiles that f32 products of `rows` rows read, where they take
    /// the tile × f32 kernel of [`super::tiles_f32`] (made here the first
    /// time).
    fn f32_tiles(&self, rows: usize) -> Option<&TiledWeight> {
        let Self::Blocks(w, tiles) = self else {
            return None;
        };
        if rows < TILES_F32_MIN_ROWS || !tiles_f32_kernel_exists(w) {
            return None;
        }
        tiles.get_or_init(|| TiledWeight::from_blocks(w)).as_ref()
    }

    pub(crate) fn in_features(&self) -> usize {
        match self {
            Self::Blocks(w, _) => w.in_features(),
            Self::Tiles(w) => w.in_features(),
        }
    }

    fn out_features(&self) -> usize {
        match self {
            Self::Blocks(w, _) => w.out_features(),
            Self::Tiles(w) => w.out_features(),
        }
    }

    fn bytes_per_column(&self) -> usize {
        match self {
            Self::Blocks(w, _) => w.bytes_per_column(),
            Self::Tiles(w) => w.bytes_per_column(),
        }
    }

    /// Whether products take 8-bit activations (`x` quantised first).
    pub(crate) fn takes_q8(&self) -> bool {
        matches!(self, Self::Tiles(_))
    }

    /// `x Wᵀ` for row-major `x: [rows, in]`, row-major `[rows, out]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        if self.f32_tiles(rows).is_some() {
            let mut y = Self::matmul_many(&[self], x, rows, None);
            return y.pop().expect("one product");
        }
        match self {
            Self::Blocks(w, _) => w.matmul(x, rows),
            Self::Tiles(w) => w.matmul(x, rows),
        }
    }

    /// `x Wᵢᵀ` for every weight (all of `x`'s width), in one parallel
    /// region: the output columns of all of them, in order, cut into one
    /// run per thread of about equal bytes. `x` is quantised once for the
    /// weights that take 8-bit activations (or `quantized` serves: `x`
    /// quantised already, by [`Q8Rows::new`] or row by row). Each
    /// column gets the same bits as in [`CpuWeight::matmul`] (tested below).
    pub(crate) fn matmul_many(
        weights: &[&Self],
        x: &[f32],
        rows: usize,
        quantized: Option<&Q8Rows>,
    ) -> Vec<Vec<f32>> {
        match (weights, quantized) {
            ([Self::Tiles(w)], Some(xq)) => return vec![w.matmul_q8(xq)],
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
            None if weights.iter().any(|w| w.takes_q8()) => {
                own = Q8Rows::new(x, rows, inp);
                Some(&own)
            }
            None => None,
        };
        // The tiles of the weights that f32 products of this many rows read
        // that way, and `x` arranged for them once.
        let tiles: Vec<Option<&TiledWeight>> = weights.iter().map(|w| w.f32_tiles(rows)).collect();
        let xt = tiles
            .iter()
            .any(Option::is_some)
            .then(|| InterleavedRows::new(x, rows, inp));
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
            let (out, unit) = (w.out_features(), COLUMN_UNIT);
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
                    (Self::Blocks(w, _), _) => match (tiles[run.weight], &xt) {
                        (Some(t), Some(xt)) if t.f32_columns_into(xt, run.first, &mut run.y) => {}
                        _ => w.columns_into(x, run.first, run.y),
                    },
                    (Self::Tiles(w), Some(xq)) => {
                        w.q8_columns_into(xq, run.first, &mut run.y);
                    }
                    (Self::Tiles(_), None) => unreachable!("quantised above"),
                }
            }
        };
        crate::runtime::for_each_task(shares, compute);
        ys
    }
}

/// Whether this CPU has a tile × f32 kernel for the tiles of `w`.
fn tiles_f32_kernel_exists(w: &BlockWeight) -> bool {
    let tiles = match w.format() {
        WeightFormat::Q4_1 => WeightFormat::Q4_1x16,
        _ => WeightFormat::Q8_0x16,
    };
    dispatch::kernel_for(tiles, ActivationFormat::F32).is_some()
}

#[cfg(test)]
mod tests;
