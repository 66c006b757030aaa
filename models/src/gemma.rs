//! Gemma 1, 2 and 3 (text) in one file, switched by [`GemmaVersion`]; follows
//! HF transformers' `modeling_gemma.py`, `modeling_gemma2.py` and
//! `modeling_gemma3.py`. The forward is the shared [`crate::decoder`]; what
//! Gemma changes is stated by its [`DecoderVariant`] and its decoder shape:
//! - RMSNorm with gain `1 + w`; embeddings scaled by `√hidden` (cast to the
//!   weights' dtype, f32 here, as HF does);
//! - GeGLU MLP `down(gelu_tanh(gate(x)) · up(x))`; explicit `head_dim`;
//! - Gemma 2: queries scaled by `query_pre_attn_scalar^-1/2`, attention-logit
//!   and final-logit soft-capping, post-attention and pre/post-feedforward
//!   (sandwich) norms, sliding-window attention on alternate layers;
//! - Gemma 3: per-head q/k RMSNorm, sliding-window layers with their own
//!   (local) RoPE base, `layer_types` or a 5-local-1-global pattern.

mod config;

pub use config::{GemmaConfig, GemmaVersion};

use crate::decoder::{Decoder, DecoderConfig, DecoderShape, DecoderVariant};
use crate::layers::{AttentionConfig, RopeStyle};
use crate::ops::MlpActivation;

/// A Gemma model on backend `B`: the shared decoder with Gemma's
/// configuration.
pub type Gemma<B> = Decoder<B, GemmaConfig>;

impl GemmaConfig {
    /// How this Gemma's decoder differs from Llama's.
    pub fn variant(&self) -> DecoderVariant {
        DecoderVariant {
            embed_scale: Some((self.hidden_size as f64).sqrt() as f32),
            sandwich_norms: self.version != GemmaVersion::V1,
            activation: if self.gelu_tanh {
                MlpActivation::GeluTanh
            } else {
                MlpActivation::Gelu
            },
            sliding_window: self.sliding_window,
            local_rope_theta: Some(self.rope_local_theta),
            final_logit_softcap: self.final_logit_softcapping,
        }
    }
}

impl DecoderConfig for GemmaConfig {
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
                scale: c.query_pre_attn_scalar.powf(-0.5),
                softcap: c.attn_logit_softcapping,
            },
            attention_bias: false,
            mlp_bias: false,
            qk_norm: c.version == GemmaVersion::V3,
            rms_norm_eps: c.rms_norm_eps,
            norm_one_plus: true,
            tie_word_embeddings: c.tie_word_embeddings,
            sliding_layers: c.sliding_layers.clone(),
            rope_theta: c.rope_theta,
            rope_scaling: c.rope_scaling,
            rope_style: RopeStyle::RotateHalf,
        }
    }

    fn variant(&self) -> DecoderVariant {
        GemmaConfig::variant(self)
    }
}
