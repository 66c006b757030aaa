//! Throughput of the quantised decode kernels (`cpu::blocks_f32`, and
//! `cpu::tiles_f32` and `cpu::tiles_q8` over the same weights
//! in 16-row tiles; `matmul_f32` runs on the calling thread) on
//! SmolLM2's three product shapes, for 1, 9 and 17 rows of `x` (a decode
//! step, the public model + 8 members, + 16 members), in multiply-adds per
//! second: the figure to compare with the cores' peak (2 FMA pipes × 16 f32
//! lanes per cycle on this machine's Zen 5).
//!
//! `cargo run --release -p privmix-models --example qk -- [threads]`
//!
//! Each shape × row count: 3 warm-up calls, then the best of 5 timings of
//! `reps` calls, all inside one rayon pool of `threads` threads (default 1).
//! Weights are synthetic blocks (the kernel's speed does not depend on the
//! values).

use privmix_models::cpu::BlockWeight;
use privmix_models::cpu::TiledWeight;
use privmix_models::gguf::GgmlType;

/// Synthetic GGUF bytes of an `[out, inp]` weight in `ty` (Q4_1 or Q8_0).
fn blocks(ty: GgmlType, out: usize, inp: usize) -> Vec<u8> {
    let (block_bytes, header) = match ty {
        GgmlType::Q4_1 => (20, 4),
        _ => (34, 2),
    };
    let mut raw = Vec::with_capacity(out * inp / 32 * block_bytes);
    for blk in 0..out * inp / 32 {
        raw.extend(half::f16::from_f32(0.01).to_le_bytes());
        if header == 4 {
            raw.extend(half::f16::from_f32(-0.05).to_le_bytes());
        }
        raw.extend((0..block_bytes - header).map(|j| ((blk * 31 + j * 7) % 256) as u8));
    }
    raw
}

fn main() {
    let threads: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().expect("threads: a positive integer"),
        None => 1,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let shapes = [
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 49152, 576),
    ];
    for (ty, out, inp) in shapes {
        let w = BlockWeight::from_ggml(ty, &blocks(ty, out, inp), out, inp)
            .expect("well-formed blocks")
            .expect("a quantised type");
        let int8 = TiledWeight::from_blocks(&w).expect("whole 16-row tiles");
        for rows in [1usize, 9, 17] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|j| (j % 17) as f32 / 8.0 - 1.0)
                .collect();
            let reps = (200_000_000 / (out * inp * rows)).max(3);
            let time = |f: &(dyn Fn() -> Vec<f32> + Sync)| {
                pool.install(|| {
                    for _ in 0..3 {
                        std::hint::black_box(f());
                    }
                    (0..5)
                        .map(|_| {
                            let t = std::time::Instant::now();
                            for _ in 0..reps {
                                std::hint::black_box(f());
                            }
                            t.elapsed().as_secs_f64() / reps as f64
                        })
                        .fold(f64::INFINITY, f64::min)
                })
            };
            let f32_x = time(&|| w.matmul(&x, rows));
            let tiles_x = time(&|| int8.matmul_f32(&x, rows).unwrap_or_default());
            let int8_x = time(&|| int8.matmul(&x, rows));
            let rate = |t: f64| (out * inp * rows) as f64 / t / 1e9;
            println!(
                "{ty:?} [{out}, {inp}] rows {rows:2}: f32 x {:8.1} µs {:6.1} GFMA/s | \
                 f32 x, tiles {:8.1} µs {:6.1} GFMA/s | \
                 8-bit x {:8.1} µs {:6.1} GMAC/s ({:.2}× faster)",
                f32_x * 1e6,
                rate(f32_x),
                tiles_x * 1e6,
                rate(tiles_x),
                int8_x * 1e6,
                rate(int8_x),
                f32_x / int8_x,
            );
        }
    }
}
