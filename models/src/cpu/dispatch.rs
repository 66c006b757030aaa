//! The one place a CPU kernel is chosen: a table keyed by the weight's
//! format, the activations' format and the instruction set, whose entries
//! name what they compute (`gemm_q4_1x16_q8_1 (avx512-vnni)`), so that an
//! execution plan can print which kernels run.
//!
//! The instruction set is detected once ([`Isa::detected`]); a key's kernel
//! is the entry of the widest instruction set the CPU has, at most the one
//! asked for ([`kernel_for_isa`], which the tests use to run every
//! instruction set's kernel on one CPU). The choice is made once per
//! product (a cached lookup), never per block.

use std::fmt;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::arch;
use super::blocks_f32;
use super::dense;
pub use super::quants::{ActivationFormat, WeightFormat};
use super::quants::{BlockWeight, Q8Parts, Q8Rows};
use super::quants::{fill_blocks, quantize_block};
use super::reference::Portable;
use super::repack::TiledWeight;
use super::tiles_f32::InterleavedRows;
#[cfg(target_arch = "x86_64")]
use super::tiles_q8::Tiles;

/// An instruction set the kernels are written for, widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// AVX-512 F/BW/VL with VNNI, and AMX int8 tiles in a process Linux
    /// granted the tile data state and `PRIVMIX_NO_AMX` is not set (see
    /// [`Isa::declined`] where it is not used).
    /// Only the products of tiled weights with 8-bit rows have a kernel of
    /// their own at this level (many rows; few rows stay on VNNI's).
    AmxInt8,
    /// AVX-512 F/BW/VL with VNNI.
    Avx512Vnni,
    /// AVX-512 F/BW/VL (pulp's `x86::V4`).
    Avx512,
    /// AVX2 with FMA (pulp's `x86::V3`).
    Avx2,
    /// Portable code (on other architectures, pulp's widest level for the
    /// kernels written on pulp's vectors).
    Fallback,
}

impl Isa {
    /// Every instruction set, widest first.
    pub const ALL: [Isa; 5] = [
        Isa::AmxInt8,
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::Avx2,
        Isa::Fallback,
    ];

    /// The widest instruction set this CPU has (detected once).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .find(|isa| isa.available())
                .unwrap_or(Isa::Fallback)
        })
    }

    /// Whether this CPU runs code written for this instruction set.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Isa::AmxInt8 => {
                    Isa::Avx512Vnni.available() && arch::x86::amx_int8::permission().is_ok()
                }
                Isa::Avx512Vnni => {
                    pulp::x86::V4::try_new().is_some()
                        && std::arch::is_x86_feature_detected!("avx512vnni")
                }
                Isa::Avx512 => pulp::x86::V4::try_new().is_some(),
                Isa::Avx2 => pulp::x86::V3::try_new().is_some(),
                Isa::Fallback => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Fallback
        }
    }

    /// Why this instruction set is not used on this CPU where that needs
    /// saying: for [`Isa::AmxInt8`] on a CPU with AVX-512 VNNI, a CPU
    /// without AMX int8 or a process refused the tile data state (the
    /// table then takes VNNI's kernels). `None` where it is used, or where
    /// the CPU lacks a narrower level too.
    pub fn declined(self) -> Option<&'static str> {
        #[cfg(target_arch = "x86_64")]
        if self == Isa::AmxInt8 && Isa::Avx512Vnni.available() {
            return arch::x86::amx_int8::permission().err();
        }
        None
    }

    /// Whether code written for this instruction set may use AVX-512 (F/BW/VL).
    pub fn has_avx512(self) -> bool {
        self <= Isa::Avx512
    }

    /// The name printed in a kernel's description.
    pub fn name(self) -> &'static str {
        match self {
            Isa::AmxInt8 => "amx-int8",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Fallback => "fallback",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The function behind a [`KernelEntry`], by the operands it takes.
#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    /// Output columns `first..` (as many as `y[r]` has room for) of `x Wᵀ`
    /// for a block weight and row-major f32 `x`, on the calling thread.
    BlocksF32(fn(&BlockWeight, &[f32], usize, Vec<&mut [f32]>)),
    /// Output tiles `first..` (as many as `y[r]` has room for) of `x Wᵀ`
    /// for a tiled weight and f32 rows arranged for the tiles.
    TilesF32(fn(&TiledWeight, &InterleavedRows, usize, &mut [&mut [f32]])),
    /// Output tiles `first..` of `x Wᵀ` for a tiled weight and 8-bit rows.
    TilesQ8(fn(&TiledWeight, &Q8Rows, usize, &mut [&mut [f32]])),
    /// `yt[o, r] = w[o] · x[r]` for a block of f32 weight rows `w` (each
    /// `k` long) and row-major `x: [rows, k]`, `yt: [out, rows]`.
    DenseF32(fn(&[f32], usize, &[f32], usize, &mut [f32])),
    /// Rows of `x` quantised to 8 bits per block.
    QuantizeQ8_1(fn(&[f32], Q8Parts<'_>)),
}

/// One kernel of the table: what it computes, for which instruction set.
#[derive(Clone, Copy)]
pub struct KernelEntry {
    /// What the kernel computes, formats included (`gemm_q4_1_f32`:
    /// Q4_1 weight blocks × f32 activations).
    pub name: &'static str,
    /// The instruction set it is written for.
    pub isa: Isa,
    pub(crate) weight: Option<WeightFormat>,
    pub(crate) act: ActivationFormat,
    pub(crate) kernel: Kernel,
}

impl KernelEntry {
    /// The weight format it multiplies (`None` for the quantiser of `x`).
    pub fn weight(&self) -> Option<WeightFormat> {
        self.weight
    }

    /// The activation format it takes (or, for the quantiser, produces).
    pub fn activation(&self) -> ActivationFormat {
        self.act
    }
}

impl fmt::Display for KernelEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.isa)
    }
}

