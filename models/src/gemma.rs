//! Gemma 1, 2 and 3 (text) in one file, switched by [`GemmaVersion`]; follows
//! HF transformers' `modeling_gemma.py`, `modeling_gemma2.py` and
//! `modeling_gemma3.py`:
//! - RMSNorm with gain `1 + w`; embeddings scaled by `√hidden` (cast to the
//!   weights' dtype, f32 here, as HF does);
//! - GeGLU MLP `down(gelu_tanh(gate(x)) · up(x))`; explicit `head_dim`;
//! - Gemma 2: queries scaled by `query_pre_attn_scalar^-1/2`, attention-logit
//!   and final-logit soft-capping, post-attention and pre/post-feedforward
//!   norms, sliding-window attention on alternate layers;
//! - Gemma 3: per-head q/k RMSNorm, sliding-window layers with their own
//!   (local) RoPE base, `layer_types` or a 5-local-1-global pattern.

use burn::tensor::{Tensor, backend::Backend, module::embedding};
use serde_json::Value;

use crate::config::{
    check_dims, gguf_f64_opt, gguf_rope_scaling, gguf_str, gguf_usize, gguf_usize_opt,
    gguf_vocab_size, hf_rope, json_f64_opt, json_usize, json_usize_opt, rope_scaling,
};
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::layers::activation::{gelu, gelu_tanh, soft_cap};
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Projection, RmsNorm, Rope,
    RopeScaling, RopeStyle, Site,
};
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

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
            tie_word_embeddings: crate::config::json_bool_opt(doc, "tie_word_embeddings")?
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

/// The GeGLU MLP.
#[derive(Debug, Clone)]
struct Mlp<B: Backend> {
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
}

/// One decoder block; the extra norms exist from Gemma 2 on.
#[derive(Debug, Clone)]
struct Block<B: Backend> {
    input_layernorm: RmsNorm<B>,
    attn: Attention<B>,
    post_attention_layernorm: RmsNorm<B>,
    pre_feedforward_layernorm: Option<RmsNorm<B>>,
    post_feedforward_layernorm: Option<RmsNorm<B>>,
    mlp: Mlp<B>,
    sliding: bool,
}

/// A Gemma model on backend `B`.
#[derive(Debug, Clone)]
pub struct Gemma<B: Backend> {
    /// Its configuration.
    pub config: GemmaConfig,
    embed_tokens: Tensor<B, 2>,
    layers: Vec<Block<B>>,
    norm: RmsNorm<B>,
    lm_head: Linear<B>,
    rope_global: Rope,
    rope_local: Rope,
    device: B::Device,
}

