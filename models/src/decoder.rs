//! The one pre-norm decoder Llama, Gemma and GPT-2 share: a norm,
//! multi-head attention over the KV cache and an MLP per block, written once
//! over the block operations ([`crate::ops::BlockOps`]). What Gemma changes
//! is stated by a value, [`DecoderVariant`], as candle's and llama-burn's
//! configurations state it: an embedding scale, sandwich norms around the
//! attention and the MLP, the MLP's activation (GeGLU for SwiGLU), and
//! sliding-window layers with their own (local) RoPE; plus final-logit
//! soft-capping (Gemma 2). What GPT-2 changes is in its modules, built by
//! its loader ([`crate::gpt2`]): LayerNorm for RMSNorm ([`Norm`]), one fused
//! query/key/value projection ([`QkvProjections::Fused`]), an MLP without a
//! gate, and learned absolute positions added at embedding for RoPE. The
//! architectures' files keep what differs at load (names, norm gains, head
//! counts) and their configurations.

mod block;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

pub(crate) use block::{Block, BlockAt, BlockSites, Mlp};

use crate::backend::ModelBackend;
use crate::error::ModelError;
use crate::layers::activation::soft_cap;
use crate::layers::{
    Attention, AttentionConfig, KvCache, Linear, LinearDelta, Norm, QkvProjections, RmsNorm, Rope,
    RopeScaling, RopeStyle, Site,
};
use crate::ops::{BlockOps, Cached, MlpActivation};
use crate::plan::ExecutionPlan;
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

/// How a decoder differs from Llama's: each field's Llama value is the
/// first named (`None`, `false`, SiLU).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderVariant {
    /// Token embeddings multiplied by this (Gemma: `√hidden`, cast to f32
    /// as HF casts it to the weights' dtype).
    pub embed_scale: Option<f32>,
    /// Sandwich norms (Gemma 2/3): the attention output is normed before
    /// its residual add, the MLP input by its own `pre_feedforward_layernorm`
    /// and the MLP output by `post_feedforward_layernorm`. Without them
    /// (Llama, Gemma 1) `post_attention_layernorm` is the MLP's pre-norm.
    pub sandwich_norms: bool,
    /// The MLP's activation: of the gate, `act(gate) · up`, SiLU (SwiGLU)
    /// or GELU (GeGLU); of the up projection in an MLP without a gate
    /// (GPT-2's GELU).
    pub activation: MlpActivation,
    /// Sliding-window layers (Gemma 2/3) see at most this many positions
    /// back, rotated by [`DecoderVariant::local_rope_theta`]'s RoPE.
    pub sliding_window: Option<usize>,
    /// The RoPE base of the sliding-window layers, without scaling (Gemma
    /// 3's `rope_local_base_freq`); without it they share the global RoPE.
    pub local_rope_theta: Option<f64>,
    /// Final logits soft-capped at this (Gemma 2 `final_logit_softcapping`).
    pub final_logit_softcap: Option<f64>,
}

impl DecoderVariant {
    /// Llama's decoder.
    pub const LLAMA: Self = Self {
        embed_scale: None,
        sandwich_norms: false,
        activation: MlpActivation::Silu,
        sliding_window: None,
        local_rope_theta: None,
        final_logit_softcap: None,
    };
}

/// An architecture's configuration as the decoder loads it under HF
/// Llama's tensor names (Llama, Gemma): its shapes and how it differs from
/// Llama.
pub(crate) trait DecoderConfig: Clone {
    /// The shapes and per-layer options.
    fn shape(&self) -> DecoderShape;
    /// How the decoder differs from Llama's.
    fn variant(&self) -> DecoderVariant;
    /// `plan` with the host training step decided for backend `B`
    /// ([`ExecutionPlan::with_host_training`]); unchanged (never planned)
    /// where the architecture has no host training step.
    fn with_host_training<B: ModelBackend>(&self, plan: ExecutionPlan) -> ExecutionPlan {
        plan
    }
}

