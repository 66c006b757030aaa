//! The quantised formats the kernels read: GGUF's Q4_1 and Q8_0 weight
//! blocks ([`BlockQ4_1`], [`BlockQ8_0`]), a weight kept in them
//! ([`BlockWeight`]), and rows of `x` quantised to 8 bits per block
//! (`Q8Rows`, llama.cpp's Q8_1 as its SIMD code rounds: ties to even).
//!
//! Exactness: a block is dequantised with the same f32 expression as
//! [`crate::gguf`]'s dequantiser (`d·q + m` for Q4_1, `d·q` for Q8_0, each
//! rounded as Rust rounds it, without contraction), so the kernels over a
//! [`BlockWeight`] multiply `x` by *exactly* the f32 weights of the f32
//! path.

use half::f16;

use super::QK;
use crate::ModelError;
use crate::gguf::GgmlType;

/// A GGUF Q4_1 block: 32 weights `w = d·q + m` with `q` in `0..16`; element
/// `j < 16` is the low nibble of `qs[j]`, element `j + 16` its high nibble.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Nibbles.
    pub qs: [u8; QK / 2],
}

/// A GGUF Q8_0 block: 32 weights `w = d·q` with `q` a signed byte.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Signed bytes.
    pub qs: [i8; QK],
}

const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

impl BlockQ4_1 {
    /// The block from its file bytes (little-endian scales).
    pub fn from_bytes(b: &[u8; size_of::<Self>()]) -> Self {
        let (d, rest) = b.split_first_chunk::<2>().expect("20 bytes");
        let (m, qs) = rest.split_first_chunk::<2>().expect("18 bytes");
        BlockQ4_1 {
            d: f16::from_le_bytes(*d),
            m: f16::from_le_bytes(*m),
            qs: qs.try_into().expect("16 bytes"),
        }
    }
}

impl BlockQ8_0 {
    /// The block from its file bytes (a little-endian scale).
    pub fn from_bytes(b: &[u8; size_of::<Self>()]) -> Self {
        let (d, qs) = b.split_first_chunk::<2>().expect("34 bytes");
        BlockQ8_0 {
            d: f16::from_le_bytes(*d),
            qs: std::array::from_fn(|k| qs[k] as i8),
        }
    }
}

/// How a weight is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Plain f32 rows (a burn-flex tensor).
    F32,
    /// GGUF Q4_1 blocks ([`BlockQ4_1`]).
    Q4_1,
    /// GGUF Q8_0 blocks ([`BlockQ8_0`]).
    Q8_0,
    /// Q4_1 blocks repacked into 16-row tiles ([`super::repack::BlockQ4_1x16`]).
    Q4_1x16,
    /// Q8_0 blocks repacked into 16-row tiles ([`super::repack::BlockQ8_0x16`]).
    Q8_0x16,
}

/// How the rows of `x` a weight multiplies are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    /// f32 values.
    F32,
    /// 8 bits per value, a scale and a scaled sum per block of 32
    /// (llama.cpp's Q8_1; see the [module documentation](self)).
    Q8_1,
}

/// How a [`BlockWeight`] stores its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// [`BlockQ4_1`]: 16 bytes of nibbles per block, `d` and `m` per block.
    Q4_1,
    /// [`BlockQ8_0`]: 32 signed bytes per block, `d` per block.
    Q8_0,
}

/// An `[out, in]` weight kept in GGUF Q4_1 or Q8_0 blocks, with each
/// block's scale (and minimum) widened from f16 to f32 once, at load: the
/// quantised values, the scales and the minima each in one vector, block
/// after block, row after row.
#[derive(Clone)]
pub struct BlockWeight {
    pub(crate) format: Format,
    pub(crate) out: usize,
    pub(crate) inp: usize,
    /// Quantised values, block after block, row after row.
    pub(crate) q: Vec<u8>,
    /// `d` per block.
    pub(crate) scale: Vec<f32>,
    /// `m` per block (Q4_1 only).
    pub(crate) min: Vec<f32>,
}

impl std::fmt::Debug for BlockWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlockWeight({:?}, [{}, {}])",
            self.format, self.out, self.inp
        )
    }
}

