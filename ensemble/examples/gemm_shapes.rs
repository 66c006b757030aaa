//! Times the `gemm` crate on the products of a SmolLM2-135M training step
//! (4 × 128 tokens; hidden 576, K/V 192, MLP 1536, vocabulary 49152), both
//! layouts of the weight for the forward and the backward product, with the
//! rows split over two threads as the host training step splits them. Prints
//! GFLOP/s per shape; compares builds with and without the workspace's
//! `x86-v4` feature of `gemm` on one CPU.
//!
//! `cargo run --release -p privmix-ensemble --example gemm_shapes`

use std::time::Instant;

#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each thread writes its own rows of the destination (see `bench`).
#[allow(unsafe_code)]
unsafe impl Send for Out {}
#[derive(Clone, Copy)]
struct In(*const f32);
// SAFETY: read only.
#[allow(unsafe_code)]
unsafe impl Send for In {}

/// `c[m, n] = a[m, k] · b` with `b[l, j]` at `b[l · brs + j · bcs]`, the rows
/// split in two halves, one single-threaded `gemm` call each; GFLOP/s.
fn bench(m: usize, k: usize, n: usize, brs: usize, bcs: usize) -> f64 {
    let a = vec![0.01f32; m * k];
    let b = vec![0.02f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let reps = (1_500_000_000usize / (m * n * k)).max(2);
    let half = m / 2;
    let start = Instant::now();
    for _ in 0..reps {
        let (ap, bp, cp) = (In(a.as_ptr()), In(b.as_ptr()), Out(c.as_mut_ptr()));
        std::thread::scope(|s| {
            for t in 0..2 {
                s.spawn(move || {
                    let (ap, bp, cp) = (ap, bp, cp);
                    // SAFETY: thread t reads rows [t·half, (t+1)·half) of `a` and
                    // writes the same rows of `c`, all inside the buffers; `b` is
                    // read inside its k × n entries.
                    #[allow(unsafe_code)]
                    unsafe {
                        gemm::gemm(
                            half,
                            n,
                            k,
                            cp.0.add(t * half * n),
                            1,
                            n as isize,
                            false,
                            ap.0.add(t * half * k),
                            1,
                            k as isize,
                            bp.0,
                            bcs as isize,
                            brs as isize,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        )
                    }
                });
            }
        });
    }
    2.0 * (m * n * k * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let tokens = 512;
    println!("GFLOP/s; w_t: [fan_in, fan_out] row-major, w: [fan_out, fan_in] row-major");
    for (fan_in, fan_out, name) in [
        (576, 576, "q/o"),
        (576, 192, "k/v"),
        (576, 1536, "gate/up"),
        (1536, 576, "down"),
        (576, 49152, "head"),
    ] {
        let fwd_wt = bench(tokens, fan_in, fan_out, fan_out, 1);
        let fwd_w = bench(tokens, fan_in, fan_out, 1, fan_in);
        let bwd_wt = bench(tokens, fan_out, fan_in, 1, fan_out);
        let bwd_w = bench(tokens, fan_out, fan_in, fan_in, 1);
        println!(
            "{name:8} forward: w_t {fwd_wt:6.1}, w {fwd_w:6.1} | backward: w_t {bwd_wt:6.1}, w {bwd_w:6.1}"
        );
    }
}
