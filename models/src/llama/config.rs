//! The Llama configuration, from an HF `config.json` or GGUF metadata.

use serde_json::Value;

use crate::config_fields::{
    check_dims, gguf_f64_opt, gguf_rope_scaling, gguf_usize, gguf_usize_opt, gguf_vocab_size,
    hf_rope, json_bool_opt, json_f64_opt, json_usize, json_usize_opt,
};
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::layers::{RopeScaling, RopeStyle};

/// Hyper-parameters of a Llama model (HF `LlamaConfig` names).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// RoPE pairing: HF's rotate-half for HF weights and for GGUF weights
    /// loaded with their Q/K permutation undone (the default);
    /// [`RopeStyle::Interleaved`] for GGUF Q/K rows kept in llama.cpp's order
    /// ([`crate::weights::WeightSource::keep_gguf_qk_permutation`]).
    pub rope_style: RopeStyle,
    /// Output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Q/K/V/O projections carry biases.
    pub attention_bias: bool,
    /// MLP projections carry biases.
    pub mlp_bias: bool,
}

impl LlamaConfig {
    /// From an HF `config.json` document.
    pub fn from_hf(doc: &Value) -> Result<Self, ModelError> {
        if let Some(act) = doc.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(ModelError::bad_config(
                "hidden_act",
                format!("{act:?}: only \"silu\" is supported"),
            ));
        }
        let hidden_size = json_usize(doc, "hidden_size")?;
        let num_attention_heads = json_usize(doc, "num_attention_heads")?;
        let (theta, rope_scaling) = hf_rope(doc)?;
        let c = Self {
            vocab_size: json_usize(doc, "vocab_size")?,
            hidden_size,
            intermediate_size: json_usize(doc, "intermediate_size")?,
            num_hidden_layers: json_usize(doc, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: json_usize_opt(doc, "num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim: json_usize_opt(doc, "head_dim")?
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: json_f64_opt(doc, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: theta.unwrap_or(10_000.0),
            rope_scaling,
            rope_style: RopeStyle::RotateHalf,
            tie_word_embeddings: json_bool_opt(doc, "tie_word_embeddings")?.unwrap_or(false),
            attention_bias: json_bool_opt(doc, "attention_bias")?.unwrap_or(false),
            mlp_bias: json_bool_opt(doc, "mlp_bias")?.unwrap_or(false),
        };
        c.check()?;
        Ok(c)
    }

    /// From GGUF metadata (`llama.*` keys); the head is tied when the file
    /// has no `output.weight`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let k = |s: &str| format!("llama.{s}");
        let hidden_size = gguf_usize(file, &k("embedding_length"))?;
        let num_attention_heads = gguf_usize(file, &k("attention.head_count"))?;
        let c = Self {
            vocab_size: gguf_vocab_size(file, "llama")?,
            hidden_size,
            intermediate_size: gguf_usize(file, &k("feed_forward_length"))?,
            num_hidden_layers: gguf_usize(file, &k("block_count"))?,
            num_attention_heads,
            num_key_value_heads: gguf_usize_opt(file, &k("attention.head_count_kv"))?
                .unwrap_or(num_attention_heads),
            head_dim: gguf_usize_opt(file, &k("attention.key_length"))?
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: gguf_f64_opt(file, &k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: gguf_f64_opt(file, &k("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_scaling: gguf_rope_scaling(file, "llama")?,
            rope_style: RopeStyle::RotateHalf,
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
            attention_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
            mlp_bias: file.tensor_info("blk.0.ffn_up.bias").is_some(),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), ModelError> {
        check_dims(
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.num_hidden_layers,
            self.vocab_size,
        )?;
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return Err(ModelError::bad_config(
                "rms_norm_eps/rope_theta",
                "must be positive",
            ));
        }
        Ok(())
    }
}
