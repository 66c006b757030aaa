//! `x Wᵀ` for many rows of f32 `x` (an ensemble step's N + 1) over the
//! 16-row tiles of a [`super::TiledWeight`], one output per lane:
//! `gemm_q4_1x16_f32` and `gemm_q8_0x16_f32` of [`super::dispatch`]
//! (AVX-512 only; the kernel is in `arch/x86/avx512.rs`).
//!
//! Why: [`super::blocks_f32`]'s kernel holds 16 inputs of one weight row
//! per register and sums each output across the lanes at the end. Here a
//! register holds one input's weights for 16 outputs, dequantised once and
//! multiplied into every row's accumulator with that row's input
//! broadcast: no horizontal sums; the records are prefetched ahead, as
//! [`super::tiles_q8`]'s kernels do. With few rows the dequantisation
//! dominates, so the decode products take this kernel from
//! `TILES_F32_MIN_ROWS` rows only.
//!
//! Exactness: the same weights as the f32 path: the dequantiser's `d·q`,
//! then `+ m` (Q4_1), or `d·q` (Q8_0), from the f16 scales the records keep
//! (the dequantiser widens the same f16 values). `d·q` is exact in f32 (11
//! significant bits times at most 8), so the Q4_1 weight's one FMA rounds
//! once where the dequantiser rounds `d·q` (exactly) and then `+ m`: the
//! same bits (tested with unit rows of `x`). Each output of each row is
//! summed in one f32 lane, block by block, in one fixed order of the
//! block's inputs: a row's result depends neither on the other rows nor on
//! how the rows are grouped, and differs from the lane-split kernel's only
//! in the order of the sums, within the same `γ_{k+1} Σ|w_j x_j|` (tested).

use super::TILE_ROW_GROUP;

/// Rows of `x` from which [`super::CpuWeight`] (the decode products) takes
/// this kernel: below it, the lane-split kernel of [`super::blocks_f32`]
/// is faster.
pub(crate) const TILES_F32_MIN_ROWS: usize = 8;

/// Rows of `x` arranged for the kernel: in groups of at most [`TILE_ROW_GROUP`]
/// rows (as even as possible), each group block by block, input by input,
/// row by row (`[block][32][rows]`), so that one input of every row of the
/// group is one contiguous run.
pub(crate) struct InterleavedRows {
    pub(crate) inp: usize,
    /// (first row, rows, values) of each group.
    pub(crate) groups: Vec<(usize, usize, Vec<f32>)>,
}

impl InterleavedRows {
    /// `x: [rows, inp]`, row-major (`inp` a multiple of 32).
    pub(crate) fn new(x: &[f32], rows: usize, inp: usize) -> Self {
        debug_assert_eq!(x.len(), rows * inp);
        let count = rows.div_ceil(TILE_ROW_GROUP);
        let mut groups = Vec::with_capacity(count);
        let mut first = 0;
        for g in 0..count {
            let size = rows / count + usize::from(g < rows % count);
            let mut v = Vec::with_capacity(size * inp);
            for k in 0..inp {
                v.extend((first..first + size).map(|r| x[r * inp + k]));
            }
            groups.push((first, size, v));
            first += size;
        }
        InterleavedRows { inp, groups }
    }

    /// Rows held.
    pub(crate) fn rows(&self) -> usize {
        self.groups
            .last()
            .map_or(0, |(first, size, _)| first + size)
    }
}

#[cfg(test)]
mod tests;