impl BlockWeight {
    /// The weight from a GGUF tensor's raw bytes (`[out, in]`, ggml order), or
    /// `None` for a type these kernels do not read (the f32 path serves it).
    pub fn from_ggml(
        ty: GgmlType,
        bytes: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Option<Self>, ModelError> {
        let (format, block_bytes) = match ty {
            GgmlType::Q4_1 => (Format::Q4_1, size_of::<BlockQ4_1>()),
            GgmlType::Q8_0 => (Format::Q8_0, size_of::<BlockQ8_0>()),
            _ => return Ok(None),
        };
        if inp == 0 || !inp.is_multiple_of(QK) {
            return Ok(None);
        }
        let blocks = out * (inp / QK);
        if bytes.len() != blocks * block_bytes {
            return Err(ModelError::bad_input(format!(
                "{ty:?} weight [{out}, {inp}] needs {} bytes, has {}",
                blocks * block_bytes,
                bytes.len()
            )));
        }
        let values = match format {
            Format::Q4_1 => QK / 2,
            Format::Q8_0 => QK,
        };
        let mut w = BlockWeight {
            format,
            out,
            inp,
            q: Vec::with_capacity(blocks * values),
            scale: Vec::with_capacity(blocks),
            min: Vec::new(),
        };
        for b in bytes.chunks_exact(block_bytes) {
            match format {
                Format::Q4_1 => {
                    let block = BlockQ4_1::from_bytes(b.try_into().expect("whole block"));
                    w.scale.push(block.d.to_f32());
                    w.min.push(block.m.to_f32());
                    w.q.extend_from_slice(&block.qs);
                }
                Format::Q8_0 => {
                    let block = BlockQ8_0::from_bytes(b.try_into().expect("whole block"));
                    w.scale.push(block.d.to_f32());
                    w.q.extend(block.qs.map(|v| v as u8));
                }
            }
        }
        Ok(Some(w))
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// The block format.
    pub fn format(&self) -> WeightFormat {
        match self.format {
            Format::Q4_1 => WeightFormat::Q4_1,
            Format::Q8_0 => WeightFormat::Q8_0,
        }
    }

    /// The rows reordered: row `r` of the result is row `from[r]` of `self`
    /// (llama.cpp's q/k head permutation, undone at load).
    pub(crate) fn permute_rows(&self, from: &[usize]) -> Self {
        let nb = self.inp / QK;
        let qb = self.q.len() / (self.out * nb);
        let mut w = BlockWeight {
            q: Vec::with_capacity(self.q.len()),
            scale: Vec::with_capacity(self.scale.len()),
            min: Vec::with_capacity(self.min.len()),
            ..*self
        };
        for &r in from {
            w.q.extend_from_slice(&self.q[r * nb * qb..(r + 1) * nb * qb]);
            w.scale.extend_from_slice(&self.scale[r * nb..(r + 1) * nb]);
            if !self.min.is_empty() {
                w.min.extend_from_slice(&self.min[r * nb..(r + 1) * nb]);
            }
        }
        w
    }

    /// Row `o` dequantised (for tests and checks).
    pub fn row(&self, o: usize) -> Vec<f32> {
        let mut w = vec![0.0; self.inp];
        for (b, chunk) in w.chunks_exact_mut(QK).enumerate() {
            let block: &mut [f32; QK] = chunk.try_into().expect("QK entries");
            self.dequantize(o * (self.inp / QK) + b, block);
        }
        w
    }

    /// Block `index` (row-major over `[out, in/32]`) into `w`.
    fn dequantize(&self, index: usize, w: &mut [f32; QK]) {
        match self.format {
            Format::Q4_1 => dequantize_q4_1(
                self.scale[index],
                self.min[index],
                self.q[index * 16..][..16].try_into().expect("16 bytes"),
                w,
            ),
            Format::Q8_0 => dequantize_q8_0(
                self.scale[index],
                self.q[index * QK..][..QK].try_into().expect("32 bytes"),
                w,
            ),
        }
    }

    /// Bytes of quantised values per output column.
    pub(crate) fn bytes_per_column(&self) -> usize {
        self.q.len() / self.out.max(1)
    }
}

/// One Q4_1 block, with the dequantiser's expression `d·q + m`.
#[inline(always)]
pub(crate) fn dequantize_q4_1(d: f32, m: f32, qs: &[u8; 16], w: &mut [f32; QK]) {
    for j in 0..16 {
        w[j] = d * f32::from(qs[j] & 0x0f) + m;
        w[j + 16] = d * f32::from(qs[j] >> 4) + m;
    }
}

/// One Q8_0 block, with the dequantiser's expression `d·q`.
#[inline(always)]
pub(crate) fn dequantize_q8_0(d: f32, qs: &[u8; QK], w: &mut [f32; QK]) {
    for j in 0..QK {
        w[j] = d * f32::from(qs[j] as i8);
    }
}

/// Rows of `x` quantised to 8 bits per block of 32 (llama.cpp's Q8_1 as
/// its SIMD code rounds: ties to even). Each block of `x` is replaced by
/// `x̂ = dₓ·q` with `dₓ = max|x|/127` and `q = round(x/dₓ)`, so `|x − x̂| ≤
/// dₓ/2` per entry.
pub(crate) struct Q8Rows {
    pub(crate) inp: usize,
    /// `q`, row after row.
    pub(crate) q: Vec<i8>,
    /// `dₓ` per row and block; NaN for a block holding a non-finite value,
    /// so that it reaches the outputs (as it would in an f32 product).
    pub(crate) d: Vec<f32>,
    /// `dₓ · Σq` per row and block.
    pub(crate) s: Vec<f32>,
    /// `q + 128` as unsigned bytes (`q`'s bits with the top one flipped),
    /// for the VNNI kernel's Q8_0 products.
    pub(crate) biased: Vec<u8>,
}

/// The parts of one or more rows of a [`Q8Rows`] that a quantiser fills:
/// `q`, `d`, `s` and the biased copy of `q`.
pub(crate) type Q8Parts<'a> = (&'a mut [i8], &'a mut [f32], &'a mut [f32], &'a mut [u8]);

impl Q8Rows {
    /// Room for `rows` rows of width `inp`, to be filled row by row
    /// (possibly on several threads) through [`Q8Rows::rows_mut`].
    pub(crate) fn zeroed(rows: usize, inp: usize) -> Self {
        let blocks = rows * (inp / QK);
        Q8Rows {
            inp,
            q: vec![0; rows * inp],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            biased: vec![0x80; rows * inp],
        }
    }

    /// Each row's parts, in order, for [`Q8Row::fill`].
    pub(crate) fn rows_mut(&mut self) -> impl Iterator<Item = Q8Row<'_>> {
        let (inp, nb) = (self.inp.max(1), (self.inp / QK).max(1));
        self.q
            .chunks_exact_mut(inp)
            .zip(self.biased.chunks_exact_mut(inp))
            .zip(self.d.chunks_exact_mut(nb).zip(self.s.chunks_exact_mut(nb)))
            .map(|((q, biased), (d, s))| Q8Row { q, d, s, biased })
    }
}

/// One row of a [`Q8Rows`], to be filled.
pub(crate) struct Q8Row<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    biased: &'a mut [u8],
}

