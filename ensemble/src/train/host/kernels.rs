//! The host step's element-wise building blocks on row-major `f32`
//! slices: RoPE and the SiLU-gated product with their backward passes, and
//! RMSNorm's backward pass (its forward is the norm's own host form,
//! `Norm::forward_host_into`), each the models' own host kernel
//! ([`privmix_models::ops::backward`] and the forward kernels it names)
//! with its rows split over rayon's threads. The products are the models'
//! ([`privmix_models::cpu::strided`]), as is the attention
//! ([`privmix_models::ops::attention_backward`]).

use privmix_models::cpu::strided::rows_per_task;
use privmix_models::cpu::vexp::silu_in_place;
use privmix_models::layers::Rope;
use privmix_models::layers::rope::rotate_host;
use privmix_models::ops::backward;
use rayon::prelude::*;

/// Rows of `width` values per parallel task of a pass over `rows` rows.
fn rows_chunk(rows: usize, width: usize) -> usize {
    rows_per_task(rows) * width.max(1)
}

/// Adds to `dx` the gradient of RMSNorm's input given `dy`: the models'
/// backward pass ([`backward::rms_norm_backward`]), rows split over
/// rayon's threads.
pub(crate) fn rms_norm_backward(x: &[f32], gain: &[f32], eps: f32, dy: &[f32], dx: &mut [f32]) {
    let per = rows_chunk(x.len() / gain.len().max(1), gain.len());
    dx.par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .zip(dy.par_chunks(per))
        .for_each(|((dx, x), dy)| backward::rms_norm_backward(x, gain, eps, dy, dx));
}

/// The RoPE of a step whose rows are blocks of `seq` tokens, token `t` at
/// position `t % seq`: the rope and its host tables for positions `0..seq`.
pub(crate) struct StepRope<'a> {
    pub rope: &'a Rope,
    pub tables: (Vec<f32>, Vec<f32>),
    pub seq: usize,
}

impl<'a> StepRope<'a> {
    /// The tables of `rope` for positions `0..seq`.
    pub fn new(rope: &'a Rope, seq: usize) -> Self {
        Self {
            rope,
            tables: rope.host_tables(0..seq),
            seq,
        }
    }

    /// Rotates every head of `x` (`[tokens, heads · head_dim]`) in place
    /// with the models' kernel ([`rotate_host`]), or with `inverse` applies
    /// its backward pass ([`backward::rotate_host_backward`]), which maps an
    /// output gradient to the input gradient; tokens split over rayon's
    /// threads.
    pub fn apply(&self, x: &mut [f32], heads: usize, inverse: bool) {
        let d = self.rope.head_dim();
        let style = self.rope.style();
        let tables = (self.tables.0.as_slice(), self.tables.1.as_slice());
        x.par_chunks_mut(heads * d)
            .enumerate()
            .for_each(|(t, row)| {
                let at = t % self.seq;
                if inverse {
                    backward::rotate_host_backward(row, heads, tables, d, at, style);
                } else {
                    rotate_host(row, heads, tables, d, at, style);
                }
            });
    }
}

/// Elements per parallel task of an element-wise pass.
const ELEMENTS_PER_TASK: usize = 4096;

/// `silu(gate) · up`, element-wise, into `out`: the models' SiLU kernel
/// ([`silu_in_place`]) on a copy of `gate`, times `up`.
pub(crate) fn silu_gated(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(gate.par_chunks(ELEMENTS_PER_TASK))
        .zip(up.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((o, g), u)| {
            o.copy_from_slice(g);
            silu_in_place(o);
            for (o, u) in o.iter_mut().zip(u) {
                *o *= u;
            }
        });
}

/// The gradients of `silu(gate) · up` with respect to `gate` and `up`
/// given `d`, written over `gate` and `up`: the models' backward pass
/// ([`backward::silu_gated_backward`]), split over rayon's threads.
pub(crate) fn silu_gated_backward(d: &[f32], gate: &mut [f32], up: &mut [f32]) {
    gate.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(up.par_chunks_mut(ELEMENTS_PER_TASK))
        .zip(d.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((g, u), d)| backward::silu_gated_backward(d, g, u));
}
