//! Gemma hyper-parameters from an HF `config.json` (transformers 4.x and 5
//! layouts) or from GGUF metadata (llama.cpp conventions).

use serde_json::Value;

use crate::config_fields::{
    check_dims, gguf_f64_opt, gguf_rope_scaling, gguf_str, gguf_usize, gguf_usize_opt,
    gguf_vocab_size, hf_rope, json_f64_opt, json_usize, json_usize_opt, rope_scaling,
};
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::layers::RopeScaling;

/// Which Gemma generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmaVersion {
    /// Gemma (1).
    V1,
    /// Gemma 2.
    V2,
    /// Gemma 3 (text model).
    V3,
}

/// Hyper-parameters of a Gemma model (HF names).
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// Generation.
    pub version: GemmaVersion,
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
    /// RoPE base of global (full-attention) layers.
    pub rope_theta: f64,
    /// RoPE scaling of global layers.
    pub rope_scaling: RopeScaling,
    /// RoPE base of sliding-window layers (Gemma 3 `rope_local_base_freq`).
    pub rope_local_theta: f64,
    /// Queries are scaled by `query_pre_attn_scalar^-1/2`.
    pub query_pre_attn_scalar: f64,
    /// Gemma 2 attention-logit soft-cap.
    pub attn_logit_softcapping: Option<f64>,
    /// Final-logit soft-cap.
    pub final_logit_softcapping: Option<f64>,
    /// Window of sliding layers (a key is visible iff `q − k < window`).
    pub sliding_window: Option<usize>,
    /// Per layer: whether it uses the sliding window.
    pub sliding_layers: Vec<bool>,
    /// MLP activation is the tanh GELU (else the exact GELU).
    pub gelu_tanh: bool,
    /// Output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
}

