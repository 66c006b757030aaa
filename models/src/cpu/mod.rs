//! The CPU kernels of the host-memory decode path (plain burn-flex), laid
//! out as ggml-cpu lays out its own:
//!
//! - [`quants`]: the GGUF block formats (`BlockQ4_1`, `BlockQ8_0`), a
//!   weight kept in them ([`BlockWeight`]), and rows of `x` quantised to
//!   8 bits per block (`Q8Rows`, llama.cpp's Q8_1);
//! - [`repack`]: the same weights in 16-row tiles (`BlockQ4_1x16`,
//!   `BlockQ8_0x16`, [`TiledWeight`]);
//! - `reference`: the portable definition of the tile × 8-bit product,
//!   which every instruction set's kernel follows step for step (the
//!   fallback where no instruction set below has a kernel);
//! - `arch`: one file per instruction set (`arch/x86/avx512.rs`,
//!   `avx512_vnni.rs`, `avx2.rs`; `avx512_vnni_rows.rs`: VNNI's kernel for
//!   many rows);
//! - [`blocks_f32`], [`tiles_f32`], [`tiles_q8`]: blocks × f32, tiles ×
//!   f32 and tiles × 8-bit activations; [`dense`]: f32 burn-flex weights ×
//!   a few rows (`blocks_f32` and `dense` are generic over pulp's vectors, run
//!   at each instruction set's width); `gemm`: each product split over
//!   threads and handed to its kernel; [`strided`]: f32 × f32 products of
//!   many rows with strided operands on the `gemm` crate's packed kernels
//!   (the host training step's, forward and backward);
//! - `attention`: attention of a few queries over keys and values held in
//!   host memory; [`vexp`]: `exp`, SiLU and log-softmax; [`simd`]: the
//!   vector loops and the prefetch hint the kernels share;
//! - `weight`: a projection's weight in the form its products read, and
//!   several products in one parallel region;
//! - [`dispatch`]: the one table from (weight format, activation format,
//!   instruction set) to a kernel, with each entry's printable name
//!   ([`dispatch::table`] lists them).
//!
//! This module imports nothing from [`crate::layers`]: the layers call the
//! kernels, not the reverse.

pub(crate) mod attention;
pub mod blocks_f32;
pub mod dense;
pub mod dispatch;
pub(crate) mod gemm;
pub mod quants;
pub(crate) mod reference;
pub mod repack;
pub mod simd;
pub mod strided;
pub mod tiles_f32;
pub mod tiles_q8;
pub mod vexp;
pub(crate) mod weight;

mod arch;

pub use dispatch::{ActivationFormat, Isa, KernelEntry, WeightFormat, kernel_for};
pub use quants::BlockWeight;
pub(crate) use quants::{Q8Row, Q8Rows};
pub use repack::TiledWeight;
pub(crate) use weight::CpuWeight;

/// Values per block: in the GGUF weight formats (Q4_1, Q8_0) and in the
/// 8-bit rows of `x`.
pub(crate) const QK: usize = 32;

/// Output rows per tile: the 16 32-bit lanes of an AVX-512 register.
pub(crate) const TILE: usize = 16;

/// Output columns are computed in runs starting at multiples of this
/// (every product kernel's `columns_into`): whole tiles, and for the block
/// kernels whole multiples of their tasks' rows.
pub(crate) const COLUMN_UNIT: usize = TILE;

/// Products of at least this many bytes of weights × rows of `x` are split
/// over rayon's threads; smaller ones run on the calling thread (a split
/// costs a `join`, and forward passes run on rayon's pool, see
/// `runtime::on_hot_pool`).
pub(crate) const PARALLEL_MIN_WORK: usize = 128 << 10;

/// How far ahead of the weights in use the kernels ask for the next ones
/// (bytes): a decode step reads every weight from memory once, and the
/// hardware's prefetcher alone leaves the kernels waiting on their loads.
pub(crate) const PREFETCH_AHEAD: usize = 8 << 10;

/// Most rows of `x` per pass over a tile (accumulators in registers), in
/// the tile kernels with 8-bit and with f32 activations.
pub(crate) const TILE_ROW_GROUP: usize = 12;
