//! The backward passes of the host operations, beside the forward kernels
//! they differentiate, for a training step that runs on host vectors (the
//! host LoRA step of `privmix-ensemble`, chosen by
//! [`crate::plan::ExecutionPlan::host_training`]).
//!
//! Each function takes the gradient of an operation's output and gives the
//! gradient of its input, on row-major `f32` slices, one thread (callers
//! split rows over theirs). The forward passes are the inference kernels
//! themselves: [`rms_norm_host`], [`rotate_host`] and
//! [`crate::cpu::vexp::silu_in_place`]; so a step's forward is written once.
//! Each backward pass is checked against burn autodiff of the tensor form of
//! its operation (the tests beside this file).

use crate::layers::RopeStyle;
use crate::layers::rms_norm::inverse_rms;
use crate::layers::rope::for_each_pair;
#[cfg(doc)]
use crate::layers::{rms_norm::rms_norm_host, rope::rotate_host};

/// Adds to `dx` the gradient of RMSNorm's input `x` given `dy`, the
/// gradient of its output `y = x · inv · g` (rows as wide as `gain`,
/// `inv = 1 / √(mean(x²) + ε)` as [`rms_norm_host`] computes it): with
/// `u = g ⊙ dy`, `dx += inv · u − x · inv³ · (Σ_j u_j x_j) / width`.
///
/// Derivation: `∂inv/∂x_j = −inv³ · x_j / width`, so
/// `∂L/∂x_j = inv · u_j + Σ_i u_i x_i · ∂inv/∂x_j`.
pub fn rms_norm_backward(x: &[f32], gain: &[f32], eps: f32, dy: &[f32], dx: &mut [f32]) {
    let width = gain.len().max(1);
    for ((x, dy), dx) in x
        .chunks_exact(width)
        .zip(dy.chunks_exact(width))
        .zip(dx.chunks_exact_mut(width))
    {
        let inv = inverse_rms(x, eps);
        let dot: f32 = x
            .iter()
            .zip(dy)
            .zip(gain)
            .map(|((x, d), g)| x * d * g)
            .sum();
        let c = inv * inv * inv * dot / width as f32;
        for (((dx, x), dy), g) in dx.iter_mut().zip(x).zip(dy).zip(gain) {
            *dx += inv * g * dy - x * c;
        }
    }
}

/// The backward pass of [`rotate_host`], in place: `dy` (laid out as its
/// `x`, with the same `heads`, tables, `first` and style) becomes the
/// gradient of the unrotated input. A rotation's Jacobian is orthogonal,
/// so this is the rotation by the opposite angle: each pair `(a, b)`
/// becomes `(a·cos + b·sin, b·cos − a·sin)`.
pub fn rotate_host_backward(
    dy: &mut [f32],
    heads: usize,
    (cos, sin): (&[f32], &[f32]),
    head_dim: usize,
    first: usize,
    style: RopeStyle,
) {
    for_each_pair(
        dy,
        heads,
        (cos, sin),
        head_dim,
        first,
        style,
        |a, b, c, s| (a * c.0 + b * s.1, b * c.1 - a * s.0),
    );
}

/// The logistic function, in f32.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The gradients of `silu(gate) · up` (the gated MLP of
/// [`crate::ops::BlockOps::gated`] with [`crate::ops::MlpActivation::Silu`])
/// with respect to `gate` and `up`, given `d`, the gradient of its output;
/// written over `gate` and `up`: with `σ = σ(gate)`,
/// `d_up = d · gate · σ`, `d_gate = d · up · σ · (1 + gate · (1 − σ))`.
pub fn silu_gated_backward(d: &[f32], gate: &mut [f32], up: &mut [f32]) {
    for ((g, u), d) in gate.iter_mut().zip(up.iter_mut()).zip(d) {
        let s = sigmoid(*g);
        let silu = *g * s;
        let dg = d * *u * s * (1.0 + *g * (1.0 - s));
        *u = d * silu;
        *g = dg;
    }
}

#[cfg(test)]
mod tests;
