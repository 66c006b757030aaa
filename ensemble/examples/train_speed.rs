//! Times LoRA fine-tuning steps and prints one JSON line: the figures
//! `cargo xtask bench --train-only` compares with PyTorch + PEFT (and
//! Opacus for DP-SGD) on the same GGUF file, shapes and threads.
//!
//! `cargo run --release -p privmix-ensemble --example train_speed -- [MODEL]
//!  [--mode lora|dpsgd] [--path fastest|autodiff] [--steps N] [--warmup N]
//!  [--rows R] [--seq T]`
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
    DpSgdConfig, DpSgdTrainer, NoiseSource, StepPath, TrainConfig, Trainer,
};
use privmix_models::{LanguageModel, Model};

type AB = Autodiff<Flex>;

struct Args {
    model: String,
    mode: String,
    path: StepPath,
    steps: usize,
    warmup: usize,
    rows: usize,
    seq: usize,
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
            _ if !arg.starts_with("--") => a.model = arg,
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if a.mode != "lora" && a.mode != "dpsgd" {
        return Err(format!("unknown mode {}", a.mode));
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let model = Model::<AB>::load(&a.model, &Default::default())?;
    let vocab = model.vocab_size();
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
    let mut seconds = Vec::with_capacity(a.steps);
    let mut losses = Vec::with_capacity(total);
    let host = match a.mode.as_str() {
        "lora" => {
            let mut cfg = TrainConfig::new(lora, total, 1);
            cfg.batch_size = a.rows;
            let mut t = Trainer::<AB, _>::new(&model, blocks, vec![], cfg)?.with_step_path(a.path);
            let host = t.uses_host_step()?;
            for i in 0..total {
                let start = Instant::now();
                losses.push(t.step()?);
                if i >= a.warmup {
                    seconds.push(start.elapsed().as_secs_f64());
                }
            }
            host
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
            for i in 0..total {
                let start = Instant::now();
                losses.push(t.step()?.mean_loss);
                if i >= a.warmup {
                    seconds.push(start.elapsed().as_secs_f64());
                }
            }
            host
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
