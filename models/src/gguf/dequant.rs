//! Dequantisation of ggml blocks to `f32`.
//!
//! Block layouts and arithmetic follow ggml's `dequantize_row_*`
//! (`ggml/src/ggml-quants.c`) and the numpy dequantisers of the Python `gguf`
//! package (`gguf/quants.py`), operation for operation in `f32` (products and
//! sums in the same order, no fused multiply-add), so results agree bit for
//! bit with the Python package (checked by `tests/integration/gguf_golden.rs`).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::error::GgufError;
use super::types::{GgmlType, QK_K};

/// Dequantises `n_elements` elements of type `ty` stored in `data`.
///
/// Errors: [`GgufError::UnsupportedGgmlType`] for types this crate cannot
/// dequantise; [`GgufError::NotWholeBlocks`] if `n_elements` is not a multiple
/// of the block size or `data` is not exactly the bytes of that many blocks.
pub fn dequantize(ty: GgmlType, data: &[u8], n_elements: u64) -> Result<Vec<f32>, GgufError> {
    if !ty.is_dequantisable() {
        return Err(GgufError::UnsupportedGgmlType(ty.name()));
    }
    let block = ty.block_size() as u64;
    let block_bytes = ty.type_size();
    if !n_elements.is_multiple_of(block) {
        return Err(GgufError::NotWholeBlocks {
            what: format!("element count for {}", ty.name()),
            value: n_elements,
            block,
        });
    }
    if !data.len().is_multiple_of(block_bytes) {
        return Err(GgufError::NotWholeBlocks {
            what: format!("byte length for {}", ty.name()),
            value: data.len() as u64,
            block: block_bytes as u64,
        });
    }
    let n_blocks = data.len() / block_bytes;
    if n_blocks as u64 != n_elements / block {
        return Err(GgufError::NotWholeBlocks {
            what: format!(
                "byte length for {} {} elements ({} blocks expected)",
                ty.name(),
                n_elements,
                n_elements / block
            ),
            value: data.len() as u64,
            block: block_bytes as u64,
        });
    }
    // The output has exactly n_elements values (checked equal to n_blocks ×
    // block above); each arm is one monomorphic loop, so the per-element work
    // is not behind a per-block match.
    let out = match ty {
        GgmlType::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => f16_slice_to_f32(data),
        GgmlType::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        GgmlType::Q8_0 => per_block(data, n_blocks, block_bytes, 32, q8_0),
        GgmlType::Q4_0 => per_block(data, n_blocks, block_bytes, 32, q4_0),
        GgmlType::Q4_1 => per_block(data, n_blocks, block_bytes, 32, q4_1),
        GgmlType::Q5_0 => per_block(data, n_blocks, block_bytes, 32, q5_0),
        GgmlType::Q4_K => per_block(data, n_blocks, block_bytes, QK_K, q4_k),
        GgmlType::Q6_K => per_block(data, n_blocks, block_bytes, QK_K, q6_k),
        _ => return Err(GgufError::UnsupportedGgmlType(ty.name())),
    };
    Ok(out)
}

/// F16 to f32 through `half`'s slice conversion, which uses the CPU's F16C
/// instructions when present (detected at run time) on whole vectors rather
/// than one call per element; f16 → f32 is exact either way.
pub(crate) fn f16_slice_to_f32(data: &[u8]) -> Vec<f32> {
    const CHUNK: usize = 256;
    let mut out = vec![0f32; data.len() / 2];
    let mut halves = [f16::ZERO; CHUNK];
    for (src, dst) in data.chunks(2 * CHUNK).zip(out.chunks_mut(CHUNK)) {
        for (h, b) in halves.iter_mut().zip(src.chunks_exact(2)) {
            *h = f16::from_le_bytes([b[0], b[1]]);
        }
        halves[..dst.len()].convert_to_f32_slice(dst);
    }
    out
}

/// Runs `unpack` over each block, appending `block` values per block.
fn per_block(
    data: &[u8],
    n_blocks: usize,
    block_bytes: usize,
    block: usize,
    unpack: fn(&[u8], &mut Vec<f32>),
) -> Vec<f32> {
    let mut out = Vec::with_capacity(n_blocks * block);
    for b in data.chunks_exact(block_bytes) {
        unpack(b, &mut out);
    }
    out
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `block_q8_0 { ggml_half d; int8_t qs[32]; }`: `y = d * q`.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
}

