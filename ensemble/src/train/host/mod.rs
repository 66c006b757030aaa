//! The host training step for Llama-family models: the forward pass on
//! plain `f32` vectors, saving what the backward pass needs, and a
//! hand-written backward pass that yields the loss and the gradient of every
//! LoRA factor. It computes the same function as the burn-autodiff path
//! ([`super::mean_nll`] through the models' `LinearDelta` hook), which stays
//! the reference and the fallback (tests compare the two).
//!
//! Design:
//!
//! - **The models' forward.** A training forward is the decoder's own block
//!   sequence, the one inference runs
//!   ([`privmix_models::decoder::Decoder::block_forward`], generic over
//!   [`privmix_models::ops::BlockOps`]), in the training step's block
//!   operations (`block::TrainOps`): host rows, each group's LoRA factors
//!   and dropout, causal attention with no KV cache, and a tape of what each
//!   block's backward pass reads (beside them, `Ctx::block_backward`,
//!   walking that tape in reverse). RMSNorm is the norm's own host form,
//!   RoPE and the SiLU-gated product run the inference host kernels of
//!   `privmix-models`, and their backward passes sit beside those kernels
//!   ([`privmix_models::ops::backward`]): the forward is written once. The products are the models' strided
//!   f32 products ([`privmix_models::cpu::strided`], see below), and the
//!   causal attention that keeps every head's softmax probabilities, with
//!   its backward pass, is the models' too
//!   ([`privmix_models::ops::attention_backward`]).
//! - **Chosen by the execution plan.** A trainer runs this step where the
//!   model's plan says so ([`privmix_models::ExecutionPlan::host_training`]:
//!   burn autodiff over burn-flex, a Llama-family decoder with rotate-half
//!   RoPE), reading the decoder's weights through [`HostTrainable`].
//! - **Frozen base, activation gradients only.** No weight gradient of the
//!   base is formed; the backward pass carries `dL/dx` through every frozen
//!   product (`dx = dy · W`) and forms `dA = x̃ᵀ (s · dy Bᵀ)`,
//!   `dB = s · (x̃ A)ᵀ dy` on the targeted sites (`x̃`: the adapter's input
//!   after dropout, `s = lora_alpha / r`). Layer 0's input gradient is not
//!   needed and is not computed.
//! - **Products in f32 on the dequantised weights.** Each projection's
//!   weight is read once from the model (`Linear::weight_t`, the
//!   dequantised GGUF blocks: Q4_1 and Q8_0 values are exact in f32), so the
//!   loss is the function PyTorch computes on the same file. A training step
//!   multiplies every weight by all `rows × seq` tokens at once (512 at the
//!   benchmark's 4 × 128): the products are bound by arithmetic, not by
//!   reading the weights, so 4-bit blocks would save no time; the `gemm`
//!   crate's packed kernels (the ones burn-flex's matmul uses) run them
//!   through [`privmix_models::cpu::strided::matmul`], each product cut
//!   into tiles of output columns and rows that rayon's threads share, so
//!   that each tile packs only its part of the weight. The tiles follow the
//!   product's shape, not the thread count, so the step has the same bits
//!   at every thread count.
//! - **Attention saved, not recomputed**: the softmax probabilities of every
//!   head (`rows × heads × seq²` per layer) are kept for the backward pass.
//! - **Memory bounded by a budget.** A step's rows run in chunks whose saved
//!   activations fit [`weights::HostLlama::activation_budget`]; where one row's do
//!   not (long blocks), each layer's input alone is kept and the layer's
//!   forward pass runs again before its backward pass. The logits are
//!   formed a slice of tokens at a time. The embedding table and the
//!   backward products' weights are read from the model's own storage
//!   where it holds them as f32 row-major (burn-flex), not copied.
//! - **Rows in groups** ([`Group`]): each group of rows has its own adapter,
//!   dropout pass, mean loss and gradient — one group for a trainer's batch,
//!   one per example for DP-SGD, one per member for members trained together.
//! - **Buffers reused** across steps ([`weights::HostLlama`] keeps a pool), so a step
//!   does not pay page faults on hundreds of MB of fresh allocations.

mod block;
mod chunk;
mod kernels;
mod pool;
mod slot;
mod step;
#[cfg(test)]
mod tests;
mod weights;

pub(crate) use chunk::Group;
pub(crate) use slot::HostSlot;

use burn::tensor::backend::Backend;
use privmix_models::{Gemma, Llama, Model};

/// Which implementation computes a trainer's losses and gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepPath {
    /// The host step where the model's execution plan allows it
    /// ([`privmix_models::ExecutionPlan::host_training`]: a Llama-family
    /// model with rotate-half RoPE on burn autodiff over burn-flex), burn
    /// autodiff elsewhere.
    #[default]
    Fastest,
    /// burn autodiff always (the reference).
    Autodiff,
}

/// What the host training step reads of a base model: its Llama-family
/// decoder, where it has one. Whether the step runs at all is the model's
/// execution plan's decision ([`privmix_models::ExecutionPlan::host_training`]);
/// this only hands the step the weights.
pub trait HostTrainable<B: Backend> {
    /// The Llama-family decoder whose weights the host step reads (`None`:
    /// an architecture without a host training step).
    fn host_training_decoder(&self) -> Option<&Llama<B>>;
}

impl<B: Backend> HostTrainable<B> for Llama<B> {
    fn host_training_decoder(&self) -> Option<&Llama<B>> {
        Some(self)
    }
}

impl<B: Backend> HostTrainable<B> for Gemma<B> {
    fn host_training_decoder(&self) -> Option<&Llama<B>> {
        None
    }
}

impl<B: Backend> HostTrainable<B> for Model<B> {
    fn host_training_decoder(&self) -> Option<&Llama<B>> {
        match self {
            Model::Llama(m) => Some(m),
            _ => None,
        }
    }
}