impl GemmaConfig {
    /// From an HF `config.json` document (`model_type` gemma, gemma2, gemma3_text).
    pub fn from_hf(doc: &Value) -> Result<Self, ModelError> {
        let version = match doc.get("model_type").and_then(Value::as_str) {
            Some("gemma") => GemmaVersion::V1,
            Some("gemma2") => GemmaVersion::V2,
            Some("gemma3_text") => GemmaVersion::V3,
            Some(other) => return Err(ModelError::UnknownArchitecture(other.to_string())),
            None => return Err(ModelError::bad_config("model_type", "missing")),
        };
        let layers = json_usize(doc, "num_hidden_layers")?;
        let heads = json_usize(doc, "num_attention_heads")?;
        let hidden = json_usize(doc, "hidden_size")?;
        let head_dim = json_usize_opt(doc, "head_dim")?.unwrap_or(hidden / heads.max(1));
        let act = doc
            .get("hidden_activation")
            .and_then(Value::as_str)
            .or_else(|| doc.get("hidden_act").and_then(Value::as_str))
            .unwrap_or("gelu_pytorch_tanh");
        let gelu_tanh = match act {
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_tanh" => true,
            "gelu" => false,
            other => {
                return Err(ModelError::bad_config(
                    "hidden_activation",
                    format!("unsupported {other:?}"),
                ));
            }
        };
        // RoPE: Gemma 3 has one parameter set per layer type (transformers 5)
        // or `rope_local_base_freq` (4.x); the others one set.
        let per_type = doc
            .get("rope_parameters")
            .and_then(|p| p.get("full_attention"));
        let (theta, scaling, local) = match (version, per_type) {
            (GemmaVersion::V3, Some(full)) => {
                let local = doc
                    .get("rope_parameters")
                    .and_then(|p| p.get("sliding_attention"));
                let local_theta = local
                    .map(|l| json_f64_opt(l, "rope_theta"))
                    .transpose()?
                    .flatten();
                if let Some(l) = local
                    && rope_scaling(l, "rope_parameters.sliding_attention")? != RopeScaling::None
                {
                    return Err(ModelError::bad_config(
                        "rope_parameters.sliding_attention",
                        "scaled local RoPE is not supported",
                    ));
                }
                (
                    json_f64_opt(full, "rope_theta")?,
                    rope_scaling(full, "rope_parameters.full_attention")?,
                    local_theta,
                )
            }
            _ => {
                let (t, s) = hf_rope(doc)?;
                (t, s, json_f64_opt(doc, "rope_local_base_freq")?)
            }
        };
        let theta = theta.unwrap_or(10_000.0);
        let pattern = match version {
            GemmaVersion::V1 => 0,
            GemmaVersion::V2 => 2,
            GemmaVersion::V3 => json_usize_opt(doc, "sliding_window_pattern")?
                .or(json_usize_opt(doc, "_sliding_window_pattern")?)
                .unwrap_or(6),
        };
        let sliding_layers = match doc.get("layer_types") {
            Some(Value::Array(types)) if version != GemmaVersion::V1 => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(ModelError::bad_config(
                        "layer_types",
                        format!("unknown layer type {t}"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => default_pattern(layers, pattern),
        };
        let c = Self {
            version,
            vocab_size: json_usize(doc, "vocab_size")?,
            hidden_size: hidden,
            intermediate_size: json_usize(doc, "intermediate_size")?,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: json_usize_opt(doc, "num_key_value_heads")?.unwrap_or(heads),
            head_dim,
            rms_norm_eps: json_f64_opt(doc, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: theta,
            rope_scaling: scaling,
            rope_local_theta: local.unwrap_or(if version == GemmaVersion::V3 {
                10_000.0
            } else {
                theta
            }),
            query_pre_attn_scalar: match version {
                GemmaVersion::V1 => head_dim as f64,
                _ => json_f64_opt(doc, "query_pre_attn_scalar")?.unwrap_or(head_dim as f64),
            },
            attn_logit_softcapping: json_f64_opt(doc, "attn_logit_softcapping")?,
            final_logit_softcapping: json_f64_opt(doc, "final_logit_softcapping")?,
            sliding_window: match version {
                GemmaVersion::V1 => None,
                _ => json_usize_opt(doc, "sliding_window")?,
            },
            sliding_layers,
            gelu_tanh,
            tie_word_embeddings: crate::config_fields::json_bool_opt(doc, "tie_word_embeddings")?
                .unwrap_or(true),
        };
        c.check()?;
        Ok(c)
    }

    /// From GGUF metadata (`gemma`, `gemma2`, `gemma3`), following llama.cpp's
    /// `llama-model.cpp` for values the file does not store (Gemma 3's local
    /// RoPE base 10 000, the sliding patterns 2 and 6, the query scale).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = gguf_str(file, "general.architecture")?.to_string();
        let version = match arch.as_str() {
            "gemma" => GemmaVersion::V1,
            "gemma2" => GemmaVersion::V2,
            "gemma3" => GemmaVersion::V3,
            other => return Err(ModelError::UnknownArchitecture(other.to_string())),
        };
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = gguf_usize(file, &k("embedding_length"))?;
        let heads = gguf_usize(file, &k("attention.head_count"))?;
        let layers = gguf_usize(file, &k("block_count"))?;
        let head_dim =
            gguf_usize_opt(file, &k("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
        let theta = gguf_f64_opt(file, &k("rope.freq_base"))?.unwrap_or(10_000.0);
        // llama.cpp: the 27B models scale queries by (hidden / heads)^-1/2.
        let is_27b = matches!(
            (version, layers),
            (GemmaVersion::V2, 46) | (GemmaVersion::V3, 62)
        );
        let pattern = match version {
            GemmaVersion::V1 => 0,
            GemmaVersion::V2 => 2,
            GemmaVersion::V3 => 6,
        };
        let c = Self {
            version,
            vocab_size: gguf_vocab_size(file, &arch)?,
            hidden_size: hidden,
            intermediate_size: gguf_usize(file, &k("feed_forward_length"))?,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: gguf_usize_opt(file, &k("attention.head_count_kv"))?
                .unwrap_or(heads),
            head_dim,
            rms_norm_eps: gguf_f64_opt(file, &k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-6),
            rope_theta: theta,
            rope_scaling: gguf_rope_scaling(file, &arch)?,
            rope_local_theta: if version == GemmaVersion::V3 {
                10_000.0
            } else {
                theta
            },
            query_pre_attn_scalar: if is_27b {
                (hidden / heads) as f64
            } else {
                head_dim as f64
            },
            attn_logit_softcapping: gguf_f64_opt(file, &k("attn_logit_softcapping"))?,
            final_logit_softcapping: gguf_f64_opt(file, &k("final_logit_softcapping"))?,
            sliding_window: gguf_usize_opt(file, &k("attention.sliding_window"))?,
            sliding_layers: default_pattern(layers, pattern),
            gelu_tanh: true,
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
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
        if self.sliding_layers.len() != self.num_hidden_layers {
            return Err(ModelError::bad_config(
                "layer_types",
                format!(
                    "{} entries for {} layers",
                    self.sliding_layers.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(ModelError::bad_config("sliding_window", "must be positive"));
        }
        let positive = [
            self.rms_norm_eps,
            self.rope_theta,
            self.rope_local_theta,
            self.query_pre_attn_scalar,
            self.attn_logit_softcapping.unwrap_or(1.0),
            self.final_logit_softcapping.unwrap_or(1.0),
        ];
        if positive.iter().any(|&x| x.is_nan() || x <= 0.0) {
            return Err(ModelError::bad_config(
                "eps/theta/scalar/softcap",
                "must be positive",
            ));
        }
        Ok(())
    }
}

/// HF/llama.cpp default: layer `i` slides unless `(i + 1) % pattern == 0`
/// (`pattern` 0: no sliding layer).
fn default_pattern(layers: usize, pattern: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| pattern != 0 && (i + 1) % pattern != 0)
        .collect()
}
