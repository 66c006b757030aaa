//! `x Wᵀ` for rows of `x` the way llama.cpp's CPU kernels take it for a
//! Q4_1 or Q8_0 weight: each row of `x` is first quantised to 8 bits per
//! block of 32 values (`Q8Rows`), and every block's dot product is an
//! exact integer sum, scaled once in f32, over the weight's 16-row tiles
//! ([`TiledWeight`]).
//!
//! Why: with many rows (an ensemble step has N + 1) the f32 kernel of
//! [`super::blocks_f32`] is bound by the multiply-adds, 16 per AVX-512
//! instruction. An 8-bit product (`vpmaddubsw` + `vpmaddwd`) does 64 per
//! two instructions, and with the weights 16 output rows to a register
//! each block costs one conversion and two FMAs per 16 outputs instead of
//! 32 FMAs per 16 outputs. The kernels prefetch the records ahead, so that
//! a product read from memory overlaps its loads with its arithmetic.
//!
//! What it costs: the activations are rounded to 8 bits (`|x − x̂| ≤ dₓ/2`
//! per entry), so each output moves by at most `Σ_b (dₓ,b/2)·Σ_{k∈b}|w_k|`
//! from the product with the exact `x` (checked by the tests). That is the
//! size of llama.cpp's own rounding, not the same rounding (llama.cpp rounds
//! ties away from zero, keeps its KV cache in f16 and sums in other orders;
//! `tests/integration/llama_cpp_agreement.rs` compares the two). It is opt-in:
//! [`crate::plan::DecodeProducts::Int8Activations`].
//!
//! Kernels ([`super::dispatch`]): AVX-512 with VNNI, whose `vpdpbusd` does
//! the 8-bit multiply and both sums in one instruction (from 16 rows on,
//! each tile prepared once for all rows and the rows laid out for it:
//! `arch/x86/avx512_vnni_rows.rs`); AVX-512 without it
//! (16 outputs per register); AVX2 (two halves of 8); and the portable
//! definition (`cpu::reference`).
//!
//! The arithmetic, exactly (output `o`, row `r`, blocks `b`, in order):
//! `acc = fma(m_ob, s_rb, acc)` (Q4_1 only; `s_rb = dₓ,rb · Σ_k q_rbk`, as
//! llama.cpp's Q8_1 `s`), then `acc = fma(I_orb as f32, d_ob · dₓ,rb, acc)`
//! with `I_orb = Σ_k qw_obk · q_rbk` summed in integers (`|I| < 2²⁴`, so the
//! conversion is exact). Each kernel follows it step for step, so they
//! agree bit for bit (tested), and a row's result does not depend on the
//! other rows.

use super::repack::TiledWeight;
use super::{TILE, TILE_ROW_GROUP};

impl TiledWeight {
    /// Runs `kernel` over tiles `first..` (as many as `y[r]` has room for)
    /// and the rows in groups of at most its `GROUP` (≤
    /// [`TILE_ROW_GROUP`]), writing each group's outputs into `y`. (A trait,
    /// not a closure: a closure's body need not be inlined into the SIMD
    /// frame, and the intrinsics must be.)
    #[inline(always)]
    pub(crate) fn for_each_tile<K: TileKernel>(
        &self,
        first: usize,
        y: &mut [&mut [f32]],
        kernel: &mut K,
    ) {
        let rows = y.len();
        let groups = rows.div_ceil(K::GROUP);
        for t in 0..y[0].len() / TILE {
            // The tile's records and all after it (the kernel prefetches ahead).
            let tile = self.tile_bytes(first + t);
            let mut r = 0;
            for g in 0..groups {
                let size = rows / groups + usize::from(g < rows % groups);
                let mut out = [[0.0f32; TILE]; TILE_ROW_GROUP];
                kernel.run(tile, r..r + size, &mut out);
                for (j, o) in out.iter().take(size).enumerate() {
                    y[r + j][t * TILE..][..TILE].copy_from_slice(o);
                }
                r += size;
            }
        }
    }
}

/// `out[j][i] = w_i · x_{rows.start + j}` over one tile (`tile`: its
/// records and all after them).
pub(crate) trait TileKernel {
    /// Most rows per pass (≤ [`TILE_ROW_GROUP`]).
    const GROUP: usize;

    /// One group of rows over one tile.
    fn run(
        &mut self,
        tile: &[u8],
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; TILE_ROW_GROUP],
    );
}

/// [`TiledWeight::for_each_tile`] with a SIMD `kernel`, run inside the frame
/// of the kernel's instruction set (pulp's `vectorize`).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Tiles<'a, 'y, K> {
    pub w: &'a TiledWeight,
    pub first: usize,
    pub y: &'a mut [&'y mut [f32]],
    pub kernel: K,
}

#[cfg(target_arch = "x86_64")]
impl<K: TileKernel> pulp::WithSimd for Tiles<'_, '_, K> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Tiles {
            w,
            first,
            y,
            mut kernel,
        } = self;
        w.for_each_tile(first, y, &mut kernel);
    }
}

#[cfg(test)]
mod tests;
