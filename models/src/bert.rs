//! BERT encoder (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional
//! Transformers") and sentence embeddings as sentence-transformers computes
//! them (Reimers & Gurevych 2019, "Sentence-BERT"); follows HF transformers'
//! `modeling_bert.py` (`BertModel`, eager attention):
//! - word + absolute position + token-type embeddings, then LayerNorm;
//! - post-norm blocks: `LN(x + attn(x))`, then `LN(h + W₂ gelu(W₁ h))` with
//!   exact GELU;
//! - bidirectional attention; padding keys are masked out.
//!
//! [`SentenceEncoder`] is a sentence-transformers folder (`modules.json`:
//! Transformer → mean Pooling → optional Normalize), e.g. all-MiniLM-L6-v2:
//! the tokenizer's `[CLS] … [SEP]`, truncation at `max_seq_length`, the
//! mean of the last hidden states over real tokens, then L2 normalisation.
//! The embedding baseline of Wu et al. (2023) uses it to place sentences in
//! a space where a Gaussian mechanism can average them.

mod config;
mod sentence;

pub use config::BertConfig;
pub use sentence::SentenceEncoder;

use burn::tensor::{Bool, Int, Tensor, TensorData, activation::softmax, backend::Backend};

use crate::backend::ModelBackend;
use crate::error::ModelError;
use crate::layers::LayerNorm;
use crate::layers::activation::gelu;
use crate::layers::linear::Linear;
use crate::weights::WeightSource;

/// One post-norm encoder block.
#[derive(Debug, Clone)]
struct Block<B: Backend> {
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    attn_out: Linear<B>,
    attn_norm: LayerNorm<B>,
    intermediate: Linear<B>,
    output: Linear<B>,
    out_norm: LayerNorm<B>,
}

/// A BERT encoder on backend `B`.
#[derive(Debug, Clone)]
pub struct Bert<B: Backend> {
    /// Its configuration.
    pub config: BertConfig,
    word: Tensor<B, 2>,
    position: Tensor<B, 2>,
    /// Row 0 of `token_type_embeddings`: every sentence here is segment A.
    segment_a: Tensor<B, 1>,
    emb_norm: LayerNorm<B>,
    layers: Vec<Block<B>>,
    device: B::Device,
}

impl<B: ModelBackend> Bert<B> {
    /// Builds the encoder from `weights` (HF `BertModel` names,
    /// `embeddings.word_embeddings.weight`, `encoder.layer.N...`; a `bert.`
    /// prefix, as in `BertFor*` checkpoints, is accepted too), checking every
    /// shape against `config`.
    pub fn load(
        config: &BertConfig,
        weights: &WeightSource,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let c = config;
        let h = c.hidden_size;
        let root = if weights.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let norm = |prefix: &str| -> Result<LayerNorm<B>, ModelError> {
            Ok(LayerNorm::new(
                weights.tensor1::<B>(&format!("{root}{prefix}.weight"), h, device)?,
                weights.tensor1::<B>(&format!("{root}{prefix}.bias"), h, device)?,
                c.layer_norm_eps,
            ))
        };
        let linear = |prefix: &str, i: usize, o: usize| {
            let products = crate::plan::ProductPlan::for_backend::<B>();
            weights.linear::<B>(&format!("{root}{prefix}"), (i, o), true, products, device)
        };
        let word = weights.tensor2::<B>(
            &format!("{root}embeddings.word_embeddings.weight"),
            c.vocab_size,
            h,
            device,
        )?;
        let position = weights.tensor2::<B>(
            &format!("{root}embeddings.position_embeddings.weight"),
            c.max_position_embeddings,
            h,
            device,
        )?;
        let token_type = weights.tensor2::<B>(
            &format!("{root}embeddings.token_type_embeddings.weight"),
            c.type_vocab_size,
            h,
            device,
        )?;
        let segment_a = token_type.slice([0..1, 0..h]).reshape([h]);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Block {
                query: linear(&format!("{p}.attention.self.query"), h, h)?,
                key: linear(&format!("{p}.attention.self.key"), h, h)?,
                value: linear(&format!("{p}.attention.self.value"), h, h)?,
                attn_out: linear(&format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                intermediate: linear(&format!("{p}.intermediate.dense"), h, c.intermediate_size)?,
                output: linear(&format!("{p}.output.dense"), c.intermediate_size, h)?,
                out_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(Self {
            config: c.clone(),
            word,
            position,
            segment_a,
            emb_norm: norm("embeddings.LayerNorm")?,
            layers,
            device: device.clone(),
        })
    }

    /// The last hidden states `[batch, longest, hidden]` of token rows of
    /// different lengths (right-padded; padded positions hold values that
    /// mean nothing and must be ignored, see [`Bert::mask`]).
    ///
    /// Errors: an empty batch or row, a row longer than
    /// `max_position_embeddings`, or an id outside the vocabulary.
    pub fn forward(&self, rows: &[Vec<u32>]) -> Result<Tensor<B, 3>, ModelError> {
        let c = &self.config;
        let longest = self.check(rows)?;
        let b = rows.len();
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let head_dim = h / heads;

        let ids: Vec<i64> = rows
            .iter()
            .flat_map(|r| (0..longest).map(move |t| r.get(t).map_or(0, |&id| id as i64)))
            .collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, longest]), &self.device);
        let words = self.word.clone().select(0, ids.reshape([b * longest]));
        let positions = self.position.clone().slice([0..longest, 0..h]);
        let x = words.reshape([b, longest, h])
            + positions.unsqueeze::<3>()
            + self.segment_a.clone().unsqueeze::<3>();
        let mut x = self.emb_norm.forward(x);