/// `block_q4_0 { ggml_half d; uint8_t qs[16]; }`: element `j < 16` is the low
/// nibble of `qs[j]`, element `j + 16` the high one; `y = d * (q - 8)`.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| d * f32::from((q & 0x0f) as i8 - 8)));
    out.extend(qs.iter().map(|&q| d * f32::from((q >> 4) as i8 - 8)));
}

/// `block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }`: `y = d * q + m`.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0f) + m));
    out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
}

/// `block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }`: the fifth bit
/// of element `j` is bit `j` of the little-endian `u32` `qh`; `y = d * (q - 16)`.
fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    let value = |nibble: u8, j: usize| {
        let high = ((qh >> j) & 1) as u8;
        d * f32::from((nibble | (high << 4)) as i8 - 16)
    };
    out.extend(qs.iter().enumerate().map(|(j, &q)| value(q & 0x0f, j)));
    out.extend(qs.iter().enumerate().map(|(j, &q)| value(q >> 4, j + 16)));
}

/// Unpacks the eight 6-bit scales and mins of a Q4_K/Q5_K super-block
/// (`get_scale_min_k4` in ggml-quants.c).
fn scale_min_k4(scales: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = scales[j] & 0x3f;
        mn[j] = scales[j + 4] & 0x3f;
        sc[j + 4] = (scales[j + 8] & 0x0f) | ((scales[j] >> 2) & 0x30);
        mn[j + 4] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// `block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[128]; }`:
/// eight sub-blocks of 32; sub-block `s` uses the low (even `s`) or high (odd
/// `s`) nibbles of `qs[32 * (s / 2)..][..32]`; `y = (d * sc) * q - dmin * m`.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let qs = &b[16..144];
    for s in 0..8 {
        let d1 = d * f32::from(sc[s]);
        let m1 = dmin * f32::from(mn[s]);
        let shift = 4 * (s % 2);
        let chunk = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        out.extend(
            chunk
                .iter()
                .map(|&q| d1 * f32::from((q >> shift) & 0x0f) - m1),
        );
    }
}

/// `block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_half d; }`:
/// two halves of 128; in half `h`, element `r` takes its low four bits from
/// `ql[64h + r % 64]` (high nibble if `r >= 64`) and its top two bits from
/// `qh[32h + r % 32]` at shift `2 * (r / 32)`; `y = (d * scale[e / 16]) * (q - 32)`.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 208);
    let scales = &b[192..208];
    // Scales first: `d * scale` is one f32 product per 16 elements, as in ggml.
    let mut scale = [0f32; 16];
    for (s, &raw) in scale.iter_mut().zip(scales) {
        *s = d * f32::from(raw as i8);
    }
    let mut y = [0f32; QK_K];
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        for l in 0..32 {
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 0x03) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 0x03) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 0x03) << 4),
                (ql[l + 32] >> 4) | ((qh[l] >> 6) << 4),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let e = 128 * h + 32 * k + l;
                y[e] = scale[e / 16] * f32::from(qk as i8 - 32);
            }
        }
    }
    out.extend_from_slice(&y);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_hand_computed_block() {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| 0.5 * (i - 16) as f32).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn q4_0_nibble_order() {
        let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend([0x9f; 16]); // low nibble 15 -> 7, high nibble 9 -> 1
        let y = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        assert!(y[..16].iter().all(|&v| v == 14.0));
        assert!(y[16..].iter().all(|&v| v == 2.0));
    }

    #[test]
    fn lengths_must_be_whole_blocks() {
        let b = [0u8; 34];
        assert!(dequantize(GgmlType::Q8_0, &b, 32).is_ok());
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &b, 31),
            Err(GgufError::NotWholeBlocks { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &b[..33], 32),
            Err(GgufError::NotWholeBlocks { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &b, 64),
            Err(GgufError::NotWholeBlocks { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q5_K, &[], 0),
            Err(GgufError::UnsupportedGgmlType("Q5_K"))
        ));
    }
}
