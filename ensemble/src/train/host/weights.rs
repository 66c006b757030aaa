//! The frozen weights of a Llama-family model in host memory, read once from
//! a loaded model for the host training step.

use std::sync::Mutex;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorPrimitive};
#[cfg(test)]
use privmix_models::Model;
use privmix_models::layers::{Linear, RmsNorm, Rope, RopeStyle};
use privmix_models::runtime::to_vec;
use privmix_models::{Llama, ModelBackend, Projection, SharedF32};

use super::pool::Pool;
use crate::lora::transpose;
use crate::train::error::TrainError;

/// A weight's row-major values: the model's own storage where its tensor
/// lies that way in host memory (shared, not copied: the trainer's model
/// keeps it anyway), else a copy.
#[derive(Debug)]
pub(crate) enum HostRows {
    /// A run of the model tensor's storage.
    Shared(SharedF32),
    /// A copy.
    Owned(Vec<f32>),
}

impl HostRows {
    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        match self {
            Self::Shared(values) => values.as_slice(),
            Self::Owned(v) => v,
        }
    }

    /// `t` (`[rows, cols]` logically, read through `strides`) as row-major
    /// `[r, c]` values where the backend shows its storage in host memory
    /// ([`ModelBackend::host_f32`]) and it lies so, with `strides` the
    /// expected element strides of its two dimensions; else a copy of
    /// `to_vec(t)` rearranged by `copy`.
    fn read<B: AutodiffBackend + ModelBackend>(
        t: &Tensor<B, 2>,
        strides: [usize; 2],
        copy: impl FnOnce(Vec<f32>) -> Vec<f32>,
    ) -> Result<Self, TrainError> {
        let shared = match t.clone().into_primitive() {
            TensorPrimitive::Float(p) => B::host_f32(&p),
            TensorPrimitive::QFloat(_) => None,
        }
        .and_then(|view| view.into_values_with_strides(&strides));
        Ok(match shared {
            Some(values) => Self::Shared(values),
            None => Self::Owned(copy(to_vec(t.clone())?)),
        })
    }
}

/// One projection: `y = x · w_t (+ bias)`, `w_t: [fan_in, fan_out]`.
///
/// The weights are kept both ways round, row-major: the forward product
/// reads `w_t`, the backward product `dx = dy · w_tᵀ` reads `w`
/// (`[fan_out, fan_in]`, the model's own storage where it lies so), so that
/// each streams its right-hand side along rows: read the other way, the
/// backward products pack a strided operand, which slows `gemm`'s kernels
/// most on the head's wide shape.
#[derive(Debug)]
pub(crate) struct HostLinear {
    pub w_t: Vec<f32>,
    pub w: HostRows,
    pub bias: Option<Vec<f32>>,
    pub fan_in: usize,
    pub fan_out: usize,
}

impl HostLinear {
    fn read<B: AutodiffBackend + ModelBackend>(l: &Linear<B>) -> Result<Self, TrainError> {
        let (fan_in, fan_out) = (l.in_features(), l.out_features());
        let w_t = to_vec(l.weight_t().clone())?;
        if w_t.len() != fan_in * fan_out {
            return Err(TrainError::BadData(format!(
                "a projection of {fan_in} × {fan_out} holds {} weights",
                w_t.len()
            )));
        }
        // `weight_t` is `[fan_in, fan_out]`; its storage is `[fan_out, fan_in]`
        // row-major where its strides are `[1, fan_in]`.
        let w = HostRows::read(l.weight_t(), [1, fan_in], |_| {
            transpose(&w_t, fan_in, fan_out)
        })?;
        Ok(Self {
            w,
            w_t,
            bias: l.bias().map(|b| to_vec(b.clone())).transpose()?,
            fan_in,
            fan_out,
        })
    }
}

/// One decoder block.
#[derive(Debug)]
pub(crate) struct HostBlock {
    pub norm1: Vec<f32>,
    /// Q, K, V, O, gate, up, down (see [`PROJECTIONS`]).
    pub proj: [HostLinear; 7],
    pub norm2: Vec<f32>,
}