impl fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelEntry({self})")
    }
}

/// An entry of [`TABLE`].
const fn entry(
    name: &'static str,
    weight: Option<WeightFormat>,
    act: ActivationFormat,
    isa: Isa,
    kernel: Kernel,
) -> KernelEntry {
    KernelEntry {
        name,
        isa,
        weight,
        act,
        kernel,
    }
}

use ActivationFormat as A;
use WeightFormat as W;

/// Every kernel, widest instruction set first within each key.
static TABLE: &[KernelEntry] = &[
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1_f32",
        Some(W::Q4_1),
        A::F32,
        Isa::Avx512,
        Kernel::BlocksF32(blocks_f32_avx512),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1_f32",
        Some(W::Q4_1),
        A::F32,
        Isa::Avx2,
        Kernel::BlocksF32(blocks_f32_avx2),
    ),
    entry(
        "gemm_q4_1_f32",
        Some(W::Q4_1),
        A::F32,
        Isa::Fallback,
        Kernel::BlocksF32(blocks_f32_fallback),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0_f32",
        Some(W::Q8_0),
        A::F32,
        Isa::Avx512,
        Kernel::BlocksF32(blocks_f32_avx512),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0_f32",
        Some(W::Q8_0),
        A::F32,
        Isa::Avx2,
        Kernel::BlocksF32(blocks_f32_avx2),
    ),
    entry(
        "gemm_q8_0_f32",
        Some(W::Q8_0),
        A::F32,
        Isa::Fallback,
        Kernel::BlocksF32(blocks_f32_fallback),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1x16_f32",
        Some(W::Q4_1x16),
        A::F32,
        Isa::Avx512,
        Kernel::TilesF32(arch::x86::avx512::tiles_f32),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0x16_f32",
        Some(W::Q8_0x16),
        A::F32,
        Isa::Avx512,
        Kernel::TilesF32(arch::x86::avx512::tiles_f32),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1x16_q8_1",
        Some(W::Q4_1x16),
        A::Q8_1,
        Isa::AmxInt8,
        Kernel::TilesQ8(tiles_q8_amx_int8),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1x16_q8_1",
        Some(W::Q4_1x16),
        A::Q8_1,
        Isa::Avx512Vnni,
        Kernel::TilesQ8(tiles_q8_avx512_vnni),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1x16_q8_1",
        Some(W::Q4_1x16),
        A::Q8_1,
        Isa::Avx512,
        Kernel::TilesQ8(tiles_q8_avx512),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q4_1x16_q8_1",
        Some(W::Q4_1x16),
        A::Q8_1,
        Isa::Avx2,
        Kernel::TilesQ8(tiles_q8_avx2),
    ),
    entry(
        "gemm_q4_1x16_q8_1",
        Some(W::Q4_1x16),
        A::Q8_1,
        Isa::Fallback,
        Kernel::TilesQ8(tiles_q8_fallback),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0x16_q8_1",
        Some(W::Q8_0x16),
        A::Q8_1,
        Isa::AmxInt8,
        Kernel::TilesQ8(tiles_q8_amx_int8),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0x16_q8_1",
        Some(W::Q8_0x16),
        A::Q8_1,
        Isa::Avx512Vnni,
        Kernel::TilesQ8(tiles_q8_avx512_vnni),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0x16_q8_1",
        Some(W::Q8_0x16),
        A::Q8_1,
        Isa::Avx512,
        Kernel::TilesQ8(tiles_q8_avx512),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_q8_0x16_q8_1",
        Some(W::Q8_0x16),
        A::Q8_1,
        Isa::Avx2,
        Kernel::TilesQ8(tiles_q8_avx2),
    ),
    entry(
        "gemm_q8_0x16_q8_1",
        Some(W::Q8_0x16),
        A::Q8_1,
        Isa::Fallback,
        Kernel::TilesQ8(tiles_q8_fallback),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_f32_f32",
        Some(W::F32),
        A::F32,
        Isa::Avx512,
        Kernel::DenseF32(dense_f32_avx512),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "gemm_f32_f32",
        Some(W::F32),
        A::F32,
        Isa::Avx2,
        Kernel::DenseF32(dense_f32_avx2),
    ),
    entry(
        "gemm_f32_f32",
        Some(W::F32),
        A::F32,
        Isa::Fallback,
        Kernel::DenseF32(dense_f32_fallback),
    ),
    #[cfg(target_arch = "x86_64")]
    entry(
        "quantize_q8_1",
        None,
        A::Q8_1,
        Isa::Avx512,
        Kernel::QuantizeQ8_1(quantize_q8_1_avx512),
    ),
    entry(
        "quantize_q8_1",
        None,
        A::Q8_1,
        Isa::Fallback,
        Kernel::QuantizeQ8_1(quantize_q8_1_fallback),
    ),
];

