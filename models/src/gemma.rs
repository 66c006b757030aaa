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

mod config;

pub use config::{GemmaConfig, GemmaVersion};

use burn::tensor::{Tensor, backend::Backend, module::embedding};

use crate::error::ModelError;
use crate::layers::activation::{gelu, gelu_tanh, soft_cap};
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Projection, RmsNorm, Rope,
    RopeScaling, RopeStyle, Site,
};
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

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
            weights.tied_head(&embed_tokens)?
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

    fn forward_hidden(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let c = &self.config;
        let Step { ids, positions } = start_step(self, batch, cache)?;
        let global = (
            self.rope_global.angles::<B>(&positions, &self.device),
            cache.step_mask(batch.len(), None, &self.device),
        );
        let local = (
            self.rope_local.angles::<B>(&positions, &self.device),
            cache.step_mask(batch.len(), c.sliding_window, &self.device),
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
            let [gate, up] = Linear::forward_shared(
                [
                    (&block.mlp.gate, site(Projection::Gate)),
                    (&block.mlp.up, site(Projection::Up)),
                ],
                n,
                delta,
            );
            let gate = act(gate);
            let m = block
                .mlp
                .down
                .forward(gate * up, site(Projection::Down), delta);
            x = x + match &block.post_feedforward_layernorm {
                Some(post) => post.forward(m),
                None => m,
            };
        }
        Ok(self.norm.forward(x))
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let logits = self.lm_head.forward_base(hidden);
        match self.config.final_logit_softcapping {
            Some(cap) => soft_cap(logits, cap),
            None => logits,
        }
    }
}