/// The order of [`HostBlock::proj`].
pub(crate) const PROJECTIONS: [Projection; 7] = [
    Projection::Q,
    Projection::K,
    Projection::V,
    Projection::O,
    Projection::Gate,
    Projection::Up,
    Projection::Down,
];

/// The default [`HostLlama::activation_budget`]: a step keeps at most about
/// this many bytes of activations for its backward pass, beyond the
/// weights (a layer's working buffers and one slice of logits come on top).
pub(crate) const ACTIVATION_BUDGET: usize = 640 << 20;

/// A Llama-family model's frozen weights and shapes in host memory.
#[derive(Debug)]
pub(crate) struct HostLlama {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
    /// The embedding table `[vocab, hidden]`.
    pub embed: HostRows,
    pub blocks: Vec<HostBlock>,
    pub norm: Vec<f32>,
    pub head: HostLinear,
    /// The rotary embedding (rotate-half pairing).
    pub rope: Rope,
    /// Bytes of saved activations a step aims to stay within (see the
    /// `step` module): [`ACTIVATION_BUDGET`] unless a test sets less.
    pub activation_budget: usize,
    /// Buffers kept between steps.
    pub(crate) pool: Mutex<Pool>,
}

fn gain<B: AutodiffBackend>(n: &RmsNorm<B>) -> Result<Vec<f32>, TrainError> {
    Ok(to_vec(n.gain().clone())?)
}

impl HostLlama {
    /// The host copy of `model` where it has a Llama-family decoder (tests
    /// build it directly; trainers go through the execution plan).
    #[cfg(test)]
    pub fn from_model<B: AutodiffBackend + ModelBackend>(
        model: &Model<B>,
    ) -> Result<Option<Self>, TrainError> {
        use super::HostTrainable;
        model
            .host_training_decoder()
            .map(Self::from_llama)
            .transpose()
    }

    /// The host copy of `m`. Errors where `m` pairs its RoPE dimensions as
    /// llama.cpp does (the host step rotates halves; the execution plan
    /// declines the host step for such a model, so trainers never ask).
    pub fn from_llama<B: AutodiffBackend + ModelBackend>(m: &Llama<B>) -> Result<Self, TrainError> {
        let c = &m.config;
        if c.rope_style != RopeStyle::RotateHalf {
            return Err(TrainError::BadData(
                "the host training step rotates halves; this model pairs RoPE dimensions as llama.cpp does".into(),
            ));
        }
        let mut blocks = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = m
                .block_parts(i)
                .ok_or_else(|| TrainError::BadData(format!("no decoder block {i}")))?;
            blocks.push(HostBlock {
                norm1: gain(p.input_layernorm)?,
                proj: [
                    HostLinear::read(p.q_proj)?,
                    HostLinear::read(p.k_proj)?,
                    HostLinear::read(p.v_proj)?,
                    HostLinear::read(p.o_proj)?,
                    HostLinear::read(p.gate_proj)?,
                    HostLinear::read(p.up_proj)?,
                    HostLinear::read(p.down_proj)?,
                ],
                norm2: gain(p.post_attention_layernorm)?,
            });
        }
        let final_norm = m.final_norm().as_rms().ok_or_else(|| {
            TrainError::BadData("the host training step needs an RMSNorm final norm".into())
        })?;
        let embed = HostRows::read(m.embed_tokens(), [c.hidden_size, 1], |v| v)?;
        let head = HostLinear::read(m.lm_head())?;
        Ok(Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
            eps: final_norm.eps() as f32,
            embed,
            blocks,
            norm: gain(final_norm)?,
            head,
            rope: Rope::new(c.rope_theta, c.head_dim, c.rope_scaling, c.rope_style),
            activation_budget: ACTIVATION_BUDGET,
            pool: Mutex::new(Pool::default()),
        })
    }

    /// The embedding table `[vocab, hidden]`.
    pub fn embedding(&self) -> &[f32] {
        self.embed.as_slice()
    }

    /// The head's weight `[vocab, hidden]` (read by the backward product).
    pub fn head_w(&self) -> &[f32] {
        self.head.w.as_slice()
    }
}