/// Builds the decoder `config` states from `weights` (HF names; see
/// [`WeightSource`]), checking every tensor's shape, with `plan`'s
/// load-time choices ([`crate::LoadOptions::plan`]); completes the plan from
/// the projections it loaded. Reached through [`crate::Model::load`].
pub(crate) fn load<B: ModelBackend, C: DecoderConfig>(
    config: &C,
    weights: &WeightSource,
    plan: ExecutionPlan,
    device: &B::Device,
) -> Result<Decoder<B, C>, ModelError> {
    let (shape, variant) = (config.shape(), config.variant());
    let plan = config.with_host_training::<B>(plan);
    Decoder::load(config.clone(), shape, variant, weights, plan, device)
}

/// The shapes and per-layer options a decoder is loaded with, from an
/// architecture's configuration.
#[derive(Debug, Clone)]
pub(crate) struct DecoderShape {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub attention: AttentionConfig,
    /// Biases on q/k/v/o (Llama `attention_bias`).
    pub attention_bias: bool,
    /// Biases on gate/up/down (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head q/k RMSNorm (Gemma 3).
    pub qk_norm: bool,
    pub rms_norm_eps: f64,
    /// Norm gains stored as `w` for `1 + w` (Gemma).
    pub norm_one_plus: bool,
    pub tie_word_embeddings: bool,
    /// Whether each layer is a sliding-window layer (one entry per layer).
    pub sliding_layers: Vec<bool>,
    /// The RoPE base of the global layers (of all, without sliding ones).
    pub rope_theta: f64,
    /// The global layers' RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// How rotated pairs are laid out.
    pub rope_style: RopeStyle,
}

/// A pre-norm decoder on backend `B` with configuration `C`
/// ([`crate::Llama`], [`crate::Gemma`], [`crate::Gpt2`]).
#[derive(Debug, Clone)]
pub struct Decoder<B: Backend, C> {
    /// Its configuration.
    pub config: C,
    variant: DecoderVariant,
    vocab_size: usize,
    embed_tokens: Tensor<B, 2>,
    /// Learned absolute positions added at embedding (GPT-2's `wpe`,
    /// `[positions, hidden]`); without them, RoPE rotates queries and keys.
    embed_positions: Option<Tensor<B, 2>>,
    layers: Vec<Block<B>>,
    norm: Norm<B>,
    lm_head: Linear<B>,
    rope: Option<Rope>,
    rope_local: Option<Rope>,
    sites: BlockSites,
    plan: ExecutionPlan,
    device: B::Device,
}

/// A decoder's modules, as an architecture's loader built them
/// ([`Decoder::assemble`]).
pub(crate) struct DecoderModules<B: Backend> {
    pub embed_tokens: Tensor<B, 2>,
    pub embed_positions: Option<Tensor<B, 2>>,
    pub layers: Vec<Block<B>>,
    pub norm: Norm<B>,
    pub lm_head: Linear<B>,
    pub rope: Option<Rope>,
    pub rope_local: Option<Rope>,
    pub sites: BlockSites,
}

