//! The portable definition of the tile × 8-bit product
//! ([`super::tiles_q8`]): one output and block at a time, reading each
//! record through its struct. Every instruction set's kernel follows it
//! step for step and gives its bits (tested).

use super::quants::Q8Rows;
use super::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES};
use super::tiles_q8::TileKernel;
use super::{QK, TILE, TILE_ROW_GROUP};

/// `out[j][i] = w_i · x_{rows.start + j}` over one tile (`tile`: its
/// records, as [`super::TiledWeight`] holds them: aligned for the record
/// structs), one output and block at a time.
pub(crate) fn tile_rows(
    q4_1: bool,
    tile: &[u8],
    xq: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; TILE_ROW_GROUP],
) {
    let nb = xq.inp / QK;
    let record = if q4_1 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
    for (j, r) in rows.enumerate() {
        for i in 0..TILE {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let rec = &tile[b * record..][..record];
                let qx = &xq.q[r * xq.inp + b * QK..][..QK];
                let (dx, sx) = (xq.d[r * nb + b], xq.s[r * nb + b]);
                if q4_1 {
                    let rec: &BlockQ4_1x16 = bytemuck::from_bytes(rec);
                    let mut isum = 0i32;
                    for (k, &xk) in qx.iter().enumerate() {
                        let byte = rec.qs[k % 16 / 4][i * 4 + k % 4];
                        let w = i32::from(if k < 16 { byte & 0x0f } else { byte >> 4 });
                        isum += w * i32::from(xk);
                    }
                    acc = rec.m[i].to_f32().mul_add(sx, acc);
                    acc = (isum as f32).mul_add(rec.d[i].to_f32() * dx, acc);
                } else {
                    let rec: &BlockQ8_0x16 = bytemuck::from_bytes(rec);
                    let mut isum = 0i32;
                    for (k, &xk) in qx.iter().enumerate() {
                        let w = i32::from(rec.qs[k / 4][i * 4 + k % 4] as i8);
                        isum += w * i32::from(xk);
                    }
                    acc = (isum as f32).mul_add(rec.d[i].to_f32() * dx, acc);
                }
            }
            out[j][i] = acc;
        }
    }
}

/// [`tile_rows`] as a [`TileKernel`].
pub(crate) struct Portable<'a> {
    pub q4_1: bool,
    pub xq: &'a Q8Rows,
}

impl TileKernel for Portable<'_> {
    const GROUP: usize = TILE_ROW_GROUP;

    fn run(
        &mut self,
        tile: &[u8],
        rows: std::ops::Range<usize>,
        out: &mut [[f32; TILE]; TILE_ROW_GROUP],
    ) {
        tile_rows(self.q4_1, tile, self.xq, rows, out);
    }
}
