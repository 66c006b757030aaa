//! Q4_1 and Q8_0 weights repacked from GGUF blocks into tiles of 16
//! output rows ([`BlockQ4_1x16`], [`BlockQ8_0x16`]), llama.cpp's
//! `repack` for AVX-512's 16 lanes.
//!
//! Layout: a tile's block `b` is one record whose register `j` holds, in
//! 32-bit lane `i`, four consecutive bytes of output row `i`'s block. One
//! 8-bit multiply of that register by four bytes of `x` broadcast to every
//! lane then sums four products of each of the 16 outputs into its own
//! lane, and one f32 register of dequantised weights holds one input's
//! weight for 16 outputs: no horizontal sums either way. The scales stay
//! f16, as in the file, so a record is as large as the GGUF blocks it
//! replaces (a decode step with one row reads every weight once and is
//! bound by their size).
//!
//! The kernels read the records as bytes at the offsets these structs
//! define (`BlockQ4_1x16::D_AT`, …), loading each register straight from
//! memory.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::quants::{BlockWeight, Format, WeightFormat};
use super::{QK, TILE};

/// 16 output rows' Q4_1 blocks of the same 32 inputs.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1x16 {
    /// `qs[p]`, lane `i`: bytes `4p..4p + 4` of row `i`'s nibbles (byte
    /// `t`'s low nibble is input `4p + t`, its high nibble `16 + 4p + t`).
    pub qs: [[u8; 64]; 4],
    /// Row `i`'s scale.
    pub d: [f16; TILE],
    /// Row `i`'s minimum.
    pub m: [f16; TILE],
}

/// 16 output rows' Q8_0 blocks of the same 32 inputs.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0x16 {
    /// `qs[j]`, lane `i`: signed bytes `4j..4j + 4` of row `i`'s block.
    pub qs: [[u8; 64]; 8],
    /// Row `i`'s scale.
    pub d: [f16; TILE],
}

const _: () = assert!(size_of::<BlockQ4_1x16>() == 4 * 64 + 2 * 32);
const _: () = assert!(size_of::<BlockQ8_0x16>() == 8 * 64 + 32);

impl BlockQ4_1x16 {
    /// Byte offset of the scales in a record.
    pub(crate) const D_AT: usize = std::mem::offset_of!(Self, d);
    /// Byte offset of the minima in a record.
    pub(crate) const M_AT: usize = std::mem::offset_of!(Self, m);
}

impl BlockQ8_0x16 {
    /// Byte offset of the scales in a record.
    pub(crate) const D_AT: usize = std::mem::offset_of!(Self, d);
}

/// Bytes of a Q4_1 record.
pub(crate) const Q4_1X16_BYTES: usize = size_of::<BlockQ4_1x16>();
/// Bytes of a Q8_0 record.
pub(crate) const Q8_0X16_BYTES: usize = size_of::<BlockQ8_0x16>();

/// A tiled weight's records, tile after tile, block after block within a tile.
#[derive(Clone)]
enum Records {
    Q4_1(Vec<BlockQ4_1x16>),
    Q8_0(Vec<BlockQ8_0x16>),
}

/// A Q4_1 or Q8_0 `[out, in]` weight in 16-row tiles, for products with
/// 8-bit activations ([`super::tiles_q8`]) and, from a few rows on, f32
/// activations ([`super::tiles_f32`]).
#[derive(Clone)]
pub struct TiledWeight {
    out: usize,
    inp: usize,
    records: Records,
}

impl std::fmt::Debug for TiledWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TiledWeight({:?}, [{}, {}])",
            self.format(),
            self.out,
            self.inp
        )
    }
}

impl TiledWeight {
    /// The weight's blocks rearranged into tiles, or `None` when its output
    /// width is not a multiple of 16 (the block kernels then serve it).
    pub fn from_blocks(w: &BlockWeight) -> Option<Self> {
        let (out, inp) = (w.out_features(), w.in_features());
        if out == 0 || !out.is_multiple_of(TILE) {
            return None;
        }
        let nb = inp / QK;
        let tiles = out / TILE;
        // The scales were widened from f16 at load, so narrowing them back is exact.
        let half = |v: &[f32], at: &dyn Fn(usize) -> usize| -> [f16; TILE] {
            std::array::from_fn(|i| f16::from_f32(v[at(i)]))
        };
        let records = match w.format {
            Format::Q4_1 => {
                let mut records = Vec::with_capacity(tiles * nb);
                for t in 0..tiles {
                    for b in 0..nb {
                        let at = |i: usize| (t * TILE + i) * nb + b;
                        let mut rec = BlockQ4_1x16::zeroed();
                        for (p, reg) in rec.qs.iter_mut().enumerate() {
                            for (i, lane) in reg.chunks_exact_mut(4).enumerate() {
                                lane.copy_from_slice(&w.q[at(i) * 16 + 4 * p..][..4]);
                            }
                        }
                        rec.d = half(&w.scale, &at);
                        rec.m = half(&w.min, &at);
                        records.push(rec);
                    }
                }
                Records::Q4_1(records)
            }
            Format::Q8_0 => {
                let mut records = Vec::with_capacity(tiles * nb);
                for t in 0..tiles {
                    for b in 0..nb {
                        let at = |i: usize| (t * TILE + i) * nb + b;
                        let mut rec = BlockQ8_0x16::zeroed();
                        for (j, reg) in rec.qs.iter_mut().enumerate() {
                            for (i, lane) in reg.chunks_exact_mut(4).enumerate() {
                                lane.copy_from_slice(&w.q[at(i) * QK + 4 * j..][..4]);
                            }
                        }
                        rec.d = half(&w.scale, &at);
                        records.push(rec);
                    }
                }
                Records::Q8_0(records)
            }
        };
        Some(TiledWeight { out, inp, records })
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// The tile format.
    pub fn format(&self) -> WeightFormat {
        match self.records {
            Records::Q4_1(_) => WeightFormat::Q4_1x16,
            Records::Q8_0(_) => WeightFormat::Q8_0x16,
        }
    }

    /// Bytes of one record.
    pub(crate) fn record_bytes(&self) -> usize {
        if self.is_q4_1() {
            Q4_1X16_BYTES
        } else {
            Q8_0X16_BYTES
        }
    }

    /// Whether the blocks are Q4_1 (else Q8_0).
    pub(crate) fn is_q4_1(&self) -> bool {
        matches!(self.records, Records::Q4_1(_))
    }

    /// The records of tile `tile` and all after it, as bytes.
    pub(crate) fn tile_bytes(&self, tile: usize) -> &[u8] {
        let at = tile * (self.inp / QK);
        match &self.records {
            Records::Q4_1(r) => bytemuck::cast_slice(&r[at..]),
            Records::Q8_0(r) => bytemuck::cast_slice(&r[at..]),
        }
    }

    /// Bytes of records per output column.
    pub(crate) fn bytes_per_column(&self) -> usize {
        let records = match &self.records {
            Records::Q4_1(r) => std::mem::size_of_val(&r[..]),
            Records::Q8_0(r) => std::mem::size_of_val(&r[..]),
        };
        records / self.out.max(1)
    }
}