impl<B: ModelBackend, C> Decoder<B, C> {
    /// Builds the decoder `shape` and `variant` describe from `weights` (HF
    /// names), checking every tensor's shape, with `plan`'s load-time
    /// choices; completes the plan from the projections it loaded.
    pub(crate) fn load(
        config: C,
        shape: DecoderShape,
        variant: DecoderVariant,
        weights: &WeightSource,
        plan: ExecutionPlan,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let s = &shape;
        let (h, hd) = (s.hidden_size, s.attention.head_dim);
        let rms = |name: &str, dim| {
            weights.rms_norm::<B>(name, dim, s.rms_norm_eps, s.norm_one_plus, device)
        };
        let norm = |name: &str, dim| rms(name, dim).map(Norm::Rms);
        let embed_tokens =
            weights.tensor2::<B>("model.embed_tokens.weight", s.vocab_size, h, device)?;
        let mut layers = Vec::with_capacity(s.sliding_layers.len());
        for (i, &sliding) in s.sliding_layers.iter().enumerate() {
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
            let (q_width, kv_width) = (s.attention.num_heads * hd, s.attention.num_kv_heads * hd);
            let qk_norm = |name: &str| {
                s.qk_norm
                    .then(|| rms(&format!("{p}.self_attn.{name}.weight"), hd))
                    .transpose()
            };
            let attn = Attention {
                config: s.attention.clone(),
                qkv: QkvProjections::Separate([
                    lin("self_attn.q_proj", h, q_width, s.attention_bias)?,
                    lin("self_attn.k_proj", h, kv_width, s.attention_bias)?,
                    lin("self_attn.v_proj", h, kv_width, s.attention_bias)?,
                ]),
                o_proj: lin("self_attn.o_proj", q_width, h, s.attention_bias)?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
            };
            let feedforward_norms = if variant.sandwich_norms {
                Some((
                    norm(&format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                    norm(&format!("{p}.post_feedforward_layernorm.weight"), h)?,
                ))
            } else {
                None
            };
            let m = s.intermediate_size;
            layers.push(Block {
                input_layernorm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                attn,
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                feedforward_norms,
                mlp: Mlp {
                    gate: Some(lin("mlp.gate_proj", h, m, s.mlp_bias)?),
                    up: lin("mlp.up_proj", h, m, s.mlp_bias)?,
                    down: lin("mlp.down_proj", m, h, s.mlp_bias)?,
                },
                sliding: sliding && variant.sliding_window.is_some(),
            });
        }
        let lm_head = if s.tie_word_embeddings {
            weights.tied_head(&embed_tokens, plan.products)?
        } else {
            weights.linear("lm_head", (h, s.vocab_size), false, plan.products, device)?
        };
        let modules = DecoderModules {
            embed_tokens,
            embed_positions: None,
            layers,
            norm: norm("model.norm.weight", h)?,
            lm_head,
            rope: Some(Rope::new(s.rope_theta, hd, s.rope_scaling, s.rope_style)),
            rope_local: variant
                .local_rope_theta
                .map(|theta| Rope::new(theta, hd, RopeScaling::None, s.rope_style)),
            sites: BlockSites::LLAMA,
        };
        Ok(Self::assemble(
            config,
            variant,
            s.vocab_size,
            modules,
            plan,
            device,
        ))
    }

    /// The decoder of `modules` (as an architecture's loader built them);
    /// completes `plan` from their projections.
    pub(crate) fn assemble(
        config: C,
        variant: DecoderVariant,
        vocab_size: usize,
        modules: DecoderModules<B>,
        plan: ExecutionPlan,
        device: &B::Device,
    ) -> Self {
        let m = modules;
        let plan = plan.with_projections(
            m.layers
                .iter()
                .flat_map(|b| b.projections(m.sites))
                .map(|(p, _)| p.projection_kernel()),
        );
        Self {
            config,
            variant,
            vocab_size,
            embed_tokens: m.embed_tokens,
            embed_positions: m.embed_positions,
            layers: m.layers,
            norm: m.norm,
            lm_head: m.lm_head,
            rope: m.rope,
            rope_local: m.rope_local,
            sites: m.sites,
            plan,
            device: device.clone(),
        }
    }

    /// Which implementations run the forward pass.
    pub fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

    /// How this decoder differs from Llama's.
    pub fn variant(&self) -> &DecoderVariant {
        &self.variant
    }

    /// The token embedding matrix, `[vocab, hidden]`.
    pub fn embed_tokens(&self) -> &Tensor<B, 2> {
        &self.embed_tokens
    }

    /// The learned absolute positions added at embedding (GPT-2's `wpe`),
    /// `[positions, hidden]`, if the decoder has them.
    pub fn embed_positions(&self) -> Option<&Tensor<B, 2>> {
        self.embed_positions.as_ref()
    }

    /// The attention block of layer `layer`.
    pub fn attention(&self, layer: usize) -> Option<&Attention<B>> {
        self.layers.get(layer).map(|b| &b.attn)
    }

    /// The norm after the last block.
    pub fn final_norm(&self) -> &Norm<B> {
        &self.norm
    }

    /// The projection at `site` (weights `[in, out]`), if the model has it.
    pub fn projection(&self, site: Site) -> Option<&Linear<B>> {
        self.layers
            .get(site.layer)?
            .projection(site.module, self.sites)
    }

    /// The output head (the embedding matrix, transposed, when tied).
    pub fn lm_head(&self) -> &Linear<B> {
        &self.lm_head
    }

    /// The norm before block `layer`: its input norm, the final norm past
    /// the last block.
    pub fn input_norm(&self, layer: usize) -> &Norm<B> {
        self.layers
            .get(layer)
            .map_or(&self.norm, |b| &b.input_layernorm)
    }

    /// Block `layer`'s forward in the block operations `ops`, the sequence
    /// every forward of this decoder runs (inference's
    /// [`LanguageModel::forward_hidden`] through either implementation of
    /// [`BlockOps`], and a host training step's): from the block's input `x`
    /// and its normed input `n` (`norm(x)` by [`Decoder::input_norm`]) to
    /// its output and that output normed by the next block's input norm
    /// (the final norm after the last block); attention over `context`.
    ///
    /// # Panics
    /// Where `layer` is past the last block.
    pub fn block_forward<O: BlockOps<B>>(
        &self,
        ops: &mut O,
        layer: usize,
        x: O::Rows,
        n: O::Rows,
        context: O::Context<'_>,
    ) -> (O::Rows, O::Rows) {
        let at = BlockAt {
            layer,
            sites: self.sites,
            activation: self.variant.activation,
            next_norm: self.input_norm(layer + 1),
        };
        self.layers[layer].forward(ops, at, x, n, context)
    }

    /// The norms and projections of decoder block `layer`, for code that
    /// computes the same forward outside burn (a host trainer's forward and
    /// backward pass); the fields carry HF transformers' names. `None` past
    /// the last layer, and for blocks [`DecoderBlockParts`] does not hold:
    /// sandwich norms, LayerNorms, a fused query/key/value projection, an
    /// MLP without a gate.
    pub fn block_parts(&self, layer: usize) -> Option<DecoderBlockParts<'_, B>> {
        if self.variant.sandwich_norms {
            return None;
        }
        let b = self.layers.get(layer)?;
        let [q_proj, k_proj, v_proj] = b.attn.separate_qkv()?;
        Some(DecoderBlockParts {
            input_layernorm: b.input_layernorm.as_rms()?,
            q_proj,
            k_proj,
            v_proj,
            o_proj: &b.attn.o_proj,
            post_attention_layernorm: b.post_attention_layernorm.as_rms()?,
            gate_proj: b.mlp.gate.as_ref()?,
            up_proj: &b.mlp.up,
            down_proj: &b.mlp.down,
        })
    }
}

