//! Llama (Touvron et al. 2023) and its descendants (SmolLM2, ...): pre-norm
//! decoder blocks with RMSNorm, rotary embeddings, grouped-query attention
//! and a SwiGLU MLP. Follows HF transformers' `modeling_llama.py`.

use burn::tensor::{Tensor, backend::Backend};

use crate::error::ModelError;
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Projection, RmsNorm, Rope, Site,
};
use crate::ops::{BlockOps, GateActivation};
use crate::plan::ExecutionPlan;
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

mod config;

pub use config::LlamaConfig;

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
    plan: ExecutionPlan,
    device: B::Device,
}

impl<B: Backend> Llama<B> {
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
        let (h, hd) = (c.hidden_size, c.head_dim);
        let eps = c.rms_norm_eps;
        let embed_tokens =
            weights.tensor2::<B>("model.embed_tokens.weight", c.vocab_size, h, device)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let lin = |name: &str, i_f, o_f, bias| {
                weights.linear::<B>(
                    &format!("{p}.{name}"),
                    (i_f, o_f),
                    bias,
                    plan.products,
                    device,
                )
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
            norm: weights.rms_norm("model.norm.weight", h, eps, false, device)?,
            lm_head,
            rope: Rope::new(c.rope_theta, hd, c.rope_scaling, c.rope_style),
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

impl<B: Backend> Llama<B> {
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

    /// The norms and projections of decoder block `layer`, for code that
    /// computes the same forward outside burn (a host trainer's forward and
    /// backward pass).
    pub fn block_parts(&self, layer: usize) -> Option<LlamaBlockParts<'_, B>> {
        self.layers.get(layer).map(|b| LlamaBlockParts {
            input_layernorm: &b.input_layernorm,
            q_proj: &b.attn.q_proj,
            k_proj: &b.attn.k_proj,
            v_proj: &b.attn.v_proj,
            o_proj: &b.attn.o_proj,
            post_attention_layernorm: &b.post_attention_layernorm,
            gate_proj: &b.mlp.gate,
            up_proj: &b.mlp.up,
            down_proj: &b.mlp.down,
        })
    }

    /// The norm after the last block.
    pub fn final_norm(&self) -> &RmsNorm<B> {
        &self.norm
    }

    /// The output head (the embedding matrix, transposed, when tied).
    pub fn lm_head(&self) -> &Linear<B> {
        &self.lm_head
    }
}

/// One decoder block's parameters, borrowed ([`Llama::block_parts`]); the
/// fields carry HF transformers' names.
#[derive(Debug, Clone)]
pub struct LlamaBlockParts<'a, B: Backend> {
    /// The norm before attention.
    pub input_layernorm: &'a RmsNorm<B>,
    /// Query projection.
    pub q_proj: &'a Linear<B>,
    /// Key projection.
    pub k_proj: &'a Linear<B>,
    /// Value projection.
    pub v_proj: &'a Linear<B>,
    /// Attention output projection.
    pub o_proj: &'a Linear<B>,
    /// The norm before the MLP.
    pub post_attention_layernorm: &'a RmsNorm<B>,
    /// MLP gate projection (its SiLU multiplies `up_proj`'s output).
    pub gate_proj: &'a Linear<B>,
    /// MLP up projection.
    pub up_proj: &'a Linear<B>,
    /// MLP down projection.
    pub down_proj: &'a Linear<B>,
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
        self.plan.run(|| self.lm_head.forward_base(hidden))
    }
}

impl<B: Backend> Llama<B> {
    /// The decoder blocks and the final norm, in the block operations `ops`.
    fn blocks<O: BlockOps<B>>(
        &self,
        mut ops: O,
        Step { ids, positions }: Step<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let new_tokens = positions.first().map_or(0, Vec::len);
        let angles = self.rope.angles::<B>(&positions, &self.device);
        let mask = cache.step_mask(new_tokens, None, &self.device);
        let mut x = ops.embed(&self.embed_tokens, ids, None)?;
        let first = self.layers.first();
        let mut n = ops.norm(first.map_or(&self.norm, |b| &b.input_layernorm), &x);
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let (attn, mlp) = (&block.attn, &block.mlp);
            let qkv = ops.project(
                &n,
                [
                    (&attn.q_proj, site(Projection::Q)),
                    (&attn.k_proj, site(Projection::K)),
                    (&attn.v_proj, site(Projection::V)),
                ],
            );
            let heads = ops.attend(attn, i, qkv, &angles, &mask, cache);
            let [o] = ops.project(&heads, [(&attn.o_proj, site(Projection::O))]);
            (x, n) = ops.residual(x, o, None, &block.post_attention_layernorm);
            let [gate, up] = ops.project(
                &n,
                [
                    (&mlp.gate, site(Projection::Gate)),
                    (&mlp.up, site(Projection::Up)),
                ],
            );
            let act = ops.gated(GateActivation::Silu, gate, up);
            let [down] = ops.project(&act, [(&mlp.down, site(Projection::Down))]);
            // The residual add, then the next block's input norm (the final
            // norm after the last block).
            let next = self.layers.get(i + 1);
            (x, n) = ops.residual(
                x,
                down,
                None,
                next.map_or(&self.norm, |b| &b.input_layernorm),
            );
        }
        drop(x);
        ops.finish(n)
    }
}