/// Every kernel of the table (for listing them).
pub fn table() -> &'static [KernelEntry] {
    TABLE
}

/// The kernel multiplying a `weight` by `act` activations on this CPU, or
/// `None` where there is none (tiles × f32 without AVX-512; blocks × 8-bit
/// activations). Looked up once per (weight, activation) pair and cached.
pub fn kernel_for(weight: WeightFormat, act: ActivationFormat) -> Option<&'static KernelEntry> {
    const WEIGHTS: [WeightFormat; 5] = [W::F32, W::Q4_1, W::Q8_0, W::Q4_1x16, W::Q8_0x16];
    const ACTS: [ActivationFormat; 2] = [A::F32, A::Q8_1];
    type Chosen = [[Option<&'static KernelEntry>; 2]; 5];
    static CHOSEN: OnceLock<Chosen> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let isa = Isa::detected();
        WEIGHTS.map(|w| ACTS.map(|a| kernel_for_isa(w, a, isa)))
    });
    let w = WEIGHTS
        .iter()
        .position(|&w| w == weight)
        .expect("every format");
    let a = ACTS.iter().position(|&a| a == act).expect("every format");
    chosen[w][a]
}

/// The kernel for `weight` × `act` of the widest instruction set the CPU
/// has that is at most `isa` (`Isa::Fallback`: the portable one), or `None`
/// where there is none. Not cached: for tests and listings.
pub fn kernel_for_isa(
    weight: WeightFormat,
    act: ActivationFormat,
    isa: Isa,
) -> Option<&'static KernelEntry> {
    TABLE
        .iter()
        .find(|e| e.weight == Some(weight) && e.act == act && e.isa >= isa && e.isa.available())
}

/// The quantiser of rows of `x` to 8 bits on this CPU (cached).
pub(crate) fn quantizer() -> &'static KernelEntry {
    static CHOSEN: OnceLock<&'static KernelEntry> = OnceLock::new();
    CHOSEN.get_or_init(|| quantizer_for_isa(Isa::detected()))
}

/// The quantiser of the widest instruction set the CPU has, at most `isa`.
pub(crate) fn quantizer_for_isa(isa: Isa) -> &'static KernelEntry {
    TABLE
        .iter()
        .find(|e| e.weight.is_none() && e.isa >= isa && e.isa.available())
        .expect("a portable quantiser")
}