impl<B: Backend> Gemma<B> {
    /// Builds the model from `weights` (HF names), checking every tensor's
    /// shape against `config`.
    pub fn load(
        config: &GemmaConfig,
        weights: &WeightSource,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let c = config;
        let (h, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let v2plus = c.version != GemmaVersion::V1;
        let norm = |name: &str, dim| weights.rms_norm::<B>(name, dim, eps, true, device);
        let embed_tokens =
            weights.tensor2::<B>("model.embed_tokens.weight", c.vocab_size, h, device)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (i, &sliding) in c.sliding_layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let lin = |name: &str, i_f, o_f| {
                weights.linear::<B>(&format!("{p}.{name}"), i_f, o_f, false, device)
            };
            let qk_norm = c.version == GemmaVersion::V3;
            let attn = Attention {
                config: AttentionConfig {
                    num_heads: c.num_attention_heads,
                    num_kv_heads: c.num_key_value_heads,
                    head_dim: hd,
                    scale: c.query_pre_attn_scalar.powf(-0.5),
                    softcap: c.attn_logit_softcapping,
                },
                q_proj: lin("self_attn.q_proj", h, c.num_attention_heads * hd)?,
                k_proj: lin("self_attn.k_proj", h, c.num_key_value_heads * hd)?,
                v_proj: lin("self_attn.v_proj", h, c.num_key_value_heads * hd)?,
                o_proj: lin("self_attn.o_proj", c.num_attention_heads * hd, h)?,
                q_norm: qk_norm
                    .then(|| norm(&format!("{p}.self_attn.q_norm.weight"), hd))
                    .transpose()?,
                k_norm: qk_norm
                    .then(|| norm(&format!("{p}.self_attn.k_norm.weight"), hd))
                    .transpose()?,
            };
            layers.push(Block {
                input_layernorm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                attn,
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                pre_feedforward_layernorm: v2plus
                    .then(|| norm(&format!("{p}.pre_feedforward_layernorm.weight"), h))
                    .transpose()?,
                post_feedforward_layernorm: v2plus
                    .then(|| norm(&format!("{p}.post_feedforward_layernorm.weight"), h))
                    .transpose()?,
                mlp: Mlp {
                    gate: lin("mlp.gate_proj", h, c.intermediate_size)?,
                    up: lin("mlp.up_proj", h, c.intermediate_size)?,
                    down: lin("mlp.down_proj", c.intermediate_size, h)?,
                },
                sliding: sliding && c.sliding_window.is_some(),
            });
        }
        let lm_head = if c.tie_word_embeddings {
            Linear::new(embed_tokens.clone(), None)
        } else {
            weights.linear("lm_head", h, c.vocab_size, false, device)?
        };
        Ok(Self {
            config: c.clone(),
            embed_tokens,
            layers,
            norm: norm("model.norm.weight", h)?,
            lm_head,
            rope_global: Rope::new(c.rope_theta, hd, c.rope_scaling, RopeStyle::RotateHalf),
            rope_local: Rope::new(
                c.rope_local_theta,
                hd,
                RopeScaling::None,
                RopeStyle::RotateHalf,
            ),
            device: device.clone(),
        })
    }
}

impl<B: Backend> Gemma<B> {
    /// The token embedding matrix, `[vocab, hidden]`.
    pub fn embed_tokens(&self) -> &Tensor<B, 2> {
        &self.embed_tokens
    }

    /// The attention block of layer `layer`.
    pub fn attention(&self, layer: usize) -> Option<&Attention<B>> {
        self.layers.get(layer).map(|b| &b.attn)
    }
}

impl<B: Backend> LanguageModel<B> for Gemma<B> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn num_layers(&self) -> usize {
        self.config.num_hidden_layers
    }

    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn forward(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let c = &self.config;
        let Step { ids, positions } = start_step(self, batch, cache)?;
        let global = (
            self.rope_global.angles::<B>(&positions, &self.device),
            cache.mask(batch.len(), None, &self.device),
        );
        let local = (
            self.rope_local.angles::<B>(&positions, &self.device),
            cache.mask(batch.len(), c.sliding_window, &self.device),
        );
        // HF: embeddings · √hidden, the scale cast to the weights' dtype (f32).
        let scale = (c.hidden_size as f64).sqrt() as f32;
        let mut x = embedding(self.embed_tokens.clone(), ids) * scale;
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let (angles, mask) = if block.sliding { &local } else { &global };
            let a = block.attn.forward(
                block.input_layernorm.forward(x.clone()),
                i,
                angles,
                mask,
                cache,
                delta,
            );
            // Gemma 2/3: norm the attention output, then pre-norm the MLP input;
            // Gemma 1: the post-attention norm is the MLP's pre-norm.
            let n = if let Some(pre) = &block.pre_feedforward_layernorm {
                x = x + block.post_attention_layernorm.forward(a);
                pre.forward(x.clone())
            } else {
                x = x + a;
                block.post_attention_layernorm.forward(x.clone())
            };
            let act = if c.gelu_tanh { gelu_tanh } else { gelu };
            let gate = act(block
                .mlp
                .gate
                .forward(n.clone(), site(Projection::Gate), delta));
            let up = block.mlp.up.forward(n, site(Projection::Up), delta);
            let m = block
                .mlp
                .down
                .forward(gate * up, site(Projection::Down), delta);
            x = x + match &block.post_feedforward_layernorm {
                Some(post) => post.forward(m),
                None => m,
            };
        }
        let logits = self.lm_head.forward_base(self.norm.forward(x));
        Ok(match c.final_logit_softcapping {
            Some(cap) => soft_cap(logits, cap),
            None => logits,
        })
    }
}
