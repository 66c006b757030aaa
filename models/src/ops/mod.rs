//! The block-level operations a decoder forward is written in, and their two
//! implementations: [`tensor`] (burn's tensor ops, every backend) and
//! [`host`] (fused per-row passes in host memory, plain burn-flex with
//! quantised weights). Each architecture writes its forward once, generic
//! over [`BlockOps`] (a decoder block's sequence is
//! [`crate::decoder::Decoder::block_forward`]); the model's
//! [`crate::plan::ExecutionPlan`] picks the implementation for each step.
//! A third implementation outside this crate, the host training step of
//! `privmix-ensemble`, runs the same block sequence over host rows with no
//! KV cache ([`BlockOps::Context`]), keeping what its backward pass (built
//! from [`backward`] and [`attention_backward`]) reads.
//!
//! Why operations this coarse: the host implementation fuses what follows a
//! product (its LoRA update, the residual add, the next norm, the 8-bit
//! quantisation of the next products' input) into one parallel pass over
//! the rows, so a product's result stays pending until the operation that
//! consumes it ([`BlockOps::attend`], [`BlockOps::gated`],
//! [`BlockOps::activate`], [`BlockOps::residual`], [`BlockOps::split`])
//! adds what is owed to it row by row.

use burn::tensor::{Int, Tensor, backend::Backend};

use crate::error::ModelError;
use crate::layers::{Attention, KvCache, Linear, Norm, RopeAngles, Site, StepMask};

#[cfg(feature = "flex")]
pub mod attention_backward;
#[cfg(feature = "flex")]
pub mod backward;
mod dispatch;
#[cfg(feature = "flex")]
pub mod host;
pub mod tensor;

pub(crate) use dispatch::dispatch;

/// The activation of an MLP: of the gate in a gated MLP, `act(gate) · up`
/// (Llama, Gemma), of the up projection in a plain one, `act(up)` (GPT-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    /// SiLU (Llama's SwiGLU).
    Silu,
    /// GELU, tanh approximation (Gemma's GeGLU, `gelu_pytorch_tanh`;
    /// GPT-2's `gelu_new`).
    GeluTanh,
    /// Exact GELU.
    Gelu,
}

/// What a decode step's attention reads besides its own keys and values
/// ([`BlockOps::Context`] of [`tensor::TensorOps`] and `host::HostOps`): the
/// KV cache its keys and values are appended to, the cache's step mask and
/// the step's RoPE angles (`None`: positions were added at embedding).
pub struct Cached<'c, B: Backend> {
    /// The RoPE angles of the step's positions.
    pub angles: Option<&'c RopeAngles<B>>,
    /// The causal, padding and window mask of the step over the cache.
    pub mask: &'c StepMask<B>,
    /// The cache.
    pub cache: &'c mut KvCache<B>,
}

/// The operations of a pre-norm decoder block, on activations of
/// `[batch, seq, width]` rows.
pub trait BlockOps<B: Backend> {
    /// Rows of activations (the residual stream, a normed stream, an
    /// attention or MLP output).
    type Rows;
    /// A projection's output, its bias and LoRA update added or owed (then
    /// added by the operation that consumes it).
    type Product;

    /// The token embeddings of `ids` (`[batch, seq]`), times `scale` if
    /// given (Gemma's `√hidden`, in f32), plus, where `positions` gives a
    /// table of learned absolute positions and each token's position
    /// (`[batch, seq]`), that table's rows (GPT-2's `wpe`).
    fn embed(
        &mut self,
        table: &Tensor<B, 2>,
        ids: Tensor<B, 2, Int>,
        scale: Option<f32>,
        positions: Option<(&Tensor<B, 2>, Tensor<B, 2, Int>)>,
    ) -> Result<Self::Rows, ModelError>;

    /// `norm(x)`.
    fn norm(&mut self, norm: &Norm<B>, x: &Self::Rows) -> Self::Rows;

    /// The projections of one `x` (a block's query, key and value, or an
    /// MLP's gate and up), each with the adapter's update at its site.
    fn project<const N: usize>(
        &mut self,
        x: &Self::Rows,
        projections: [(&Linear<B>, Site); N],
    ) -> [Self::Product; N];

    /// The consecutive column blocks of a fused projection's output, as wide
    /// as `widths` says (GPT-2's `c_attn`: queries, keys, values).
    fn split<const N: usize>(
        &mut self,
        fused: Self::Product,
        widths: [usize; N],
    ) -> [Self::Product; N];

    /// What [`BlockOps::attend`] attends over besides the step's own keys
    /// and values, and how it rotates positions: a KV cache, its mask and
    /// the step's RoPE angles ([`Cached`]) for a decode step; an
    /// implementation without a cache (the host training step: causal
    /// attention inside each row, its own RoPE tables) states its own.
    type Context<'c>;

    /// Attention of this step's queries over what `context` holds for
    /// `layer` and this step's keys and values: with [`Cached`], the cache
    /// of `layer` (this step's keys and values appended to it), rotation by
    /// its angles (none: positions were added at embedding), its mask's
    /// causal, padding and window mask; the per-head q/k norms if `attn`
    /// has them, scores scaled and soft-capped as `attn` says.
    /// `[batch, seq, heads · head_dim]`.
    fn attend(
        &mut self,
        attn: &Attention<B>,
        layer: usize,
        qkv: [Self::Product; 3],
        context: Self::Context<'_>,
    ) -> Self::Rows;

    /// `act(gate) · up` (a gated MLP).
    fn gated(&mut self, act: MlpActivation, gate: Self::Product, up: Self::Product) -> Self::Rows;

    /// `act(up)` (an MLP without a gate).
    fn activate(&mut self, act: MlpActivation, up: Self::Product) -> Self::Rows;

    /// The residual add `x + post(y)` (`post`, where given, norms the
    /// branch's output first: Gemma 2/3's sandwich norms), and `norm` of
    /// that sum: `(x + post(y), norm(x + post(y)))`.
    fn residual(
        &mut self,
        x: Self::Rows,
        y: Self::Product,
        post: Option<&Norm<B>>,
        norm: &Norm<B>,
    ) -> (Self::Rows, Self::Rows);

    /// The final hidden states, `[batch, seq, hidden]`, from the last norm's
    /// output.
    fn finish(self, normed: Self::Rows) -> Result<Tensor<B, 3>, ModelError>;
}