/// One decoder block's parameters, borrowed ([`Decoder::block_parts`]); the
/// fields carry HF transformers' names.
#[derive(Debug, Clone)]
pub struct DecoderBlockParts<'a, B: Backend> {
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
    /// MLP gate projection (its activation multiplies `up_proj`'s output).
    pub gate_proj: &'a Linear<B>,
    /// MLP up projection.
    pub up_proj: &'a Linear<B>,
    /// MLP down projection.
    pub down_proj: &'a Linear<B>,
}

impl<B: ModelBackend, C: Sync> LanguageModel<B> for Decoder<B, C> {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
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
            self.check_positions(batch, cache)?;
            let step = start_step(self, batch, cache)?;
            let positions = self
                .embed_positions
                .as_ref()
                .map(|table| (table, position_ids(batch, &step.positions, &self.device)));
            crate::ops::dispatch!(self.plan, batch, delta, &self.device, |ops| self
                .blocks(ops, step, positions, cache))
        })
    }

    fn head_host(&self, hidden: &[f32], rows: usize) -> Option<Vec<f32>> {
        if self.variant.final_logit_softcap.is_some() {
            return None;
        }
        self.plan
            .run(|| self.lm_head.forward_base_host(hidden, rows))
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.plan.run(|| {
            let logits = self.lm_head.forward_base(hidden);
            match self.variant.final_logit_softcap {
                Some(cap) => soft_cap(logits, cap),
                None => logits,
            }
        })
    }
}

