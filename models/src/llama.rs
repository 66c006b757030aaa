//! Llama (Touvron et al. 2023) and its descendants (SmolLM2, ...): pre-norm
//! decoder blocks with RMSNorm, rotary embeddings, grouped-query attention
//! and a SwiGLU MLP. Follows HF transformers' `modeling_llama.py`; the
//! forward is the shared [`crate::decoder`] with [`DecoderVariant::LLAMA`].

use burn::tensor::backend::Backend;

use crate::decoder::{Decoder, DecoderBlockParts, DecoderShape, DecoderVariant};
use crate::error::ModelError;
use crate::layers::{AttentionConfig, RopeStyle};
use crate::plan::ExecutionPlan;
use crate::weights::WeightSource;

mod config;

pub use config::LlamaConfig;

/// A Llama model on backend `B`: the shared decoder with Llama's
/// configuration.
pub type Llama<B> = Decoder<B, LlamaConfig>;

/// One Llama decoder block's parameters, borrowed ([`Decoder::block_parts`]).
pub type LlamaBlockParts<'a, B> = DecoderBlockParts<'a, B>;

impl<B: Backend> Decoder<B, LlamaConfig> {
    /// Builds the model from `weights` (HF names; see [`WeightSource`]),
    /// checking every tensor's shape against `config`, with `plan`'s
    /// load-time choices ([`crate::LoadOptions::plan`]); completes the plan
    /// from the projections it loaded. Reached through [`crate::Model::load`].
    pub(crate) fn from_plan(
        config: &LlamaConfig,
        weights: &WeightSource,
        plan: ExecutionPlan,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let c = config;
        // The host training step rotates halves (HF's pairing) only.
        let plan = plan.with_host_training::<B>(
            (c.rope_style != RopeStyle::RotateHalf)
                .then_some("llama.cpp's interleaved RoPE pairing"),
        );
        let shape = DecoderShape {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            attention: AttentionConfig {
                num_heads: c.num_attention_heads,
                num_kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                scale: (c.head_dim as f64).powf(-0.5),
                softcap: None,
            },
            attention_bias: c.attention_bias,
            mlp_bias: c.mlp_bias,
            qk_norm: false,
            rms_norm_eps: c.rms_norm_eps,
            norm_one_plus: false,
            tie_word_embeddings: c.tie_word_embeddings,
            sliding_layers: vec![false; c.num_hidden_layers],
            rope_theta: c.rope_theta,
            rope_scaling: c.rope_scaling,
            rope_style: c.rope_style,
        };
        Decoder::load(
            c.clone(),
            shape,
            DecoderVariant::LLAMA,
            weights,
            plan,
            device,
        )
    }
}
