//! One decoder block's modules, which LoRA site each projection is, and the
//! block's forward in the block operations ([`Block::forward`]).

use burn::tensor::backend::Backend;

use crate::backend::ModelBackend;
use crate::layers::{Attention, Linear, Norm, Projection, QkvProjections, Site};
use crate::ops::{BlockOps, MlpActivation};

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

impl<B: ModelBackend> Block<B> {
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

/// Where a block sits in its decoder, for its forward ([`Block::forward`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockAt<'a, B: Backend> {
    /// The block's layer (its projections' LoRA sites).
    pub layer: usize,
    /// The sites of its projections.
    pub sites: BlockSites,
    /// The MLP's activation.
    pub activation: MlpActivation,
    /// The norm after the block: the next block's input norm, the final
    /// norm after the last block.
    pub next_norm: &'a Norm<B>,
}

impl<B: Backend> Block<B> {
    /// The block's forward in the block operations `ops`, the sequence
    /// every forward of a decoder runs: from the block's input `x` and its
    /// normed input `n` to its output and that output normed by
    /// `at.next_norm`. The query, key and value projections, attention over
    /// `context`, the output projection and its residual add (with sandwich
    /// norms, of the normed attention output), the MLP's pre-norm, gate and
    /// up projections, activation and down projection, and the second
    /// residual add (with sandwich norms, of the normed MLP output).
    pub fn forward<O: BlockOps<B>>(
        &self,
        ops: &mut O,
        at: BlockAt<'_, B>,
        x: O::Rows,
        n: O::Rows,
        context: O::Context<'_>,
    ) -> (O::Rows, O::Rows) {
        let (layer, sites) = (at.layer, at.sites);
        let site = |module| Site { layer, module };
        let (attn, mlp) = (&self.attn, &self.mlp);
        let qkv = match &attn.qkv {
            QkvProjections::Separate([q, k, v]) => ops.project(
                &n,
                [
                    (q, site(Projection::Q)),
                    (k, site(Projection::K)),
                    (v, site(Projection::V)),
                ],
            ),
            QkvProjections::Fused(qkv) => {
                let [fused] = ops.project(&n, [(qkv, site(sites.fused_qkv))]);
                ops.split(fused, attn.qkv_widths())
            }
        };
        drop(n);
        let heads = ops.attend(attn, layer, qkv, context);
        let [o] = ops.project(&heads, [(&attn.o_proj, site(sites.o))]);
        drop(heads);
        // Sandwich norms: norm the attention output, then pre-norm the
        // MLP input; else the post-attention norm is the MLP's pre-norm.
        let (x, n) = match &self.feedforward_norms {
            Some((pre, _)) => ops.residual(x, o, Some(&self.post_attention_layernorm), pre),
            None => ops.residual(x, o, None, &self.post_attention_layernorm),
        };
        let act = match &mlp.gate {
            Some(gate) => {
                let [gate, up] = ops.project(
                    &n,
                    [(gate, site(Projection::Gate)), (&mlp.up, site(sites.up))],
                );
                ops.gated(at.activation, gate, up)
            }
            None => {
                let [up] = ops.project(&n, [(&mlp.up, site(sites.up))]);
                ops.activate(at.activation, up)
            }
        };
        drop(n);
        let [down] = ops.project(&act, [(&mlp.down, site(sites.down))]);
        drop(act);
        let post = self.feedforward_norms.as_ref().map(|(_, post)| post);
        ops.residual(x, down, post, at.next_norm)
    }
}
