//! The tile × 8-bit product on AMX int8 tiles (Intel Advanced Matrix
//! Extensions: `tdpbssd` / `tdpbsud`, one 16 × 16 block of 32-bit sums of
//! 8-bit products per instruction), for many rows of `x` at once.
//!
//! What it computes: the integer block sums `I_orb = Σ_k qw_obk · q_rbk`
//! of [`crate::cpu::tiles_q8`], each an exact 32-bit sum as in every other
//! kernel, for up to 16 rows × 16 outputs × one block of 32 inputs per tile
//! instruction; then the same f32 steps in the same order as
//! [`super::avx512_vnni`] (AVX-512, per block: `fma(m, s, acc)` for Q4_1,
//! then `fma(I as f32, d · dₓ, acc)`). Exact integers and the same float
//! steps give the same bits as the VNNI kernel (tested).
//!
//! How (as llama.cpp's `ggml-cpu/amx/mmq.cpp` does it for these formats):
//! - the A tile is `m ≤ 16` rows of `x`'s 8-bit block (32 signed bytes
//!   each, read in place from the quantised rows with the row stride);
//! - the B tile is the weight block in VNNI layout, 8 rows of 64 bytes
//!   whose row `p` holds inputs `4p..4p + 4` of the 16 outputs. A Q8_0
//!   record ([`crate::cpu::repack::BlockQ8_0x16`]) is that layout already;
//!   a Q4_1 record's nibbles are unpacked once per tile into bytes 0..15
//!   (unsigned, hence `tdpbsud`: signed `x` × unsigned weights);
//! - one block (K = 32) per tile product, so that each block's sum stays
//!   its own; the sum is stored to a 1 KiB buffer and scaled in AVX-512
//!   registers while the next block's product runs (two sets of tile
//!   registers, used in turn).
//!
//! Why rows ≥ [`MIN_ROWS`] only: with few rows the product reads each
//! weight once and is bound by memory, where the tile unit does not help;
//! fewer rows go to the VNNI kernel (the same bits).
//!
//! Soundness: a tile instruction may run only on a CPU that reports
//! AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25) in a process
//! that the kernel granted the tile data state (`arch_prctl(
//! ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` returned 0; without it the
//! first tile instruction faults). [`permission`] checks both once per
//! process; a [`Kernel`] exists only after it succeeded and the CPU has
//! AVX-512 F/BW/VL and VNNI. The tile configuration is per thread: each
//! call loads it on the thread it runs on and releases it before it
//! returns ([`Configured`]).

use core::arch::asm;
use core::arch::x86_64::{
    __m512, _mm512_cvtepi32_ps, _mm512_fmadd_ps, _mm512_loadu_si512, _mm512_mul_ps, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_storeu_si512,
};
use std::sync::OnceLock;

use super::avx512::{load_f16, prefetch_ahead, q4_1_weights};
use crate::cpu::quants::Q8Rows;
use crate::cpu::repack::{BlockQ4_1x16, BlockQ8_0x16, Q4_1X16_BYTES, Q8_0X16_BYTES, TiledWeight};
use crate::cpu::{QK, TILE};

/// Fewest rows of `x` a product runs on the tile unit; fewer go to the
/// VNNI kernel.
pub(crate) const MIN_ROWS: usize = 16;

/// Rows of `x` per tile product (the tile unit's 16 rows).
const ROWS: usize = 16;

/// Bytes of a block's weights in VNNI layout: 8 rows of 64.
const B_BYTES: usize = 8 * 64;

/// Whether this process may run AMX int8 tile instructions: `Ok` once the
/// CPU reported AMX-TILE and AMX-INT8 and Linux granted the tile data
/// state, else why not. Checked, and the state requested, once per process.
/// The environment variable [`NO_AMX_VAR`] (any value) declines AMX before
/// asking: the table then runs VNNI's kernels (the same bits), for comparing
/// the two in one build.
pub(crate) fn permission() -> Result<(), &'static str> {
    static PERMISSION: OnceLock<Result<(), String>> = OnceLock::new();
    PERMISSION
        .get_or_init(request_permission)
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str)
}