impl<B: ModelBackend, C> Decoder<B, C> {
    /// Rejects a step that would take some row past the learned positions
    /// (before the cache is touched).
    fn check_positions(&self, batch: &Batch, cache: &KvCache<B>) -> Result<(), ModelError> {
        let Some(table) = &self.embed_positions else {
            return Ok(());
        };
        let max = table.dims()[0];
        for row in 0..batch.rows() {
            let before = cache.real_tokens(row).unwrap_or(0);
            let new = (0..batch.len()).filter(|&i| batch.is_real(row, i)).count();
            if before + new > max {
                return Err(ModelError::bad_input(format!(
                    "row {row}: {} tokens exceed the model's {max} learned positions",
                    before + new
                )));
            }
        }
        Ok(())
    }

    /// The decoder blocks and the final norm, in the block operations `ops`;
    /// `positions`: the learned position table and each token's row of it.
    fn blocks<O: for<'c> BlockOps<B, Context<'c> = Cached<'c, B>>>(
        &self,
        mut ops: O,
        Step { ids, positions }: Step<B>,
        learned: Option<(&Tensor<B, 2>, Tensor<B, 2, Int>)>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let v = &self.variant;
        let new_tokens = positions.first().map_or(0, Vec::len);
        let global = (
            self.rope
                .as_ref()
                .map(|rope| rope.angles::<B>(&positions, &self.device)),
            cache.step_mask(new_tokens, None, &self.device),
        );
        // The sliding-window layers' rotation and mask, where there are any.
        let local = self.layers.iter().any(|b| b.sliding).then(|| {
            let rope = self.rope_local.as_ref().or(self.rope.as_ref());
            (
                rope.map(|rope| rope.angles::<B>(&positions, &self.device)),
                cache.step_mask(new_tokens, v.sliding_window, &self.device),
            )
        });
        let mut x = ops.embed(&self.embed_tokens, ids, v.embed_scale, learned)?;
        let mut n = ops.norm(self.input_norm(0), &x);
        for (i, block) in self.layers.iter().enumerate() {
            let (angles, mask) = match &local {
                Some(local) if block.sliding => local,
                _ => &global,
            };
            let context = Cached {
                angles: angles.as_ref(),
                mask,
                cache: &mut *cache,
            };
            (x, n) = self.block_forward(&mut ops, i, x, n, context);
        }
        drop(x);
        ops.finish(n)
    }
}

/// Each token's row of a learned position table, `[rows, new tokens]`: its
/// position in its row (real tokens numbered from 0, as the cache numbers
/// them). A padding token's output is never read and its key is masked: it
/// looks up position 0, so that no padding can index past the table.
fn position_ids<B: ModelBackend>(
    batch: &Batch,
    positions: &[Vec<usize>],
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = positions
        .iter()
        .enumerate()
        .flat_map(|(r, row)| {
            row.iter()
                .enumerate()
                .map(move |(i, &p)| if batch.is_real(r, i) { p as i64 } else { 0 })
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [batch.rows(), batch.len()]), device)
}
