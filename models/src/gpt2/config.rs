//! GPT-2 hyper-parameters from an HF `config.json` (`GPT2Config` names) or
//! from GGUF metadata (llama.cpp's `gpt2` architecture keys).

use serde_json::Value;

use crate::config_fields::{
    gguf_f64_opt, gguf_usize, gguf_usize_opt, gguf_vocab_size, json_bool_opt, json_f64_opt,
    json_usize, json_usize_opt,
};
use crate::error::ModelError;
use crate::gguf::GgufFile;

/// The MLP nonlinearity (HF `activation_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpt2Activation {
    /// GELU with the tanh approximation: HF `"gelu_new"` (GPT-2's own),
    /// `"gelu_pytorch_tanh"`, `"gelu_fast"`; llama.cpp's `ggml_gelu`.
    GeluTanh,
    /// Exact GELU, `x · Φ(x)` (HF `"gelu"`).
    Gelu,
}

/// Hyper-parameters of a GPT-2 model (HF `GPT2Config` names).
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Number of learned positions (the context length).
    pub n_positions: usize,
    /// Residual stream width.
    pub n_embd: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// Attention heads (each `n_embd / n_head` wide).
    pub n_head: usize,
    /// MLP inner width (HF `n_inner`, `4 · n_embd` when null).
    pub n_inner: usize,
    /// LayerNorm epsilon.
    pub layer_norm_epsilon: f64,
    /// MLP nonlinearity.
    pub activation: Gpt2Activation,
    /// Output head shares the token embedding (GPT-2's own checkpoints do).
    pub tie_word_embeddings: bool,
}

impl Gpt2Config {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// From an HF `config.json` document. Options this forward does not
    /// implement (cross-attention, unscaled or layer-scaled attention) are
    /// rejected rather than run wrong.
    pub fn from_hf(doc: &Value) -> Result<Self, ModelError> {
        let activation = match doc.get("activation_function") {
            None | Some(Value::Null) => Gpt2Activation::GeluTanh,
            Some(v) => match v.as_str() {
                Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => Gpt2Activation::GeluTanh,
                Some("gelu") => Gpt2Activation::Gelu,
                _ => {
                    return Err(ModelError::bad_config(
                        "activation_function",
                        format!("{v}: supported are gelu_new, gelu_pytorch_tanh, gelu_fast, gelu"),
                    ));
                }
            },
        };
        for (key, default, supported) in [
            ("scale_attn_weights", true, true),
            ("scale_attn_by_inverse_layer_idx", false, false),
            ("add_cross_attention", false, false),
        ] {
            if json_bool_opt(doc, key)?.unwrap_or(default) != supported {
                return Err(ModelError::bad_config(
                    key,
                    format!("only {supported} is supported"),
                ));
            }
        }
        let n_embd = json_usize(doc, "n_embd")?;
        let c = Self {
            vocab_size: json_usize(doc, "vocab_size")?,
            n_positions: json_usize(doc, "n_positions")?,
            n_embd,
            n_layer: json_usize(doc, "n_layer")?,
            n_head: json_usize(doc, "n_head")?,
            n_inner: json_usize_opt(doc, "n_inner")?.unwrap_or(n_embd.saturating_mul(4)),
            layer_norm_epsilon: json_f64_opt(doc, "layer_norm_epsilon")?.unwrap_or(1e-5),
            activation,
            tie_word_embeddings: json_bool_opt(doc, "tie_word_embeddings")?.unwrap_or(true),
        };
        c.check()?;
        Ok(c)
    }

    /// From GGUF metadata (`gpt2.*` keys, as llama.cpp's converter writes
    /// them); the head is tied when the file has no `output.weight`, and the
    /// context length falls back to `position_embd.weight`'s row count.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let k = |s: &str| format!("gpt2.{s}");
        let n_embd = gguf_usize(file, &k("embedding_length"))?;
        let n_head = gguf_usize(file, &k("attention.head_count"))?;
        if let Some(kv) = gguf_usize_opt(file, &k("attention.head_count_kv"))?
            && kv != n_head
        {
            return Err(ModelError::bad_config(
                k("attention.head_count_kv"),
                format!("{kv} differs from head_count {n_head} (GPT-2 has no grouped queries)"),
            ));
        }
        let n_positions = match gguf_usize_opt(file, &k("context_length"))? {
            Some(n) => n,
            None => file
                .tensor_info("position_embd.weight")
                .and_then(|t| t.dims.get(1))
                .map(|&d| d as usize)
                .ok_or_else(|| ModelError::bad_config(k("context_length"), "missing"))?,
        };
        let c = Self {
            vocab_size: gguf_vocab_size(file, "gpt2")?,
            n_positions,
            n_embd,
            n_layer: gguf_usize(file, &k("block_count"))?,
            n_head,
            n_inner: gguf_usize_opt(file, &k("feed_forward_length"))?
                .unwrap_or(n_embd.saturating_mul(4)),
            layer_norm_epsilon: gguf_f64_opt(file, &k("attention.layer_norm_epsilon"))?
                .unwrap_or(1e-5),
            activation: Gpt2Activation::GeluTanh,
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), ModelError> {
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("n_positions", self.n_positions),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_inner", self.n_inner),
        ] {
            if v == 0 {
                return Err(ModelError::bad_config(field, "must be positive"));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelError::bad_config(
                "n_head",
                format!("{} does not divide n_embd {}", self.n_head, self.n_embd),
            ));
        }
        // Products the loader forms (weight shapes) must not overflow.
        for (field, a, b) in [
            ("vocab_size × n_embd", self.vocab_size, self.n_embd),
            ("n_positions × n_embd", self.n_positions, self.n_embd),
            (
                "n_embd × 3·n_embd",
                self.n_embd,
                self.n_embd.saturating_mul(3),
            ),
            ("n_embd × n_inner", self.n_embd, self.n_inner),
        ] {
            if a.checked_mul(b).is_none_or(|p| p > isize::MAX as usize / 4) {
                return Err(ModelError::bad_config(field, "too large"));
            }
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0) {
            return Err(ModelError::bad_config(
                "layer_norm_epsilon",
                "must be positive",
            ));
        }
        Ok(())
    }
}
