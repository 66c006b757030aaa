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
//! Positions come from the [`KvCache`]: each row's real tokens are numbered
//! from 0, padding takes no position, so a padded row sees exactly the
//! positions it would see alone.

mod config;

pub use config::{Gpt2Activation, Gpt2Config};

use burn::tensor::{Int, Tensor, TensorData, backend::Backend, module::embedding};

use crate::error::ModelError;
use crate::layers::activation::{gelu, gelu_tanh};
use crate::layers::{KvCache, LayerNorm, Linear, LinearDelta, Projection, Scoring, Site, StepMask};
use crate::plan::ExecutionPlan;
use crate::runtime::{Batch, LanguageModel, Step, start_step};
use crate::weights::WeightSource;

/// Fused-projection multi-head self-attention.
#[derive(Debug, Clone)]
struct SelfAttention<B: Backend> {
    c_attn: Linear<B>,
    c_proj: Linear<B>,
}

/// The MLP.
#[derive(Debug, Clone)]
struct Mlp<B: Backend> {
    c_fc: Linear<B>,
    c_proj: Linear<B>,
}

/// One pre-norm block.
#[derive(Debug, Clone)]
struct Block<B: Backend> {
    ln_1: LayerNorm<B>,
    attn: SelfAttention<B>,
    ln_2: LayerNorm<B>,
    mlp: Mlp<B>,
}

/// A GPT-2 model on backend `B`.
#[derive(Debug, Clone)]
pub struct Gpt2<B: Backend> {
    /// Its configuration.
    pub config: Gpt2Config,
    wte: Tensor<B, 2>,
    wpe: Tensor<B, 2>,
    layers: Vec<Block<B>>,
    ln_f: LayerNorm<B>,
    lm_head: Linear<B>,
    plan: ExecutionPlan,
    device: B::Device,
}

impl<B: Backend> Gpt2<B> {
    /// Builds the model from `weights`, checking every tensor's shape against
    /// `config`, with `plan`'s load-time choices ([`crate::LoadOptions::plan`]);
    /// completes the plan from the projections it loaded. HF names are
    /// `transformer.h.N.attn.c_attn.weight`, ...; the prefix-less names of the
    /// original OpenAI checkpoints (`h.N...`, `wte.weight`) are accepted too.
    /// GPT-2's forward runs the tensor block operations only (its LayerNorm,
    /// fused attention projection and biases have no host form). Reached
    /// through [`crate::Model::load`].
    pub(crate) fn from_plan(
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
        let norm = |prefix: &str| -> Result<LayerNorm<B>, ModelError> {
            Ok(LayerNorm::new(
                weights.tensor1::<B>(&format!("{root}{prefix}.weight"), h, device)?,
                weights.tensor1::<B>(&format!("{root}{prefix}.bias"), h, device)?,
                c.layer_norm_epsilon,
            ))
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
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            layers.push(Block {
                ln_1: norm(&format!("h.{i}.ln_1"))?,
                attn: SelfAttention {
                    c_attn: conv1d(&format!("h.{i}.attn.c_attn"), h, 3 * h)?,
                    c_proj: conv1d(&format!("h.{i}.attn.c_proj"), h, h)?,
                },
                ln_2: norm(&format!("h.{i}.ln_2"))?,
                mlp: Mlp {
                    c_fc: conv1d(&format!("h.{i}.mlp.c_fc"), h, inner)?,
                    c_proj: conv1d(&format!("h.{i}.mlp.c_proj"), inner, h)?,
                },
            });
        }
        let lm_head = if c.tie_word_embeddings {
            Linear::new(wte.clone(), None)
        } else {
            weights.linear("lm_head", (h, c.vocab_size), false, plan.products, device)?
        }
        .with_product_plan(plan.products);
        let plan = plan.with_projections(
            layers.iter().flat_map(|b| {
                [&b.attn.c_attn, &b.attn.c_proj, &b.mlp.c_fc, &b.mlp.c_proj]
                    .map(Linear::projection_kernel)
            }),
            Some("LayerNorm and GPT-2's fused attention projection"),
        );
        Ok(Self {
            config: c.clone(),
            wte,
            wpe,
            layers,
            ln_f: norm("ln_f")?,
            lm_head,
            plan,
            device: device.clone(),
        })
    }

    /// Which implementations run the forward pass.
    pub fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

    /// The token embedding matrix, `[vocab, n_embd]`.
    pub fn wte(&self) -> &Tensor<B, 2> {
        &self.wte
    }

