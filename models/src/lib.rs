//! # privmix-models
//!
//! Language models for privmix on [burn](https://burn.dev) 0.21: GPT-2, Llama
//! and Gemma 1/2/3, loaded from Hugging Face
//! safetensors folders or GGUF files, with a per-row KV cache, padded
//! batches, log-probabilities on the device, greedy/sampled generation and a
//! LoRA hook ([`LinearDelta`]) on every projection.
//!
//! - [`gguf`]: a GGUF v2/v3 reader and dequantisation to `f32` (F32, F16,
//!   BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K), bit-exact against gguf-py.
//! - [`safetensors`]: single-file and sharded safetensors checkpoints.
//! - [`weights`]: tensors by canonical HF name from either format (GGUF names
//!   mapped, llama.cpp's Q/K permutation and Gemma `1 + w` norms undone).
//! - [`config`], [`gpt2`], [`llama`], [`gemma`]: configurations and forwards;
//!   [`decoder`]: the one decoder Llama and Gemma share, [`DecoderVariant`]
//!   stating what Gemma changes.
//! - [`layers`]: linear + LoRA hook, RMSNorm, LayerNorm, RoPE, attention, KV cache.
//! - [`backend`]: [`ModelBackend`], what the plan needs to know about a
//!   burn backend (where its tensors live, a host view of their values),
//!   implemented per backend type.
//! - [`ops`]: the block operations each forward is written in, with a tensor
//!   and a host implementation; [`plan`]: [`ExecutionPlan`], which of them
//!   (and which CPU kernels) run, chosen once at load and printable.
//! - `cpu` (feature `flex`): the CPU kernels of the host-memory decode path
//!   (quantised products, attention, activations) and their dispatch table.
//! - [`runtime`]: [`Batch`], [`LanguageModel`], generation helpers.
//! - [`model`]: [`Model`], any supported model, loaded as [`LoadOptions`]
//!   say (source, route, decode products, device).
//! - [`tokenizer`]: [`Tokenizer`], text to ids and back, with the end-of-turn
//!   stop ids; [`chat_template`]: [`ChatTemplate`], conversations rendered as
//!   transformers' `apply_chat_template` renders them.
//!
//! Numerics follow HF transformers in f32: the tests compare logits with
//! transformers' own to 1e-4.

// The README's quick start, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod backend;
pub mod bert;
pub mod chat_template;
pub mod config;
pub mod config_fields;
#[cfg(feature = "flex")]
pub mod cpu;
pub mod decoder;
pub mod error;
pub mod gemma;
pub mod gguf;
pub mod gpt2;
pub mod layers;
pub mod llama;
pub mod model;
pub mod ops;
pub mod plan;
pub mod runtime;
pub mod safetensors;
pub mod threads;
pub mod to_host;
pub mod tokenizer;
pub mod weights;
#[cfg(feature = "wgpu")]
pub mod wgpu_device;

pub use backend::{HostF32, ModelBackend, SharedF32};
pub use bert::{Bert, BertConfig, SentenceEncoder};
pub use chat_template::{ChatMessage, ChatTemplate};
pub use config::ModelConfig;
pub use decoder::{Decoder, DecoderBlockParts, DecoderVariant};
pub use error::ModelError;
pub use gemma::{Gemma, GemmaConfig, GemmaVersion};
pub use gpt2::{Gpt2, Gpt2Activation, Gpt2Config};
pub use layers::{KvCache, KvPrecision, LinearDelta, Projection, Site};
pub use llama::{Llama, LlamaBlockParts, LlamaConfig};
pub use model::{LoadOptions, Model, ModelSource};
pub use plan::{DecodeProducts, ExecutionPlan, Route};
pub use runtime::{Batch, LanguageModel, generate_greedy, generate_sampled, log_softmax};
pub use tokenizer::Tokenizer;
pub use weights::WeightSource;
#[cfg(feature = "wgpu")]
pub use wgpu_device::open_wgpu_device;

/// The CPU backend (burn-flex).
#[cfg(feature = "flex")]
pub type CpuBackend = burn::backend::Flex;

/// The wgpu backend (Vulkan; Mesa lavapipe on CPU-only machines).
#[cfg(feature = "wgpu")]
pub type WgpuBackend = burn::backend::Wgpu;

/// The CUDA backend.
#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Cuda;

/// The CPU backend with autodiff, for training adapters.
#[cfg(all(feature = "flex", feature = "autodiff"))]
pub type CpuAutodiffBackend = burn::backend::Autodiff<burn::backend::Flex>;
