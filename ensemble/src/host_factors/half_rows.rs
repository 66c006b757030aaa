//! f16 factors read on AVX-512, widened 16 at a time by `vcvtph2ps`
//! (exact: every f16 is an f32) right where [`super::ranks::add_ranks`] uses
//! them, so the update is bit for bit the f32 one over the same
//! values, with half the bytes read.

use pulp::x86::V4;

use super::ranks::{FactorRow, add_rank_groups};

/// Entries of a vector.
const LANES: usize = 16;

/// A row of f16 factors (their bits).
#[derive(Clone, Copy)]
struct HalfRow<'a>(&'a [u16]);

impl FactorRow<V4> for HalfRow<'_> {
    #[inline(always)]
    fn vector(self, simd: V4, v: usize) -> pulp::f32x16 {
        let h: [u16; LANES] = self.0[v * LANES..][..LANES].try_into().expect("16 entries");
        pulp::bytemuck::cast(simd.avx512f._mm512_cvtph_ps(pulp::bytemuck::cast(h)))
    }
    #[inline(always)]
    fn tail(self, i: usize) -> f32 {
        half::f16::from_bits(self.0[self.0.len() / LANES * LANES + i]).to_f32()
    }
}

/// [`super::AddRow`] over f16 factors, on a CPU with AVX-512.
pub(super) struct AddRowV4<'a> {
    pub v4: V4,
    pub rank: usize,
    pub a: &'a [u16],
    pub b: &'a [u16],
    pub x: &'a [f32],
    pub y: &'a mut [f32],
}

impl pulp::NullaryFnOnce for AddRowV4<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let AddRowV4 {
            v4,
            rank,
            a,
            b,
            x,
            y,
        } = self;
        let (inp, out) = (x.len(), y.len());
        let a = |j: usize| HalfRow(&a[j * inp..][..inp]);
        let b = |j: usize| HalfRow(&b[j * out..][..out]);
        add_rank_groups(v4, rank, x, (&a, &b), y);
    }
}