        // Padding keys get no weight: `[b, 1, 1, t]`, true where padded.
        let pad = self
            .mask(rows, longest)
            .bool_not()
            .reshape([b, 1, 1, longest]);
        let pad = pad.expand([b, heads, longest, longest]);
        let scale = (head_dim as f64).powf(-0.5);
        for block in &self.layers {
            let split = |t: Tensor<B, 3>| t.reshape([b, longest, heads, head_dim]).swap_dims(1, 2);
            let q = split(block.query.forward_base(x.clone()));
            let k = split(block.key.forward_base(x.clone()));
            let v = split(block.value.forward_base(x.clone()));
            let scores = (q.matmul(k.swap_dims(2, 3)) * scale).mask_fill(pad.clone(), f32::MIN);
            let attended = softmax(scores, 3)
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([b, longest, h]);
            let h1 = block
                .attn_norm
                .forward(x + block.attn_out.forward_base(attended));
            let ff = block
                .output
                .forward_base(gelu(block.intermediate.forward_base(h1.clone())));
            x = block.out_norm.forward(h1 + ff);
        }
        Ok(x)
    }

    /// `[batch, longest]`, true at the real (unpadded) tokens of each row.
    pub fn mask(&self, rows: &[Vec<u32>], longest: usize) -> Tensor<B, 2, Bool> {
        let real: Vec<bool> = rows
            .iter()
            .flat_map(|r| (0..longest).map(move |t| t < r.len()))
            .collect();
        Tensor::from_data(TensorData::new(real, [rows.len(), longest]), &self.device)
    }

    /// The longest row, after checking the batch.
    fn check(&self, rows: &[Vec<u32>]) -> Result<usize, ModelError> {
        let c = &self.config;
        if rows.is_empty() {
            return Err(ModelError::BadInput("empty batch".into()));
        }
        let mut longest = 0;
        for (i, row) in rows.iter().enumerate() {
            if row.is_empty() {
                return Err(ModelError::BadInput(format!("row {i} has no tokens")));
            }
            if row.len() > c.max_position_embeddings {
                return Err(ModelError::BadInput(format!(
                    "row {i} has {} tokens, more than max_position_embeddings {}",
                    row.len(),
                    c.max_position_embeddings
                )));
            }
            if let Some(&id) = row.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(ModelError::BadInput(format!(
                    "row {i}: token id {id} is outside the vocabulary of {}",
                    c.vocab_size
                )));
            }
            longest = longest.max(row.len());
        }
        Ok(longest)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }
}
