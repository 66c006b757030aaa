//! Prefill and decode speed of a GGUF model, and peak memory, as one line of
//! JSON on stdout (read by `cargo xtask bench`, see `xtask/src/speed.rs`).
//!
//! `cargo run --release -p privmix-models --example speed -- <model.gguf> [flex|wgpu] [prompt_len] [decode_len]`
//!
//! The prompt is the fixed ids `(100 + 37·i) mod vocab`, the same as
//! `xtask/scripts/llama_cpp_speed.py` feeds llama.cpp. Prefill: one forward of
//! the whole prompt from an empty cache, to the last position's logits on the
//! host (median of 3 after a warm-up run). Decode: `decode_len` steps of one
//! token through the cache, each reading its logits back and feeding the
//! argmax (greedy generation; after a warm-up of 4 steps). Threads of the CPU
//! backend: `RAYON_NUM_THREADS`. Peak memory: `VmHWM` of /proc/self/status
//! after load, prefill and decode, beside the model's weights in f32 (sum of
//! the GGUF tensors' elements × 4 bytes); also the resident size once the
//! backend has started (before any weight) and after the load. Last, after
//! the peak was read, the time of one streaming read of a buffer the size of
//! the f32 weights (`f32_weights_read_s`) and its inverse: the decode speed
//! no engine reading f32 weights can exceed on this machine; and the time of
//! one `[1, 576] × [576, 576]` product through burn's matmul on the backend
//! (`matvec_576_s`), the cost of one q or o projection of a decode step; and
//! the fixed cost of one kernel dispatch on the backend (`dispatch_s`).

use std::time::Instant;

use burn::tensor::backend::Backend;
use privmix_models::ModelBackend;
use privmix_models::gguf::GgufFile;
use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model};
use rayon::prelude::*;

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median of `samples` calls of `once` (each returning seconds), after
/// `warmups` calls whose results are dropped.
fn median_after_warmup(
    warmups: usize,
    samples: usize,
    mut once: impl FnMut() -> Result<f64, String>,
) -> Result<f64, String> {
    for _ in 0..warmups {
        once()?;
    }
    Ok(median(
        (0..samples).map(|_| once()).collect::<Result<_, _>>()?,
    ))
}

