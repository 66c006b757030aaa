//! Llama (Touvron et al. 2023) and its descendants (SmolLM2, ...): pre-norm
//! decoder blocks with RMSNorm, rotary embeddings, grouped-query attention
//! and a SwiGLU MLP. Follows HF transformers' `modeling_llama.py`.

use burn::tensor::{Tensor, backend::Backend, module::embedding};
use serde_json::Value;

use crate::config::{
    check_dims, gguf_f64_opt, gguf_rope_scaling, gguf_usize, gguf_usize_opt, gguf_vocab_size,
    hf_rope, json_bool_opt, json_f64_opt, json_usize, json_usize_opt,
};
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::layers::activation::silu;
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Projection, RmsNorm, Rope,
    RopeScaling, RopeStyle, Site,
};
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

#[cfg(feature = "flex")]
mod host_step;

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
    /// ([`WeightSource::keep_gguf_qk_permutation`]).
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

/// The SwiGLU MLP: `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
struct Mlp<B: Backend> {
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
}

/// One pre-norm decoder block.
#[derive(Debug, Clone)]
struct Block<B: Backend> {
    input_layernorm: RmsNorm<B>,
    attn: Attention<B>,
    post_attention_layernorm: RmsNorm<B>,
    mlp: Mlp<B>,
}

/// A Llama model on backend `B`.
#[derive(Debug, Clone)]
pub struct Llama<B: Backend> {
    /// Its configuration.
    pub config: LlamaConfig,
    embed_tokens: Tensor<B, 2>,
    layers: Vec<Block<B>>,
    norm: RmsNorm<B>,
    lm_head: Linear<B>,
    rope: Rope,
    device: B::Device,
}

impl<B: Backend> Llama<B> {
    /// Builds the model from `weights` (HF names; see [`WeightSource`]),
    /// checking every tensor's shape against `config`.
    pub fn load(
        config: &LlamaConfig,
        weights: &WeightSource,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let c = config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let eps = c.rms_norm_eps;
        let embed_tokens =
            weights.tensor2::<B>("model.embed_tokens.weight", c.vocab_size, h, device)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let lin = |name: &str, i_f, o_f, bias| {
                weights.linear::<B>(&format!("{p}.{name}"), i_f, o_f, bias, device)
            };
            let attn = Attention {
                config: AttentionConfig {
                    num_heads: c.num_attention_heads,
                    num_kv_heads: c.num_key_value_heads,
                    head_dim: hd,
                    scale: (hd as f64).powf(-0.5),
                    softcap: None,
                },
                q_proj: lin(
                    "self_attn.q_proj",
                    h,
                    c.num_attention_heads * hd,
                    c.attention_bias,
                )?,
                k_proj: lin(
                    "self_attn.k_proj",
                    h,
                    c.num_key_value_heads * hd,
                    c.attention_bias,
                )?,
                v_proj: lin(
                    "self_attn.v_proj",
                    h,
                    c.num_key_value_heads * hd,
                    c.attention_bias,
                )?,
                o_proj: lin(
                    "self_attn.o_proj",
                    c.num_attention_heads * hd,
                    h,
                    c.attention_bias,
                )?,
                q_norm: None,
                k_norm: None,
            };
            let mlp = Mlp {
                gate: lin("mlp.gate_proj", h, c.intermediate_size, c.mlp_bias)?,
                up: lin("mlp.up_proj", h, c.intermediate_size, c.mlp_bias)?,
                down: lin("mlp.down_proj", c.intermediate_size, h, c.mlp_bias)?,
            };
            layers.push(Block {
                input_layernorm: weights.rms_norm(
                    &format!("{p}.input_layernorm.weight"),
                    h,
                    eps,
                    false,
                    device,
                )?,
                attn,
                post_attention_layernorm: weights.rms_norm(
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                    eps,
                    false,
                    device,
                )?,
                mlp,
            });
        }
        let lm_head = if c.tie_word_embeddings {
            weights.tied_head(&embed_tokens)?
        } else {
            weights.linear("lm_head", h, c.vocab_size, false, device)?
        };
        Ok(Self {
            config: c.clone(),
            embed_tokens,
            layers,
            norm: weights.rms_norm("model.norm.weight", h, eps, false, device)?,
            lm_head,
            rope: Rope::new(c.rope_theta, hd, c.rope_scaling, c.rope_style),
            device: device.clone(),
        })
    }
}

impl<B: Backend> Llama<B> {
    /// The token embedding matrix, `[vocab, hidden]`.
    pub fn embed_tokens(&self) -> &Tensor<B, 2> {
        &self.embed_tokens
    }

    /// The attention block of layer `layer`.
    pub fn attention(&self, layer: usize) -> Option<&Attention<B>> {
        self.layers.get(layer).map(|b| &b.attn)
    }
}

impl<B: Backend> LanguageModel<B> for Llama<B> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn num_layers(&self) -> usize {
        self.config.num_hidden_layers
    }

    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn forward_hidden(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        #[cfg(feature = "flex")]
        if let Some(hidden) = self.forward_hidden_host(batch, cache, delta) {
            return hidden;
        }
        let Step { ids, positions } = start_step(self, batch, cache)?;
        let angles = self.rope.angles::<B>(&positions, &self.device);
        let mask = cache.step_mask(batch.len(), None, &self.device);
        let mut x = embedding(self.embed_tokens.clone(), ids);
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let a = block.attn.forward(
                block.input_layernorm.forward(x.clone()),
                i,
                &angles,
                &mask,
                cache,
                delta,
            );
            x = x + a;
            let n = block.post_attention_layernorm.forward(x.clone());
            let [gate, up] = Linear::forward_shared(
                [
                    (&block.mlp.gate, site(Projection::Gate)),
                    (&block.mlp.up, site(Projection::Up)),
                ],
                n,
                delta,
            );
            let gate = silu(gate);
            x = x + block
                .mlp
                .down
                .forward(gate * up, site(Projection::Down), delta);
        }
        Ok(self.norm.forward(x))
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.lm_head.forward_base(hidden)
    }
}
