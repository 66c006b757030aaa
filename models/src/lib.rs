//! # privmix-models
//!
//! Loading language-model weights for privmix.
//!
//! What exists now:
//! - [`gguf`]: a GGUF v2/v3 reader (metadata of every value type, the tensor
//!   info table, alignment and data-range checks made before any allocation)
//!   and dequantisation to `f32` of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//!   Q4_K and Q6_K, checked bit for bit against the Python `gguf` package.
//! - [`safetensors`]: single-file and sharded (`model.safetensors.index.json`)
//!   safetensors checkpoints, F32/F16/BF16 tensors read as `f32`.
//!
//! Still to come: GPT-2, Llama and Gemma models on burn (one model per file, a
//! config struct and a forward) built from these weights and Hugging Face
//! `config.json`, tokenizers through the `tokenizers` crate, a KV cache and
//! batched decoding (the runtime).

pub mod gguf;
pub mod safetensors;
