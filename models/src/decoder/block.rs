//! One decoder block's modules, and which LoRA site each projection is.

use burn::tensor::backend::Backend;

use crate::layers::{Attention, Linear, Norm, Projection, QkvProjections};

/// The MLP: `down(act(gate(x)) · up(x))` with a gate (Llama's SwiGLU,
/// Gemma's GeGLU), `down(act(up(x)))` without one (GPT-2).
#[derive(Debug, Clone)]
pub(crate) struct Mlp<B: Backend> {
    pub gate: Option<Linear<B>>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

/// One pre-norm decoder block.
#[derive(Debug, Clone)]
pub(crate) struct Block<B: Backend> {
    pub input_layernorm: Norm<B>,
    pub attn: Attention<B>,
    /// The MLP's pre-norm, or (with sandwich norms) the attention output's
    /// norm.
    pub post_attention_layernorm: Norm<B>,
    /// `pre_feedforward_layernorm` and `post_feedforward_layernorm`
    /// (sandwich norms).
    pub feedforward_norms: Option<(Norm<B>, Norm<B>)>,
    pub mlp: Mlp<B>,
    /// A sliding-window layer.
    pub sliding: bool,
}

impl<B: Backend> Block<B> {
    /// The block's projections, with the module each is at.
    pub fn projections(&self, sites: BlockSites) -> Vec<(&Linear<B>, Projection)> {
        let mut all = match &self.attn.qkv {
            QkvProjections::Separate([q, k, v]) => {
                vec![(q, Projection::Q), (k, Projection::K), (v, Projection::V)]
            }
            QkvProjections::Fused(qkv) => vec![(qkv, sites.fused_qkv)],
        };
        all.push((&self.attn.o_proj, sites.o));
        if let Some(gate) = &self.mlp.gate {
            all.push((gate, Projection::Gate));
        }
        all.push((&self.mlp.up, sites.up));
        all.push((&self.mlp.down, sites.down));
        all
    }

    /// The projection at `site`'s module, if the block has it.
    pub fn projection(&self, module: Projection, sites: BlockSites) -> Option<&Linear<B>> {
        self.projections(sites)
            .into_iter()
            .find_map(|(p, m)| (m == module).then_some(p))
    }
}

/// The LoRA sites (`Site::module`) of the projections whose HF module
/// names differ between architectures; the separate query, key, value and
/// gate projections are always [`Projection::Q`], `K`, `V` and `Gate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockSites {
    /// A fused query/key/value projection.
    pub fused_qkv: Projection,
    /// The attention output projection.
    pub o: Projection,
    /// The MLP's up projection (a plain MLP's first).
    pub up: Projection,
    /// The MLP's down projection.
    pub down: Projection,
}

impl BlockSites {
    /// HF Llama's and Gemma's names (`o_proj`, `up_proj`, `down_proj`).
    pub const LLAMA: Self = Self {
        fused_qkv: Projection::CAttn,
        o: Projection::O,
        up: Projection::Up,
        down: Projection::Down,
    };

    /// HF GPT-2's names (`c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj`).
    pub const GPT2: Self = Self {
        fused_qkv: Projection::CAttn,
        o: Projection::CProj,
        up: Projection::CFc,
        down: Projection::MlpCProj,
    };
}
