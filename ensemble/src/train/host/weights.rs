//! The frozen weights of a Llama-family model in host memory, read once from
//! a loaded model for the host training step.

use std::sync::Mutex;

use burn::tensor::backend::Backend;
use privmix_models::layers::rope::inv_freq;
use privmix_models::layers::{Linear, RmsNorm, RopeStyle};
use privmix_models::runtime::to_vec;
use privmix_models::{Llama, Model, Projection};

use super::pool::Pool;
use crate::lora::transpose;
use crate::train::error::TrainError;

/// One projection: `y = x · w_t (+ bias)`, `w_t: [fan_in, fan_out]`.
///
/// The weights are kept twice, row-major both ways: the forward product reads
/// `w_t`, the backward product `dx = dy · w_tᵀ` reads `w` (`[fan_out, fan_in]`),
/// so that each streams its right-hand side along rows: read the other way,
/// the backward products pack a strided operand, which slows `gemm`'s kernels
/// most on the head's wide shape.
#[derive(Debug)]
pub(crate) struct HostLinear {
    pub w_t: Vec<f32>,
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub fan_in: usize,
    pub fan_out: usize,
}

impl HostLinear {
    fn read<B: Backend>(l: &Linear<B>) -> Result<Self, TrainError> {
        let (fan_in, fan_out) = (l.in_features(), l.out_features());
        let w_t = to_vec(l.weight_t().clone())?;
        if w_t.len() != fan_in * fan_out {
            return Err(TrainError::BadData(format!(
                "a projection of {fan_in} × {fan_out} holds {} weights",
                w_t.len()
            )));
        }
        Ok(Self {
            w: transpose(&w_t, fan_in, fan_out),
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

/// A Llama-family model's frozen weights and shapes in host memory.
#[derive(Debug)]
pub(crate) struct HostLlama {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
    pub embed: Vec<f32>,
    pub blocks: Vec<HostBlock>,
    pub norm: Vec<f32>,
    pub head: HostLinear,
    pub inv_freq: Vec<f32>,
    /// Buffers kept between steps.
    pub(crate) pool: Mutex<Pool>,
}

fn gain<B: Backend>(n: &RmsNorm<B>) -> Result<Vec<f32>, TrainError> {
    Ok(to_vec(n.gain().clone())?)
}

impl HostLlama {
    /// The host copy of `model` when it is a Llama-family model the host
    /// step supports (rotate-half RoPE); `None` for other architectures.
    pub fn from_model<B: Backend>(model: &Model<B>) -> Result<Option<Self>, TrainError> {
        match model {
            Model::Llama(m) => Self::from_llama(m),
            _ => Ok(None),
        }
    }

    /// The host copy of `m`; `None` where the host step lacks a part
    /// (llama.cpp's interleaved RoPE pairing).
    pub fn from_llama<B: Backend>(m: &Llama<B>) -> Result<Option<Self>, TrainError> {
        let c = &m.config;
        if c.rope_style != RopeStyle::RotateHalf {
            return Ok(None);
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
        Ok(Some(Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
            eps: m.final_norm().eps() as f32,
            embed: to_vec(m.embed_tokens().clone())?,
            blocks,
            norm: gain(m.final_norm())?,
            head: HostLinear::read(m.lm_head())?,
            inv_freq: inv_freq(c.rope_theta, c.head_dim, c.rope_scaling),
            pool: Mutex::new(Pool::default()),
        }))
    }
}