/// Set (to any value), the kernels do not use AMX.
pub(crate) const NO_AMX_VAR: &str = "PRIVMIX_NO_AMX";

fn request_permission() -> Result<(), String> {
    if std::env::var_os(NO_AMX_VAR).is_some() {
        return Err(format!("{NO_AMX_VAR} is set"));
    }
    // CPUID leaf 7, sub-leaf 0, EDX: bit 24 AMX-TILE, bit 25 AMX-INT8.
    let max_leaf = core::arch::x86_64::__cpuid(0).eax;
    let edx = if max_leaf >= 7 {
        core::arch::x86_64::__cpuid_count(7, 0).edx
    } else {
        0
    };
    if edx & (1 << 24) == 0 || edx & (1 << 25) == 0 {
        return Err("the CPU reports no AMX-TILE / AMX-INT8 (CPUID leaf 7)".into());
    }
    request_tile_data()
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> Result<(), String> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, feature) takes two integers
    // and touches no memory of ours; it only asks the kernel to save and
    // restore the tile data state for this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "Linux refused the AMX tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, \
             XFEATURE_XTILEDATA): {})",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> Result<(), String> {
    Err("the AMX tile data state is requested only on Linux".into())
}

/// The tile kernel, for a CPU and process known to allow it.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    v4: pulp::x86::V4,
}

impl Kernel {
    /// The kernel, if this CPU has AVX-512 F/BW/VL, VNNI, AMX-TILE and
    /// AMX-INT8 and this process was granted the tile data state.
    pub(crate) fn new() -> Option<Self> {
        let v4 = pulp::x86::V4::try_new()?;
        (std::arch::is_x86_feature_detected!("avx512vnni") && permission().is_ok())
            .then_some(Kernel { v4 })
    }

    /// Output tiles `first..` (as many as `y[r]` has room for) of every row
    /// of `xq` times `w`, into `y`, on the calling thread.
    pub(crate) fn tiles(self, w: &TiledWeight, xq: &Q8Rows, first: usize, y: &mut [&mut [f32]]) {
        // SAFETY: `Kernel::new` found AVX-512 F/BW/VL, AMX-TILE and
        // AMX-INT8 on this CPU and the tile data state granted: every
        // feature `tiles_on` is compiled for and every instruction it runs.
        unsafe { tiles_on(self.v4, w, xq, first, y) }
    }
}

/// The tile configuration (palette 1) for `m` rows of `x`: tmm0 and tmm1
/// the 32-bit sums (`m` × 16), tmm2 and tmm3 the rows of `x` (`m` × 32
/// bytes), tmm4 and tmm5 the weights (8 × 64 bytes).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn for_rows(m: usize) -> Self {
        debug_assert!((1..=ROWS).contains(&m));
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut set = |tmm: usize, rows: usize, bytes: u16| {
            c[16 + 2 * tmm..18 + 2 * tmm].copy_from_slice(&bytes.to_le_bytes());
            c[48 + tmm] = rows as u8;
        };
        for tmm in [0, 1] {
            set(tmm, m, 64);
        }
        for tmm in [2, 3] {
            set(tmm, m, QK as u16);
        }
        for tmm in [4, 5] {
            set(tmm, 8, 64);
        }
        TileConfig(c)
    }
}

/// The tile registers configured on this thread until dropped
/// (`tilerelease`, also on unwinding).
struct Configured {
    rows: usize,
}

impl Configured {
    /// # Safety
    /// AMX-TILE must be usable (see the module's soundness note).
    #[inline]
    unsafe fn new(m: usize) -> Self {
        // SAFETY: the caller's contract.
        unsafe { load_config(m) };
        Configured { rows: m }
    }

    /// # Safety
    /// As [`Configured::new`].
    #[inline]
    unsafe fn set_rows(&mut self, m: usize) {
        if m != self.rows {
            // SAFETY: the caller's contract.
            unsafe { load_config(m) };
            self.rows = m;
        }
    }
}

/// Loads the tile configuration for `m` rows on this thread.
///
/// # Safety
/// AMX-TILE must be usable (see the module's soundness note).
#[inline]
unsafe fn load_config(m: usize) {
    let config = TileConfig::for_rows(m);
    // SAFETY: the caller guarantees AMX-TILE and the tile data state;
    // `config` is a valid 64-byte palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
}

