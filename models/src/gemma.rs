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

use burn::tensor::{Tensor, backend::Backend};

use crate::error::ModelError;
use crate::layers::activation::soft_cap;
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Projection, RmsNorm, Rope,
    RopeScaling, RopeStyle, Site,
};
use crate::ops::{BlockOps, GateActivation};
use crate::plan::ExecutionPlan;
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
    plan: ExecutionPlan,
    device: B::Device,
}

impl<B: Backend> Gemma<B> {
    /// Builds the model from `weights` (HF names), checking every tensor's
    /// shape against `config`, with `plan`'s load-time choices
    /// ([`crate::LoadOptions::plan`]); completes the plan from the
    /// projections it loaded. Reached through [`crate::Model::load`].
    pub(crate) fn from_plan(
        config: &GemmaConfig,
        weights: &WeightSource,
        plan: ExecutionPlan,
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
                weights.linear::<B>(
                    &format!("{p}.{name}"),
                    (i_f, o_f),
                    false,
                    plan.products,
                    device,
                )
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
            weights.tied_head(&embed_tokens, plan.products)?
        } else {
            weights.linear("lm_head", (h, c.vocab_size), false, plan.products, device)?
        };
        let plan = plan.with_projections(
            layers
                .iter()
                .flat_map(Block::projections)
                .map(Linear::projection_kernel),
            None,
        );
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
            plan,
            device: device.clone(),
        })
    }
}

impl<B: Backend> Block<B> {
    /// The block's seven projections.
    fn projections(&self) -> [&Linear<B>; 7] {
        let (a, m) = (&self.attn, &self.mlp);
        [
            &a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &m.gate, &m.up, &m.down,
        ]
    }
}

impl<B: Backend> Gemma<B> {
    /// Which implementations run the forward pass.
    pub fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

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

    fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

    fn forward_hidden(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        self.plan.run(|| {
            let step = start_step(self, batch, cache)?;
            crate::ops::dispatch!(self.plan, batch, delta, &self.device, |ops| self
                .blocks(ops, step, cache))
        })
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.plan.run(|| {
            let logits = self.lm_head.forward_base(hidden);
            match self.config.final_logit_softcapping {
                Some(cap) => soft_cap(logits, cap),
                None => logits,
            }
        })
    }
}

impl<B: Backend> Gemma<B> {
    /// The decoder blocks and the final norm, in the block operations `ops`.
    fn blocks<O: BlockOps<B>>(
        &self,
        mut ops: O,
        Step { ids, positions }: Step<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let c = &self.config;
        let new_tokens = positions.first().map_or(0, Vec::len);
        let global = (
            self.rope_global.angles::<B>(&positions, &self.device),
            cache.step_mask(new_tokens, None, &self.device),
        );
        let local = (
            self.rope_local.angles::<B>(&positions, &self.device),
            cache.step_mask(new_tokens, c.sliding_window, &self.device),
        );
        let act = if c.gelu_tanh {
            GateActivation::GeluTanh
        } else {
            GateActivation::Gelu
        };
        // HF: embeddings · √hidden, the scale cast to the weights' dtype (f32).
        let scale = (c.hidden_size as f64).sqrt() as f32;
        let mut x = ops.embed(&self.embed_tokens, ids, Some(scale))?;
        let first = self.layers.first();
        let mut n = ops.norm(first.map_or(&self.norm, |b| &b.input_layernorm), &x);
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let (attn, mlp) = (&block.attn, &block.mlp);
            let (angles, mask) = if block.sliding { &local } else { &global };
            let qkv = ops.project(
                &n,
                [
                    (&attn.q_proj, site(Projection::Q)),
                    (&attn.k_proj, site(Projection::K)),
                    (&attn.v_proj, site(Projection::V)),
                ],
            );
            let heads = ops.attend(attn, i, qkv, angles, mask, cache);
            let [o] = ops.project(&heads, [(&attn.o_proj, site(Projection::O))]);
            // Gemma 2/3: norm the attention output, then pre-norm the MLP
            // input; Gemma 1: the post-attention norm is the MLP's pre-norm.
            (x, n) = match &block.pre_feedforward_layernorm {
                Some(pre) => ops.residual(x, o, Some(&block.post_attention_layernorm), pre),
                None => ops.residual(x, o, None, &block.post_attention_layernorm),
            };
            let [gate, up] = ops.project(
                &n,
                [
                    (&mlp.gate, site(Projection::Gate)),
                    (&mlp.up, site(Projection::Up)),
                ],
            );
            let hidden = ops.gated(act, gate, up);
            let [down] = ops.project(&hidden, [(&mlp.down, site(Projection::Down))]);
            // The residual add (Gemma 2/3: of the normed MLP output), then
            // the next block's input norm (the final norm after the last).
            let next = self.layers.get(i + 1);
            (x, n) = ops.residual(
                x,
                down,
                block.post_feedforward_layernorm.as_ref(),
                next.map_or(&self.norm, |b| &b.input_layernorm),
            );
        }
        drop(x);
        ops.finish(n)
    }
}
