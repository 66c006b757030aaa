//! Llama (Touvron et al. 2023) and its descendants (SmolLM2, ...): pre-norm
//! decoder blocks with RMSNorm, rotary embeddings, grouped-query attention
//! and a SwiGLU MLP. Follows HF transformers' `modeling_llama.py`; the
//! forward is the shared [`crate::decoder`] with [`DecoderVariant::LLAMA`].

use crate::backend::ModelBackend;
use crate::decoder::{Decoder, DecoderBlockParts, DecoderConfig, DecoderShape, DecoderVariant};
use crate::layers::{AttentionConfig, RopeStyle};
use crate::plan::ExecutionPlan;

mod config;

pub use config::LlamaConfig;

/// A Llama model on backend `B`: the shared decoder with Llama's
/// configuration.
pub type Llama<B> = Decoder<B, LlamaConfig>;

/// One Llama decoder block's parameters, borrowed ([`Decoder::block_parts`]).
pub type LlamaBlockParts<'a, B> = DecoderBlockParts<'a, B>;

impl DecoderConfig for LlamaConfig {
    fn shape(&self) -> DecoderShape {
        let c = self;
        DecoderShape {
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
        }
    }

    fn variant(&self) -> DecoderVariant {
        DecoderVariant::LLAMA
    }

    fn with_host_training<B: ModelBackend>(&self, plan: ExecutionPlan) -> ExecutionPlan {
        // The host training step rotates halves (HF's pairing) only.
        plan.with_host_training::<B>(
            (self.rope_style != RopeStyle::RotateHalf)
                .then_some("llama.cpp's interleaved RoPE pairing"),
        )
    }
}
