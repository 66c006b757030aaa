//! x86-64 kernels: AVX-512 (through pulp's safe intrinsics), AVX-512 with
//! VNNI (for many rows: [`avx512_vnni_rows`]) and AMX int8 tiles (the
//! crate's `unsafe`, see [`avx512_vnni`] and [`amx_int8`]) and AVX2.

#[allow(unsafe_code)]
pub(crate) mod amx_int8;
pub(crate) mod avx2;
pub(crate) mod avx512;
#[allow(unsafe_code)]
pub(crate) mod avx512_vnni;
#[allow(unsafe_code)]
pub(crate) mod avx512_vnni_rows;

/// The `Kernel` of a SIMD module: its `tile_rows::<Q4, R>` as a
/// [`crate::cpu::tiles_q8::TileKernel`] for groups of at most `$group`
/// rows, dispatched on the format and the group's size (`$r`: every size
/// from 1 to `$group`).
macro_rules! tile_kernel {
    ($simd:ty, $group:expr, $($r:literal)*) => {
        /// [`tile_rows`] as a [`crate::cpu::tiles_q8::TileKernel`].
        pub(crate) struct Kernel<'a> {
            simd: $simd,
            q4_1: bool,
            xq: &'a crate::cpu::quants::Q8Rows,
        }

        impl<'a> Kernel<'a> {
            pub(crate) fn new(simd: $simd, q4_1: bool, xq: &'a crate::cpu::quants::Q8Rows) -> Self {
                Kernel { simd, q4_1, xq }
            }
        }

        impl crate::cpu::tiles_q8::TileKernel for Kernel<'_> {
            const GROUP: usize = $group;

            #[inline(always)]
            fn run(
                &mut self,
                tile: &[u8],
                rows: std::ops::Range<usize>,
                out: &mut [[f32; crate::cpu::TILE]; crate::cpu::TILE_ROW_GROUP],
            ) {
                let Kernel { simd, q4_1, xq } = *self;
                match (q4_1, rows.len()) {
                    $((true, $r) => tile_rows::<true, $r>(simd, tile, xq, rows, out),
                      (false, $r) => tile_rows::<false, $r>(simd, tile, xq, rows, out),)*
                    _ => unreachable!("row groups hold 1 to {} rows", $group),
                }
            }
        }
    };
}

pub(crate) use tile_kernel;