/// Runs `op` at the width of the detected instruction set
/// ([`Isa::detected`]; on other architectures than x86-64, pulp's widest
/// level): how the vector code outside the table (`exp`, SiLU and
/// log-softmax, RMSNorm, attention over f32 keys and values) learns the
/// instruction set, so that it runs at the width the table's kernels run at.
#[inline]
pub fn vectorize<Op: pulp::WithSimd>(op: Op) -> Op::Output {
    #[cfg(target_arch = "x86_64")]
    match Isa::detected() {
        Isa::AmxInt8 | Isa::Avx512Vnni | Isa::Avx512 => pulp::Simd::vectorize(v4(), op),
        Isa::Avx2 => pulp::Simd::vectorize(v3(), op),
        Isa::Fallback => pulp::Simd::vectorize(pulp::Scalar::new(), op),
    }
    #[cfg(not(target_arch = "x86_64"))]
    pulp::Arch::new().dispatch(op)
}

/// pulp's AVX-512 level where the detected instruction set has AVX-512
/// ([`Isa::has_avx512`]), else `None`: the attention widens f16 keys and
/// values in AVX-512 registers only then.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> Option<pulp::x86::V4> {
    Isa::detected().has_avx512().then(v4)
}

/// Whether the attention widens f16 keys and values in AVX-512 registers
/// on this CPU (the detected instruction set has AVX-512), else into f32
/// scratch first.
pub fn f16_kv_in_registers() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

// The entries' functions: each runs a kernel at one instruction set's
// width, inside that instruction set's `#[target_feature]` frame (pulp's
// `vectorize`). An entry is only chosen where its instruction set was
// detected, so the SIMD tokens below exist.

#[cfg(target_arch = "x86_64")]
fn v4() -> pulp::x86::V4 {
    pulp::x86::V4::try_new().expect("chosen for AVX-512")
}

#[cfg(target_arch = "x86_64")]
fn v3() -> pulp::x86::V3 {
    pulp::x86::V3::try_new().expect("chosen for AVX2")
}

#[cfg(target_arch = "x86_64")]
fn blocks_f32_avx512(w: &BlockWeight, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
    let simd = v4();
    let lut = blocks_f32::Lut::table(simd);
    pulp::Simd::vectorize(
        simd,
        blocks_f32::Task {
            w,
            first,
            x,
            y,
            lut,
        },
    );
}

#[cfg(target_arch = "x86_64")]
fn blocks_f32_avx2(w: &BlockWeight, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
    let lut = blocks_f32::Lut::ENTRY_BY_ENTRY;
    pulp::Simd::vectorize(
        v3(),
        blocks_f32::Task {
            w,
            first,
            x,
            y,
            lut,
        },
    );
}

/// Scalar on x86-64 (whose wider levels have their own entries); pulp's
/// widest level elsewhere.
fn blocks_f32_fallback(w: &BlockWeight, x: &[f32], first: usize, y: Vec<&mut [f32]>) {
    let lut = blocks_f32::Lut::ENTRY_BY_ENTRY;
    let task = blocks_f32::Task {
        w,
        first,
        x,
        y,
        lut,
    };
    #[cfg(target_arch = "x86_64")]
    pulp::Simd::vectorize(pulp::Scalar::new(), task);
    #[cfg(not(target_arch = "x86_64"))]
    pulp::Arch::new().dispatch(task);
}

#[cfg(target_arch = "x86_64")]
fn dense_f32_avx512(w: &[f32], k: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    pulp::Simd::vectorize(v4(), dense::Block { w, k, x, rows, yt });
}

#[cfg(target_arch = "x86_64")]
fn dense_f32_avx2(w: &[f32], k: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    pulp::Simd::vectorize(v3(), dense::Block { w, k, x, rows, yt });
}

/// Scalar on x86-64; pulp's widest level elsewhere.
fn dense_f32_fallback(w: &[f32], k: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    let block = dense::Block { w, k, x, rows, yt };
    #[cfg(target_arch = "x86_64")]
    pulp::Simd::vectorize(pulp::Scalar::new(), block);
    #[cfg(not(target_arch = "x86_64"))]
    pulp::Arch::new().dispatch(block);
}

/// From [`arch::x86::avx512_vnni_rows::MIN_ROWS`] rows on, the tiles
/// prepared once for all rows; fewer rows in groups over the tiles as they
/// stream in. The same bits either way.
#[cfg(target_arch = "x86_64")]
fn tiles_q8_avx512_vnni(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    if y.len() >= arch::x86::avx512_vnni_rows::MIN_ROWS {
        let kernel = arch::x86::avx512_vnni::Kernel::new(w.is_q4_1(), xq).expect("chosen for VNNI");
        return arch::x86::avx512_vnni_rows::tiles(&kernel, w, first, y);
    }
    tiles_q8_avx512_vnni_groups(w, xq, first, y);
}

