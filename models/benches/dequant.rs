//! Dequantisation throughput: 2^18 elements of each supported ggml type to
//! `f32`. The `baseline_f32_bytes` function decodes little-endian f32 bytes
//! (a copy at memory bandwidth), so each ratio shows what a format's unpacking
//! costs over just reading floats.
//!
//! Run: `cargo bench -p privmix-models --bench dequant`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::f16;
use privmix_models::gguf::{GgmlType, dequantize};

const N: usize = 1 << 18;

/// Byte offsets of the f16 scale fields in one block.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// Pseudo-random blocks (xorshift) with finite, normal f16 scales, and for
/// the float types finite values, so no subnormal or NaN arithmetic skews timing.
fn blocks(ty: GgmlType) -> Vec<u8> {
    let n_blocks = N / ty.block_size();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes: Vec<u8> = (0..n_blocks * ty.type_size())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let finite: Vec<u8> = match ty {
        GgmlType::F32 => 0.25f32.to_le_bytes().to_vec(),
        GgmlType::F16 | GgmlType::BF16 => vec![0x80, 0x3e],
        _ => f16::from_f32(0.01).to_le_bytes().to_vec(),
    };
    for (i, block) in bytes.chunks_exact_mut(ty.type_size()).enumerate() {
        if ty.block_size() == 1 {
            if i % 2 == 0 {
                block.copy_from_slice(&finite);
            } else {
                // keep some variety but clear the exponent's top bit: finite
                let top = block.len() - 1;
                block[top] &= 0x3f;
            }
        }
        for &at in scale_fields(ty) {
            block[at..at + 2].copy_from_slice(&finite);
        }
    }
    bytes
}

fn baseline_f32_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn dequant(c: &mut Criterion) {
    let mut group = c.benchmark_group("dequant_256k_elements");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(N as u64));
    let f32_bytes = blocks(GgmlType::F32);
    group.bench_function("baseline_f32_bytes", |b| {
        b.iter(|| baseline_f32_bytes(black_box(&f32_bytes)))
    });
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let bytes = blocks(ty);
        group.bench_function(ty.name(), |b| {
            b.iter(|| dequantize(ty, black_box(&bytes), N as u64).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, dequant);
criterion_main!(benches);
