//! Writes N LoRA members with random factors (rank 8 on `q_proj` and `v_proj`, fixed
//! seeds) as PEFT folders `member-0 … member-{N-1}` for a base model: stand-ins of the
//! right shape for speed and load measurements, where the factors' values do not
//! change the work. (Trained members come from `privmix train`.)
//!
//! `cargo run --release -p privmix-ensemble --example random_members -- MODEL OUT N`

use burn::backend::Flex;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_models::{LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out, n] = args.as_slice() else {
        return Err("usage: random_members MODEL OUT N".into());
    };
    let n: usize = n.parse()?;
    let device = Default::default();
    let model = Model::<Flex>::load(LoadOptions::path(model, &device))?;
    let base = model.base_shapes()?;
    for i in 0..n {
        let dir = std::path::Path::new(out).join(format!("member-{i}"));
        if dir.join("adapter_model.safetensors").is_file() {
            continue;
        }
        let config = LoraConfig::new(8, 16.0, &["q_proj", "v_proj"])?;
        let adapter = LoraAdapter::<Flex>::random(config, &base, 0.02, 1000 + i as u64, &device)?;
        adapter.save_peft(&dir)?;
    }
    println!("{n} members in {out}");
    Ok(())
}