/// A `/proc/self/status` size in bytes (`VmHWM`, `VmRSS`), if the kernel reports it.
fn status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size in bytes (`VmHWM`), if the kernel reports it.
fn vm_hwm_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Seconds one streaming read of `bytes` of f32 values takes on rayon's
/// threads (median of 3 after a warm-up): the floor of a decode step of an
/// engine that keeps its weights in f32, since every step multiplies by
/// every weight once. Sixteen independent partial sums per task, so that
/// the read, not an add chain, bounds it.
fn f32_read_seconds(bytes: u64) -> Result<f64, String> {
    let buffer: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
    let read = || {
        let t = Instant::now();
        let sum: f32 = buffer
            .par_chunks(1 << 16)
            .map(|chunk| {
                let mut acc = [0.0f32; 16];
                for v in chunk.chunks_exact(16) {
                    for (a, x) in acc.iter_mut().zip(v) {
                        *a += x;
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum();
        std::hint::black_box(sum);
        Ok(t.elapsed().as_secs_f64())
    };
    median_after_warmup(1, 3, read)
}

/// Seconds one `[1, 576] × [576, 576]` f32 product takes on the backend,
/// read back to the host (median of 20 after 5 warm-ups; SmolLM2's q and o
/// projections have this shape): on wgpu, what burn's own matmul kernel costs
/// per projection of a decode step.
fn matvec_576_seconds<B: Backend>(device: &B::Device) -> Result<f64, String> {
    use burn::tensor::{Distribution, Tensor};
    let w = Tensor::<B, 2>::random([576, 576], Distribution::Uniform(-0.05, 0.05), device);
    let x = Tensor::<B, 2>::random([1, 576], Distribution::Uniform(-1.0, 1.0), device);
    let once = || -> Result<f64, String> {
        let t = Instant::now();
        to_vec(x.clone().matmul(w.clone().transpose())).map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64())
    };
    median_after_warmup(5, 20, once)
}

/// Seconds per kernel dispatch on the backend: a chain of 64 dependent
/// `add_scalar`s on a `[1, 64]` tensor, each one kernel launch (burn's wgpu
/// backend is built without fusion here), read back once at the end (median
/// of 11 chains after a warm-up, divided by 64). The arithmetic is 64 adds,
/// so this is the fixed cost every operation of a decode step pays: burn,
/// cubecl and wgpu on the host side, the driver's launch on the device side.
/// On lavapipe it varies from run to run (23–130 µs seen), with how the
/// driver's threads and the host share the two cores.
fn dispatch_seconds<B: Backend>(device: &B::Device) -> Result<f64, String> {
    use burn::tensor::Tensor;
    const CHAIN: usize = 64;
    let x = Tensor::<B, 2>::ones([1, 64], device);
    let once = || -> Result<f64, String> {
        let t = Instant::now();
        let mut y = x.clone();
        for _ in 0..CHAIN {
            y = y.add_scalar(1.0);
        }
        let out = to_vec(y).map_err(|e| e.to_string())?;
        // The chain really ran: every element went from 1 to 1 + CHAIN.
        if out.iter().any(|&v| v != 1.0 + CHAIN as f32) {
            return Err(format!("dispatch chain gave {:?}", &out[..4]));
        }
        Ok(t.elapsed().as_secs_f64() / CHAIN as f64)
    };
    median_after_warmup(1, 11, once)
}

fn run<B: ModelBackend>(
    device: B::Device,
    path: &str,
    backend: &str,
    prompt_len: usize,
    decode_len: usize,
) -> Result<String, String> {
    // The runtime before any weight: one tiny tensor written and read back
    // starts the device (on wgpu: the Vulkan driver, its JIT, cubecl's pools).
    let probe = burn::tensor::Tensor::<B, 1>::from_floats([1.0f32], &device);
    to_vec(probe).map_err(|e| e.to_string())?;
    let runtime_rss = status_bytes("VmRSS:");
    let t = Instant::now();
    let model = Model::<B>::load(LoadOptions::path(path, &device))
        .map_err(|e| format!("load {path}: {e}"))?;
    let load_s = t.elapsed().as_secs_f64();
    let load_peak = vm_hwm_bytes();
    let loaded_rss = status_bytes("VmRSS:");
    let vocab = model.vocab_size();
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| ((100 + 37 * i) % vocab) as u32)
        .collect();
    let batch = Batch::single(&prompt).map_err(|e| e.to_string())?;

    let prefill = || -> Result<(f64, Vec<f32>, _), String> {
        let t = Instant::now();
        let mut cache = model.new_cache(1);
        let logits = model
            .logits_last(&batch, &mut cache, None)
            .map_err(|e| e.to_string())?;
        let row = to_vec(logits).map_err(|e| e.to_string())?;
        Ok((t.elapsed().as_secs_f64(), row, cache))
    };
    let prefill_s = median_after_warmup(1, 3, || Ok(prefill()?.0))?;

    let (_, row, mut cache) = prefill()?;
    let mut next = argmax(&row);
    let mut step = |next: &mut u32| -> Result<(), String> {
        let b = Batch::single(&[*next]).map_err(|e| e.to_string())?;
        let logits = model
            .logits_last(&b, &mut cache, None)
            .map_err(|e| e.to_string())?;
        *next = argmax(&to_vec(logits).map_err(|e| e.to_string())?);
        Ok(())
    };
    for _ in 0..4 {
        step(&mut next)?;
    }
    let t = Instant::now();
    for _ in 0..decode_len {
        step(&mut next)?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    let peak = vm_hwm_bytes();

    let file = GgufFile::open(path).map_err(|e| format!("{path}: {e}"))?;
    let f32_bytes: u64 = file.tensors.iter().map(|t| t.n_elements * 4).sum();
    // After the peak was read: this allocates the f32 weights' size again.
    let f32_read_s = f32_read_seconds(f32_bytes)?;
    let matvec_576_s = matvec_576_seconds::<B>(&device)?;
    let dispatch_s = dispatch_seconds::<B>(&device)?;
    Ok(serde_json::json!({
        "engine": "privmix",
        "backend": backend,
        "plan": model.plan().to_string(),
        "threads": std::env::var("RAYON_NUM_THREADS").ok(),
        "load_s": load_s,
        "prompt_tokens": prompt_len,
        "prefill_s": prefill_s,
        "prefill_tok_s": prompt_len as f64 / prefill_s,
        "decode_tokens": decode_len,
        "decode_s": decode_s,
        "decode_tok_s": decode_len as f64 / decode_s,
        "runtime_rss_bytes": runtime_rss,
        "load_peak_bytes": load_peak,
        "loaded_rss_bytes": loaded_rss,
        "vm_hwm_bytes": peak,
        "f32_weight_bytes": f32_bytes,
        "peak_over_f32_weights": peak.map(|p| p as f64 / f32_bytes as f64),
        "f32_weights_read_s": f32_read_s,
        "f32_decode_ceiling_tok_s": 1.0 / f32_read_s,
        "matvec_576_s": matvec_576_s,
        "dispatch_s": dispatch_s,
    })
    .to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: speed <model.gguf> [flex|wgpu] [prompt_len] [decode_len]");
        std::process::exit(2);
    };
    let backend = args.get(1).map_or("flex", String::as_str);
    let number = |i: usize, default: usize| {
        args.get(i)
            .map_or(Ok(default), |s| s.parse::<usize>())
            .unwrap_or_else(|e| {
                eprintln!("bad number {:?}: {e}", args[i]);
                std::process::exit(2)
            })
    };
    let (prompt_len, decode_len) = (number(2, 128), number(3, 64));
    let result = match backend {
        "flex" => {
            run::<burn::backend::Flex>(Default::default(), path, backend, prompt_len, decode_len)
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => privmix_models::open_wgpu_device()
            .map_err(|e| e.to_string())
            .and_then(|device| {
                run::<burn::backend::Wgpu>(device, path, backend, prompt_len, decode_len)
            }),
        other => Err(format!(
            "backend {other} not available (flex; wgpu with --features wgpu)"
        )),
    };
    match result {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("speed: {e}");
            std::process::exit(1);
        }
    }
}
