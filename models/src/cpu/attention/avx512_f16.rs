//! Keys and values held in f16, read on AVX-512: each vector widened
//! by `vcvtph2ps` (exact) right where [`super::answer::answer`] uses it, so the
//! attention is bit for bit that of an f32 cache holding the same
//! values, with half the bytes read.

use pulp::x86::V4;

use super::answer::{KvRead, Queries, answer};

/// Entries of a vector.
const LANES: usize = 16;

/// Keys `[dim, capacity]` and values `[t, dim]` as f16 bits.
#[derive(Clone, Copy)]
pub(crate) struct HalfKv<'a> {
    pub k_t: &'a [u16],
    pub capacity: usize,
    pub t: usize,
    pub v: &'a [u16],
    pub d: usize,
}

#[inline(always)]
fn widen(simd: V4, h: [u16; LANES]) -> pulp::f32x16 {
    pulp::bytemuck::cast(simd.avx512f._mm512_cvtph_ps(pulp::bytemuck::cast(h)))
}

impl KvRead<V4> for HalfKv<'_> {
    #[inline(always)]
    fn keys(self, simd: V4, c: usize, j: usize) -> pulp::f32x16 {
        let row = &self.k_t[c * self.capacity..(c + 1) * self.capacity];
        if j >= self.t {
            return pulp::bytemuck::cast([0.0f32; LANES]);
        }
        let mut h = [0u16; LANES];
        let n = (row.len() - j).min(LANES);
        h[..n].copy_from_slice(&row[j..j + n]);
        widen(simd, h)
    }
    #[inline(always)]
    fn value(self, simd: V4, j: usize, i: usize) -> pulp::f32x16 {
        let at = j * self.d + i * LANES;
        widen(simd, self.v[at..at + LANES].try_into().expect("16 entries"))
    }
    #[inline(always)]
    fn value_at(self, j: usize, c: usize) -> f32 {
        half::f16::from_bits(self.v[j * self.d + c]).to_f32()
    }
}

/// [`Queries`] of `Q` heads answered over f16 keys and values.
pub(crate) struct Group<'a, const Q: usize> {
    pub v4: V4,
    pub query: Queries<'a, HalfKv<'a>>,
}

impl<const Q: usize> pulp::NullaryFnOnce for Group<'_, Q> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        answer::<V4, HalfKv<'_>, Q>(self.v4, self.query);
    }
}
