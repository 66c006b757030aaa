//! Greedy generation from any supported model: a GGUF file or a Hugging Face
//! folder, with its `tokenizer.json`, on the CPU backend.
//!
//! `cargo run --release -p privmix-models --example generate -- MODEL TOKENIZER "prompt" [tokens]`

use privmix_models::{CpuBackend, LoadOptions, Model, Tokenizer, generate_greedy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, tokenizer, prompt, n) = match args.as_slice() {
        [m, t, p] => (m, t, p, 16),
        [m, t, p, n] => (m, t, p, n.parse()?),
        _ => return Err("usage: generate MODEL TOKENIZER PROMPT [TOKENS]".into()),
    };
    let device = Default::default();
    let model = Model::<CpuBackend>::load(LoadOptions::path(model, &device))?;
    let tokenizer = Tokenizer::from_file(tokenizer)?;
    println!("{}", model.plan());
    let prompt_ids = tokenizer.encode(prompt, true)?;
    let ids = generate_greedy(&model, &prompt_ids, n, None)?;
    println!("{prompt}{}", tokenizer.decode(&ids)?);
    Ok(())
}