impl Q8Row<'_> {
    /// The row's parts, for a quantiser to fill.
    pub(crate) fn parts(&mut self) -> Q8Parts<'_> {
        (&mut *self.q, &mut *self.d, &mut *self.s, &mut *self.biased)
    }
}

/// Quantises `x` block by block by `quantize` into `q`, `d`, `s` and the
/// biased copy of `q`.
#[inline(always)]
pub(crate) fn fill_blocks(
    x: &[f32],
    (q, d, s, biased): Q8Parts<'_>,
    mut quantize: impl FnMut(&[f32; QK], &mut [i8; QK]) -> (f32, f32),
) {
    let parts = x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut().zip(s.iter_mut()));
    for ((xb, qb), (d, s)) in parts {
        let xb: &[f32; QK] = xb.try_into().expect("QK values");
        let qb: &mut [i8; QK] = qb.try_into().expect("QK values");
        (*d, *s) = quantize(xb, qb);
    }
    for (b, &v) in biased.iter_mut().zip(q.iter()) {
        *b = (v as u8) ^ 0x80;
    }
}

/// One block of `x`: `q = round(x/d)` with `d = max|x|/127`, so `|q| ≤ 127`.
/// Returns `(d, d·Σq)`.
pub(crate) fn quantize_block(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    if x.iter().any(|v| !v.is_finite()) {
        q.fill(0);
        return (f32::NAN, f32::NAN);
    }
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    // Below 127 times the least subnormal, d underflows to 0: the block is
    // taken as zeros (an error under 1e-43 per weight).
    let d = amax / 127.0;
    if d == 0.0 {
        q.fill(0);
        return (0.0, 0.0);
    }
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        // |x/d| ≤ 127·(1 + 2⁻²³), which rounds to at most 127.
        let v = (xi / d).round_ties_even() as i32;
        *qi = v as i8;
        sum += v;
    }
    (d, d * sum as f32)
}

#[cfg(test)]
pub(crate) mod tests;
