//! Times LoRA fine-tuning steps and prints one JSON line: the figures
//! `cargo xtask bench --train-only` compares with PyTorch + PEFT (and
//! Opacus for DP-SGD) on the same GGUF file, shapes and threads.
//!
//! `cargo run --release -p privmix-ensemble --example train_speed -- [MODEL]
//!  [--mode lora|dpsgd|products|shapes|members] [--path fastest|autodiff] [--steps N]
//!  [--warmup N] [--rows R] [--seq T] [--members N]`
//!
//! `members` times N members (4 by default) of `R` blocks each, trained
//! together (`JointTrainer`: one batched pass per step, every member's rows
//! through its own factors) and one after another (the same trainer stepping
//! one member at a time, so both read the same host copy of the model), the
//! two alternating step by step; it prints both rates and each step pair's
//! ratio.
//!
//! `products` times only the step's frozen-weight matrix products (no
//! attention, norms, loss, LoRA factors or optimizer): each of the
//! forward's `tokens × fan_in · fan_in × fan_out` products and the
//! backward's transposed ones, with the head, through the step's own
//! product (the `gemm` crate's packed kernels on tiles of the output that
//! rayon's threads share, `privmix_models::cpu::strided::matmul`). No step can beat that time with these kernels, so its tokens/s is
//! the ceiling of any f32 step on this machine's arithmetic.
//!
//! `shapes` times each projection's product on its own, the forward and the
//! backward one, with the weight stored either way round (`w_t`:
//! `[fan_in, fan_out]`, `w`: `[fan_out, fan_in]`, both row-major), and prints
//! GFLOP/s per shape: which layout suits which product on this CPU.
//!
//! MODEL defaults to the models crate's tiny Llama fixture. Each step is a
//! full optimizer step: forward, backward and AdamW on `R` blocks of `T`
//! input tokens (4 × 128 by default), LoRA rank 8, alpha 16, on `q_proj`
//! and `v_proj`, no dropout; `dpsgd` is a DP-SGD step over the same `R`
//! blocks (sampling rate 1, so all `R` each step), with per-example
//! gradients clipped to norm 1 and Gaussian noise of multiplier 1. The
//! threads are rayon's (`RAYON_NUM_THREADS`). Block tokens follow the
//! formula `peft_step.py` uses: `(1 + 1009·r + 7919·i) mod vocab`.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use privmix_ensemble::lora::LoraConfig;
use privmix_ensemble::train::{
    DpSgdConfig, DpSgdTrainer, JointTrainer, NoiseSource, StepPath, TrainConfig, Trainer,
};

use privmix_models::{LanguageModel, LlamaConfig, LoadOptions, Model};

type AB = Autodiff<Flex>;