/// VNNI's row groups over the tiles as they stream in, at any row count
/// (the tests compare the two VNNI kernels at every row count).
#[cfg(target_arch = "x86_64")]
pub(crate) fn tiles_q8_avx512_vnni_groups(
    w: &TiledWeight,
    xq: &Q8Rows,
    first: usize,
    y: &mut [&mut [f32]],
) {
    let kernel = arch::x86::avx512_vnni::Kernel::new(w.is_q4_1(), xq).expect("chosen for VNNI");
    let simd = kernel.v4();
    pulp::Simd::vectorize(
        simd,
        Tiles {
            w,
            first,
            y,
            kernel,
        },
    );
}

/// AMX int8 tiles from [`arch::x86::amx_int8::MIN_ROWS`] rows on; fewer
/// rows on VNNI's kernel (bound by reading the weights, where the tiles do
/// not help). The same bits either way.
#[cfg(target_arch = "x86_64")]
fn tiles_q8_amx_int8(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    if y.len() < arch::x86::amx_int8::MIN_ROWS {
        return tiles_q8_avx512_vnni(w, xq, first, y);
    }
    arch::x86::amx_int8::Kernel::new()
        .expect("chosen for AMX int8")
        .tiles(w, xq, first, y);
}

#[cfg(target_arch = "x86_64")]
fn tiles_q8_avx512(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    let simd = v4();
    let kernel = arch::x86::avx512::Kernel::new(simd, w.is_q4_1(), xq);
    pulp::Simd::vectorize(
        simd,
        Tiles {
            w,
            first,
            y,
            kernel,
        },
    );
}

#[cfg(target_arch = "x86_64")]
fn tiles_q8_avx2(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    let simd = v3();
    let kernel = arch::x86::avx2::Kernel::new(simd, w.is_q4_1(), xq);
    pulp::Simd::vectorize(
        simd,
        Tiles {
            w,
            first,
            y,
            kernel,
        },
    );
}

fn tiles_q8_fallback(w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
    let q4_1 = w.is_q4_1();
    w.for_each_tile(first, y, &mut Portable { q4_1, xq });
}

#[cfg(target_arch = "x86_64")]
fn quantize_q8_1_avx512(x: &[f32], parts: Q8Parts<'_>) {
    let simd = v4();
    simd.vectorize(|| {
        fill_blocks(x, parts, |x, q| {
            arch::x86::avx512::quantize_block(simd, x, q)
        });
    });
}

fn quantize_q8_1_fallback(x: &[f32], parts: Q8Parts<'_>) {
    fill_blocks(x, parts, quantize_block);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key has a portable kernel but tiles × f32 (AVX-512 only), the
    /// names state both formats, and entries print with their instruction set.
    #[test]
    fn table_covers_the_keys_and_prints_its_entries() {
        for (w, a) in [
            (W::F32, A::F32),
            (W::Q4_1, A::F32),
            (W::Q8_0, A::F32),
            (W::Q4_1x16, A::Q8_1),
            (W::Q8_0x16, A::Q8_1),
        ] {
            let e = kernel_for_isa(w, a, Isa::Fallback).expect("a portable kernel");
            assert_eq!(e.isa, Isa::Fallback);
            assert_eq!(kernel_for(w, a).map(|e| e.name), Some(e.name));
        }
        assert!(kernel_for_isa(W::Q4_1x16, A::F32, Isa::Fallback).is_none());
        assert!(kernel_for(W::Q4_1, A::Q8_1).is_none());
        let e = kernel_for_isa(W::Q4_1x16, A::Q8_1, Isa::Fallback).unwrap();
        assert_eq!(e.to_string(), "gemm_q4_1x16_q8_1 (fallback)");
        assert_eq!(
            quantizer_for_isa(Isa::Fallback).to_string(),
            "quantize_q8_1 (fallback)"
        );
        for e in table() {
            let key = e.weight.map_or("quantize", |_| "gemm_");
            assert!(e.name.starts_with(key), "{e}");
        }
        if let Some(e) = kernel_for(W::Q4_1x16, A::Q8_1) {
            assert_eq!(e.isa, Isa::detected());
        }
    }
}