    /// The position embedding matrix, `[n_positions, n_embd]`.
    pub fn wpe(&self) -> &Tensor<B, 2> {
        &self.wpe
    }

    /// The projection at `site` (weights `[in, out]`), if the model has it:
    /// [`Projection::CAttn`], [`Projection::CProj`], [`Projection::CFc`] or
    /// [`Projection::MlpCProj`] of a layer.
    pub fn projection(&self, site: Site) -> Option<&Linear<B>> {
        let block = self.layers.get(site.layer)?;
        match site.module {
            Projection::CAttn => Some(&block.attn.c_attn),
            Projection::CProj => Some(&block.attn.c_proj),
            Projection::CFc => Some(&block.mlp.c_fc),
            Projection::MlpCProj => Some(&block.mlp.c_proj),
            _ => None,
        }
    }

    /// Rejects a step that would take some row past the `n_positions`
    /// learned positions (before the cache is touched).
    fn check_context(&self, batch: &Batch, cache: &KvCache<B>) -> Result<(), ModelError> {
        for row in 0..batch.rows() {
            let before = cache.real_tokens(row).unwrap_or(0);
            let new = (0..batch.len()).filter(|&i| batch.is_real(row, i)).count();
            if before + new > self.config.n_positions {
                return Err(ModelError::bad_input(format!(
                    "row {row}: {} tokens exceed GPT-2's {} positions",
                    before + new,
                    self.config.n_positions
                )));
            }
        }
        Ok(())
    }
}

impl<B: Backend> SelfAttention<B> {
    /// Attention of this step's `x` (`[batch, seq, n_embd]`) over the cached
    /// slots of `layer` plus this step, `mask` from [`KvCache::mask`]. As HF's
    /// eager attention: `softmax(q kᵀ · head_dim^-1/2, masked) v`.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        layer: usize,
        n_head: usize,
        mask: &StepMask<B>,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Tensor<B, 3> {
        let [b, s, h] = x.dims();
        let hd = h / n_head;
        let site = |module| Site { layer, module };
        let qkv = self.c_attn.forward(x, site(Projection::CAttn), delta);
        // Queries, keys and values are consecutive `h`-wide column blocks.
        let part = |j: usize| qkv.clone().narrow(2, j * h, h).reshape([b, s, n_head, hd]);
        let scoring = Scoring {
            scale: (hd as f64).powf(-0.5),
            softcap: None,
        };
        let out = cache.attend(layer, part(0), part(1), part(2), None, mask, scoring);
        self.c_proj.forward(out, site(Projection::CProj), delta)
    }
}

impl<B: Backend> LanguageModel<B> for Gpt2<B> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn num_layers(&self) -> usize {
        self.config.n_layer
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
        self.plan.run(|| self.forward_blocks(batch, cache, delta))
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.plan.run(|| self.lm_head.forward_base(hidden))
    }
}

impl<B: Backend> Gpt2<B> {
    /// The embeddings, the decoder blocks and the final LayerNorm.
    fn forward_blocks(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        self.check_context(batch, cache)?;
        let Step { ids, positions } = start_step(self, batch, cache)?;
        // A padding token's output is never read and its key is masked: it
        // looks up position 0, so that no padding can index past `wpe`.
        let pos: Vec<i64> = positions
            .iter()
            .enumerate()
            .flat_map(|(r, row)| {
                row.iter()
                    .enumerate()
                    .map(move |(i, &p)| if batch.is_real(r, i) { p as i64 } else { 0 })
            })
            .collect();
        let pos = Tensor::<B, 2, Int>::from_data(
            TensorData::new(pos, [batch.rows(), batch.len()]),
            &self.device,
        );
        let mask = cache.step_mask(batch.len(), None, &self.device);
        let mut x = embedding(self.wte.clone(), ids) + embedding(self.wpe.clone(), pos);
        for (i, block) in self.layers.iter().enumerate() {
            let site = |module| Site { layer: i, module };
            let a = block.attn.forward(
                block.ln_1.forward(x.clone()),
                i,
                self.config.n_head,
                &mask,
                cache,
                delta,
            );
            x = x + a;
            let up =
                block
                    .mlp
                    .c_fc
                    .forward(block.ln_2.forward(x.clone()), site(Projection::CFc), delta);
            let up = match self.config.activation {
                Gpt2Activation::GeluTanh => gelu_tanh(up),
                Gpt2Activation::Gelu => gelu(up),
            };
            x = x + block
                .mlp
                .c_proj
                .forward(up, site(Projection::MlpCProj), delta);
        }
        Ok(self.ln_f.forward(x))
    }
}