struct Args {
    model: String,
    mode: String,
    path: StepPath,
    steps: usize,
    warmup: usize,
    rows: usize,
    seq: usize,
    members: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        model: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/tests/fixtures/hf/llama"
        )
        .into(),
        mode: "lora".into(),
        path: StepPath::Fastest,
        steps: 3,
        warmup: 1,
        rows: 4,
        seq: 128,
        members: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{v}: {e}"));
        match arg.as_str() {
            "--mode" => a.mode = value()?,
            "--path" => {
                a.path = match value()?.as_str() {
                    "fastest" => StepPath::Fastest,
                    "autodiff" => StepPath::Autodiff,
                    other => return Err(format!("unknown path {other}")),
                }
            }
            "--steps" => a.steps = number(value()?)?,
            "--warmup" => a.warmup = number(value()?)?,
            "--rows" => a.rows = number(value()?)?,
            "--seq" => a.seq = number(value()?)?,
            "--members" => a.members = number(value()?)?,
            _ if !arg.starts_with("--") => a.model = arg,
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if !["lora", "dpsgd", "products", "shapes", "members"].contains(&a.mode.as_str()) {
        return Err(format!("unknown mode {}", a.mode));
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let model = Model::<AB>::load(LoadOptions::path(&a.model, &Default::default()))?;
    let vocab = model.vocab_size();
    if a.mode == "shapes" {
        let Model::Llama(llama) = &model else {
            return Err("--mode shapes needs a Llama-family model".into());
        };
        println!("{}", product_shapes(&llama.config, a.rows * a.seq));
        return Ok(());
    }
    if a.mode == "members" {
        println!("{}", members(&model, &a)?);
        return Ok(());
    }
    let blocks: Vec<Vec<u32>> = (0..a.rows)
        .map(|r| {
            (0..=a.seq)
                .map(|i| ((1 + 1009 * r + 7919 * i) % vocab) as u32)
                .collect()
        })
        .collect();
    let mut lora = LoraConfig::new(8, 16.0, &["q_proj", "v_proj"])?;
    lora.lora_dropout = 0.0;
    let total = a.warmup + a.steps;
    let mut losses = Vec::with_capacity(total);
    let (host, seconds) = match a.mode.as_str() {
        "products" => {
            let Model::Llama(llama) = &model else {
                return Err("--mode products needs a Llama-family model".into());
            };
            let seconds = seconds_after_warmup(&a, || {
                Ok(frozen_products_seconds(&llama.config, a.rows * a.seq))
            })?;
            (true, seconds)
        }
        "lora" => {
            let mut cfg = TrainConfig::new(lora, total, 1);
            cfg.batch_size = a.rows;
            let mut t = Trainer::<AB, _>::new(&model, blocks, vec![], cfg)?.with_step_path(a.path);
            let host = t.uses_host_step()?;
            let seconds = seconds_after_warmup(&a, || {
                let start = Instant::now();
                losses.push(t.step()?);
                Ok(start.elapsed().as_secs_f64())
            })?;
            (host, seconds)
        }
        _ => {
            let cfg = DpSgdConfig {
                lora,
                learning_rate: 2e-4,
                warmup_steps: 0,
                total_steps: total,
                sampling_rate: 1.0,
                clip_norm: 1.0,
                noise_multiplier: 1.0,
                delta: 1e-5,
                adamw: Default::default(),
                seed: 1,
                noise: NoiseSource::Seeded(2),
            };
            let mut t = DpSgdTrainer::<AB, _>::new(&model, blocks, cfg)?.with_step_path(a.path);
            let host = t.uses_host_step()?;
            let seconds = seconds_after_warmup(&a, || {
                let start = Instant::now();
                losses.push(t.step()?.mean_loss);
                Ok(start.elapsed().as_secs_f64())
            })?;
            (host, seconds)
        }
    };
    let tokens = (a.rows * a.seq) as f64;
    let rates: Vec<f64> = seconds.iter().map(|s| tokens / s).collect();
    let json = serde_json::json!({
        "engine": "privmix",
        "mode": a.mode,
        "path": if host { "host" } else { "autodiff" },
        "threads": rayon::current_num_threads(),
        "rows": a.rows,
        "seq": a.seq,
        "step_seconds": seconds,
        "tokens_per_s": rates,
        "losses": losses,
    });
    println!("{json}");
    Ok(())
}

/// Members trained together against one after another (see the module
/// docs): member `k`'s blocks follow the same formula from row `k · R`.
/// Runs `a.warmup + a.steps` steps, each returning how long it took; the times of
/// those after the warm-up.
fn seconds_after_warmup(
    a: &Args,
    mut step: impl FnMut() -> Result<f64, Box<dyn std::error::Error>>,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut seconds = Vec::with_capacity(a.steps);
    for i in 0..a.warmup + a.steps {
        let elapsed = step()?;
        if i >= a.warmup {
            seconds.push(elapsed);
        }
    }
    Ok(seconds)
}

fn members(model: &Model<AB>, a: &Args) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let vocab = model.vocab_size();
    let total = a.warmup + a.steps;
    let trainers = (0..a.members)
        .map(|k| {
            let blocks: Vec<Vec<u32>> = (k * a.rows..(k + 1) * a.rows)
                .map(|r| {
                    (0..=a.seq)
                        .map(|i| ((1 + 1009 * r + 7919 * i) % vocab) as u32)
                        .collect()
                })
                .collect();
            let mut lora = LoraConfig::new(8, 16.0, &["q_proj", "v_proj"])?;
            lora.lora_dropout = 0.0;
            // Twice the steps: the joint and the one-by-one steps both advance them.
            let mut cfg = TrainConfig::new(lora, 2 * total, 1 + k as u64);
            cfg.batch_size = a.rows;
            Ok(Trainer::<AB, _>::new(model, blocks, vec![], cfg)?.with_step_path(a.path))
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    let mut joint = JointTrainer::new(trainers)?;
    let host = joint.uses_host_step()?;
    let all: Vec<usize> = (0..a.members).collect();
    let (mut together, mut alone) = (Vec::new(), Vec::new());
    for i in 0..total {
        let start = Instant::now();
        joint.step(&all)?;
        let t = start.elapsed().as_secs_f64();
        let start = Instant::now();
        for k in 0..a.members {
            joint.step(&[k])?;
        }
        let s = start.elapsed().as_secs_f64();
        if i >= a.warmup {
            together.push(t);
            alone.push(s);
        }
    }
    let tokens = (a.members * a.rows * a.seq) as f64;
    let rate = |v: &[f64]| v.iter().map(|s| tokens / s).collect::<Vec<f64>>();
    Ok(serde_json::json!({
        "engine": "privmix",
        "mode": "members",
        "path": if host { "host" } else { "autodiff" },
        "threads": rayon::current_num_threads(),
        "members": a.members,
        "rows": a.rows,
        "seq": a.seq,
        "together_seconds": together,
        "one_by_one_seconds": alone,
        "tokens_per_s": rate(&together),
        "one_by_one_tokens_per_s": rate(&alone),
        "ratios": alone.iter().zip(&together).map(|(s, t)| s / t).collect::<Vec<f64>>(),
    }))
}

/// Seconds to run every frozen-weight product of one training step over
/// `tokens` tokens of a Llama `config` (see the module docs): per layer the
/// q, k, v, o, gate, up and down products and their backward products
/// (`dy · Wᵀ`; layer 0's q, k and v ones are not needed), then the head's
/// forward and backward products.
fn frozen_products_seconds(config: &LlamaConfig, tokens: usize) -> f64 {
    let h = config.hidden_size;
    let qw = config.num_attention_heads * config.head_dim;
    let kw = config.num_key_value_heads * config.head_dim;
    let inter = config.intermediate_size;
    // (fan_in, fan_out, backward product needed) of each projection.
    let layer = |first: bool| {
        [
            (h, qw, !first),
            (h, kw, !first),
            (h, kw, !first),
            (qw, h, true),
            (h, inter, true),
            (h, inter, true),
            (inter, h, true),
        ]
    };
    let mut products: Vec<(usize, usize, bool)> = (0..config.num_hidden_layers)
        .flat_map(|l| layer(l == 0))
        .collect();
    products.push((h, config.vocab_size, true));
    let largest = products.iter().map(|&(i, o, _)| i * o).max().unwrap_or(0);
    let weights: Vec<f32> = (0..largest).map(|i| (i % 17) as f32 * 1e-3).collect();
    let widest = products
        .iter()
        .map(|&(i, o, _)| i.max(o))
        .max()
        .unwrap_or(0);
    let input: Vec<f32> = (0..tokens * widest)
        .map(|i| (i % 13) as f32 * 1e-2)
        .collect();
    let mut out = vec![0.0f32; tokens * widest];
    let start = Instant::now();
    for &(fan_in, fan_out, backward) in &products {
        // Forward: x[tokens, fan_in] · Wᵗ[fan_in, fan_out] (row-major, as the host step stores it).
        rows_split_product(
            &mut out,
            tokens,
            fan_in,
            fan_out,
            &input,
            (fan_out, 1),
            &weights,
        );
        if backward {
            // Backward: dy[tokens, fan_out] · W[fan_out, fan_in] (the step's second copy).
            rows_split_product(
                &mut out,
                tokens,
                fan_out,
                fan_in,
                &input,
                (fan_in, 1),
                &weights,
            );
        }
    }
    start.elapsed().as_secs_f64()
}

/// GFLOP/s of each projection's forward and backward product over `tokens`
/// tokens, with the weight stored either way round (see the module docs).
fn product_shapes(config: &LlamaConfig, tokens: usize) -> serde_json::Value {
    let h = config.hidden_size;
    let shapes = [
        ("q/o", h, config.num_attention_heads * config.head_dim),
        ("k/v", h, config.num_key_value_heads * config.head_dim),
        ("gate/up", h, config.intermediate_size),
        ("down", config.intermediate_size, h),
        ("head", h, config.vocab_size),
    ];
    let gflops = |k: usize, n: usize, strides: (usize, usize)| {
        let lhs = vec![0.01f32; tokens * k];
        let rhs = vec![0.02f32; k * n];
        let mut out = vec![0.0f32; tokens * n];
        let reps = (1_500_000_000 / (tokens * k * n)).max(2);
        let start = Instant::now();
        for _ in 0..reps {
            rows_split_product(&mut out, tokens, k, n, &lhs, strides, &rhs);
        }
        2.0 * (tokens * k * n * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    let rows: Vec<serde_json::Value> = shapes
        .iter()
        .map(|&(name, fan_in, fan_out)| {
            serde_json::json!({
                "shape": name,
                "fan_in": fan_in,
                "fan_out": fan_out,
                "forward_w_t": gflops(fan_in, fan_out, (fan_out, 1)),
                "forward_w": gflops(fan_in, fan_out, (1, fan_in)),
                "backward_w_t": gflops(fan_out, fan_in, (1, fan_out)),
                "backward_w": gflops(fan_out, fan_in, (fan_in, 1)),
            })
        })
        .collect();
    serde_json::json!({
        "engine": "privmix",
        "mode": "shapes",
        "threads": rayon::current_num_threads(),
        "tokens": tokens,
        "gflops": rows,
    })
}

/// `out[m, n] = lhs[m, k] · rhs`, `rhs[l, j]` at `rhs[l · strides.0 + j · strides.1]`:
/// the step's own product ([`privmix_models::cpu::strided::matmul`], cut
/// into tiles by its shape that rayon's threads share, each tile one
/// single-threaded `gemm` call).
fn rows_split_product(
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    lhs: &[f32],
    strides: (usize, usize),
    rhs: &[f32],
) {
    use privmix_models::cpu::strided::{Mat, matmul};
    let rhs = Mat {
        data: rhs,
        rs: strides.0,
        cs: strides.1,
    };
    matmul(out, m, n, k, false, 1.0, Mat::rows(lhs, k), rhs);
}