impl Drop for Configured {
    fn drop(&mut self) {
        // SAFETY: a `Configured` exists only after `ldtilecfg` ran on this
        // thread, so AMX-TILE is usable here.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One block's 32-bit sums, `m` rows × 16 outputs (row stride 64 bytes).
#[repr(C, align(64))]
struct Sums([[i32; TILE]; ROWS]);

/// `sums = A · B` for `m` rows of `x` (`a`: the first row's block, rows
/// `stride` bytes apart) and one weight block in VNNI layout (`b`, 512
/// bytes), through tile registers set `SET` (0 or 1).
///
/// # Safety
/// AMX-INT8 usable and the tiles configured for `m` rows on this thread;
/// `a` holds `(m − 1)·stride + 32` bytes (checked by the caller's slices).
#[inline(always)]
unsafe fn block_sums<const Q4: bool, const SET: usize>(
    a: &[i8],
    stride: usize,
    b: &[u8],
    sums: &mut Sums,
) {
    debug_assert!(b.len() >= B_BYTES);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), sums.0.as_mut_ptr());
    macro_rules! product {
        ($dp:literal, $c:literal, $a:literal, $b:literal) => {
            // SAFETY: see the function's contract; the tiles read
            // `m` rows of `a` and 8 rows of 64 bytes of `b`, and write `m`
            // rows of 64 bytes of `sums`.
            unsafe {
                asm!(
                    concat!("tilezero ", $c),
                    concat!("tileloadd ", $a, ", [{a} + {sa}*1]"),
                    concat!("tileloadd ", $b, ", [{b} + {sb}*1]"),
                    concat!($dp, " ", $c, ", ", $a, ", ", $b),
                    concat!("tilestored [{c} + {sc}*1], ", $c),
                    a = in(reg) a,
                    sa = in(reg) stride,
                    b = in(reg) b,
                    sb = in(reg) 64usize,
                    c = in(reg) c,
                    sc = in(reg) 64usize,
                    options(nostack),
                )
            }
        };
    }
    match (Q4, SET) {
        (true, 0) => product!("tdpbsud", "tmm0", "tmm2", "tmm4"),
        (true, _) => product!("tdpbsud", "tmm1", "tmm3", "tmm5"),
        (false, 0) => product!("tdpbssd", "tmm0", "tmm2", "tmm4"),
        (false, _) => product!("tdpbssd", "tmm1", "tmm3", "tmm5"),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tiles_on(
    v4: pulp::x86::V4,
    w: &TiledWeight,
    xq: &Q8Rows,
    first: usize,
    y: &mut [&mut [f32]],
) {
    let rows = y.len();
    let nb = xq.inp / QK;
    let q4 = w.is_q4_1();
    let record = w.record_bytes();
    // A Q4_1 tile's weights unpacked to bytes, block after block.
    let mut unpacked = if q4 {
        vec![0u8; nb * B_BYTES]
    } else {
        Vec::new()
    };
    // SAFETY: the caller guarantees AMX-TILE and the tile data state.
    let mut configured = unsafe { Configured::new(rows.min(ROWS)) };
    for t in 0..y[0].len() / TILE {
        let tile = w.tile_bytes(first + t);
        if q4 {
            for (b, out) in unpacked.chunks_exact_mut(B_BYTES).enumerate() {
                prefetch_ahead(v4, tile, b * record, record);
                for (p, reg) in q4_1_weights(v4, &tile[b * record..][..record])
                    .iter()
                    .enumerate()
                {
                    // SAFETY: `out[64p..64p + 64]` lies in the block's 512 bytes.
                    unsafe { _mm512_storeu_si512(out[64 * p..].as_mut_ptr().cast(), *reg) };
                }
            }
        }
        let mut r0 = 0;
        while r0 < rows {
            let m = (rows - r0).min(ROWS);
            // SAFETY: as above.
            unsafe { configured.set_rows(m) };
            let group = Group {
                v4,
                tile,
                unpacked: &unpacked,
                xq,
                r0,
                nb,
            };
            macro_rules! dispatch {
                ($($r:literal)*) => {
                    match (q4, m) {
                        // SAFETY: the tiles are configured for `m` rows on
                        // this thread; the features as above.
                        $((true, $r) => unsafe { group.run::<true, $r>(&mut y[r0..r0 + m], t) },
                          (false, $r) => unsafe { group.run::<false, $r>(&mut y[r0..r0 + m], t) },)*
                        _ => unreachable!("groups hold 1 to {ROWS} rows"),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
            r0 += m;
        }
    }
    drop(configured);
}

/// One group of at most 16 rows over one tile.
struct Group<'a> {
    v4: pulp::x86::V4,
    tile: &'a [u8],
    unpacked: &'a [u8],
    xq: &'a Q8Rows,
    r0: usize,
    nb: usize,
}

impl Group<'_> {
    /// `y[j][t·16..][..16] = w_i · x_{r0 + j}` for the group's `R` rows.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and AMX-INT8 usable, and the tiles configured for
    /// `R` rows on this thread.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn run<const Q4: bool, const R: usize>(&self, y: &mut [&mut [f32]], t: usize) {
        let Group {
            v4,
            tile,
            unpacked,
            xq,
            r0,
            nb,
        } = *self;
        let inp = xq.inp;
        let record = if Q4 { Q4_1X16_BYTES } else { Q8_0X16_BYTES };
        // Rows r0..r0 + R of x from block b on: the A tile reads the block's
        // 32 bytes of each row, `inp` bytes apart.
        let a = |b: usize| &xq.q[r0 * inp + b * QK..][..(R - 1) * inp + QK];
        let weights = |b: usize| {
            if Q4 {
                &unpacked[b * B_BYTES..][..B_BYTES]
            } else {
                &tile[b * record..][..B_BYTES]
            }
        };
        let mut sums = [Sums([[0; TILE]; ROWS]), Sums([[0; TILE]; ROWS])];
        let issue = |b: usize, sums: &mut [Sums; 2]| {
            let (a, wb) = (a(b), weights(b));
            // SAFETY: the function's contract; `a` and `wb` are slices of
            // the lengths `block_sums` reads.
            unsafe {
                if b.is_multiple_of(2) {
                    block_sums::<Q4, 0>(a, inp, wb, &mut sums[0]);
                } else {
                    block_sums::<Q4, 1>(a, inp, wb, &mut sums[1]);
                }
            }
        };
        let mut acc: [__m512; R] = [_mm512_setzero_ps(); R];
        issue(0, &mut sums);
        for b in 0..nb {
            // The next block's tile product runs while this one is scaled.
            if b + 1 < nb {
                issue(b + 1, &mut sums);
            }
            if !Q4 {
                prefetch_ahead(v4, tile, b * record, record);
            }
            let rec = &tile[b * record..][..record];
            let s = &sums[b % 2].0;
            let at = |j: usize| (r0 + j) * nb + b;
            if Q4 {
                let d = load_f16(v4, rec, BlockQ4_1x16::D_AT);
                let m = load_f16(v4, rec, BlockQ4_1x16::M_AT);
                for j in 0..R {
                    // SAFETY: `s[j]` is 64 bytes.
                    let i = _mm512_cvtepi32_ps(unsafe { _mm512_loadu_si512(s[j].as_ptr().cast()) });
                    let (dx, sx) = (xq.d[at(j)], xq.s[at(j)]);
                    acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), acc[j]);
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
                    acc[j] = _mm512_fmadd_ps(i, scale, acc[j]);
                }
            } else {
                let d = load_f16(v4, rec, BlockQ8_0x16::D_AT);
                for j in 0..R {
                    // SAFETY: `s[j]` is 64 bytes.
                    let i = _mm512_cvtepi32_ps(unsafe { _mm512_loadu_si512(s[j].as_ptr().cast()) });
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(xq.d[at(j)]));
                    acc[j] = _mm512_fmadd_ps(i, scale, acc[j]);
                }
            }
        }
        for (yj, a) in y.iter_mut().zip(acc) {
            let out: [f32; TILE] = bytemuck::cast(a);
            yj[t * TILE..][..TILE].copy_from_slice(&out);
        }
    }
}
