//! GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask
//! Learners"); follows HF transformers' `modeling_gpt2.py`:
//! - learned absolute positions (`wpe`) added to the token embedding (`wte`);
//! - pre-norm blocks with LayerNorm (`ln_1`, `ln_2`) and a final `ln_f`;
//! - multi-head attention through one fused `c_attn` projection (queries,
//!   keys, values in that order), scores scaled by `head_dim^-1/2`;
//! - MLP `c_proj(gelu_tanh(c_fc(x)))`;
//! - the output head tied to `wte`.
//!
//! HF stores GPT-2's projections as `Conv1D` with weights `[in, out]` (the
//! transpose of `nn.Linear`); they are transposed to `[out, in]` once at load
//! ([`WeightSource::conv1d`]), so that their products take the same kernels
//! as every other projection. llama.cpp's converter stores them `[out, in]`,
//! which [`WeightSource`] first returns in HF's shape, so both formats build
//! the same modules.
//!
//! The forward is the shared [`crate::decoder`]: its blocks are built here
//! from LayerNorms ([`Norm::Layer`]), the fused projection
//! ([`QkvProjections::Fused`], split by the block operations) and an MLP
//! without a gate, with the learned positions added at embedding.
//! Positions come from the KV cache: each row's real tokens are numbered
//! from 0, padding takes no position, so a padded row sees exactly the
//! positions it would see alone.

mod config;

pub use config::{Gpt2Activation, Gpt2Config};

use burn::tensor::Tensor;

use crate::backend::ModelBackend;
use crate::decoder::{Block, BlockSites, Decoder, DecoderModules, DecoderVariant, Mlp};
use crate::error::ModelError;
use crate::layers::{Attention, AttentionConfig, LayerNorm, Linear, Norm, QkvProjections};
use crate::ops::MlpActivation;
use crate::plan::ExecutionPlan;
use crate::weights::WeightSource;

/// A GPT-2 model on backend `B`: the shared decoder with GPT-2's
/// configuration and modules.
pub type Gpt2<B> = Decoder<B, Gpt2Config>;

impl Gpt2Config {
    /// How GPT-2's decoder differs from Llama's, beyond its modules: the
    /// MLP's activation.
    pub fn variant(&self) -> DecoderVariant {
        DecoderVariant {
            activation: match self.activation {
                Gpt2Activation::GeluTanh => MlpActivation::GeluTanh,
                Gpt2Activation::Gelu => MlpActivation::Gelu,
            },
            ..DecoderVariant::LLAMA
        }
    }
}

impl<B: ModelBackend> Decoder<B, Gpt2Config> {
    /// Builds the model from `weights`, checking every tensor's shape against
    /// `config`, with `plan`'s load-time choices ([`crate::LoadOptions::plan`]);
    /// completes the plan from the projections it loaded. HF names are
    /// `transformer.h.N.attn.c_attn.weight`, ...; the prefix-less names of the
    /// original OpenAI checkpoints (`h.N...`, `wte.weight`) are accepted too.
    /// Reached through [`crate::Model::load`].
    pub(crate) fn load_gpt2(
        config: &Gpt2Config,
        weights: &WeightSource,
        plan: ExecutionPlan,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let c = config;
        let (h, inner) = (c.n_embd, c.n_inner);
        let root = if !weights.contains("transformer.wte.weight") && weights.contains("wte.weight")
        {
            ""
        } else {
            "transformer."
        };
        let norm = |prefix: &str| -> Result<Norm<B>, ModelError> {
            Ok(Norm::Layer(LayerNorm::new(
                weights.tensor1::<B>(&format!("{root}{prefix}.weight"), h, device)?,
                weights.tensor1::<B>(&format!("{root}{prefix}.bias"), h, device)?,
                c.layer_norm_epsilon,
            )))
        };
        // A `Conv1D`, transposed to `[out, in]` at load.
        let conv1d = |prefix: &str, i_f: usize, o_f: usize| {
            weights.conv1d::<B>(
                &format!("{root}{prefix}"),
                (i_f, o_f),
                plan.products,
                device,
            )
        };
        let wte = weights.tensor2::<B>(&format!("{root}wte.weight"), c.vocab_size, h, device)?;
        let wpe = weights.tensor2::<B>(&format!("{root}wpe.weight"), c.n_positions, h, device)?;
        let hd = c.head_dim();
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            layers.push(Block {
                input_layernorm: norm(&format!("h.{i}.ln_1"))?,
                attn: Attention {
                    config: AttentionConfig {
                        num_heads: c.n_head,
                        num_kv_heads: c.n_head,
                        head_dim: hd,
                        scale: (hd as f64).powf(-0.5),
                        softcap: None,
                    },
                    qkv: QkvProjections::Fused(conv1d(&format!("h.{i}.attn.c_attn"), h, 3 * h)?),
                    o_proj: conv1d(&format!("h.{i}.attn.c_proj"), h, h)?,
                    q_norm: None,
                    k_norm: None,
                },
                post_attention_layernorm: norm(&format!("h.{i}.ln_2"))?,
                feedforward_norms: None,
                mlp: Mlp {
                    gate: None,
                    up: conv1d(&format!("h.{i}.mlp.c_fc"), h, inner)?,
                    down: conv1d(&format!("h.{i}.mlp.c_proj"), inner, h)?,
                },
                sliding: false,
            });
        }
        let lm_head = if c.tie_word_embeddings {
            Linear::new(wte.clone(), None)
        } else {
            weights.linear("lm_head", (h, c.vocab_size), false, plan.products, device)?
        }
        .with_product_plan(plan.products);
        let modules = DecoderModules {
            embed_tokens: wte,
            embed_positions: Some(wpe),
            layers,
            norm: norm("ln_f")?,
            lm_head,
            rope: None,
            rope_local: None,
            sites: BlockSites::GPT2,
        };
        Ok(Self::assemble(
            c.clone(),
            c.variant(),
            c.vocab_size,
            modules,
            plan,
            device,
        ))
    }

    /// The token embedding matrix, `[vocab, n_embd]`.
    pub fn wte(&self) -> &Tensor<B, 2> {
        self.embed_tokens()
    }

    /// The position embedding matrix, `[n_positions, n_embd]` (GPT-2's loader always
    /// gives its decoder one; `None` only for a decoder built without learned positions).
    pub fn wpe(&self) -> Option<&Tensor<B, 2>> {
        self.embed_positions()
    }
}
