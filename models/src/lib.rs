//! # privmix-models
//!
//! Not yet implemented: this crate is a placeholder in the workspace so that the
//! dependency graph of the design card is fixed from the start.
//!
//! What will live here: GPT-2, Llama and Gemma language models on burn 0.21 (one
//! model per file, a config struct and a forward), loaded from Hugging Face
//! `config.json` + safetensors folders and from GGUF v3 files (with dequantisation),
//! tokenizers through the `tokenizers` crate, a KV cache and batched decoding.
