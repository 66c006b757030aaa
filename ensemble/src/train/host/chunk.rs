//! One chunk of a host training step: its rows, their gradient groups,
//! and its products with each group's LoRA update (forward and backward).

use std::collections::HashMap;
use std::ops::Range;

use privmix_models::Site;
use privmix_models::cpu::strided::{Mat, matmul};
use privmix_models::ops::attention_backward::CausalShape;
use rayon::prelude::*;

use super::pool::Pool;
use super::weights::{HostLinear, HostLlama, PROJECTIONS};
use crate::train::params::{LoraParams, SiteLayout};
use crate::train::trainable::{Dropout, dropout_mask};

/// One gradient group of a host step: `rows` consecutive blocks through one
/// adapter, with one dropout pass over them (its mask laid out over the
/// group's `[rows, seq, width]` as [`dropout_mask`] draws it), and one mean
/// loss and gradient.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group<'a> {
    /// The adapter of the group's rows.
    pub params: &'a LoraParams,
    /// How many consecutive blocks.
    pub rows: usize,
    /// The dropout pass (`None`, or one with `p > 0`).
    pub dropout: Option<Dropout>,
}

impl<'a> Group<'a> {
    /// A group of `rows` blocks through `params`; a pass with `p = 0` is none.
    pub fn new(params: &'a LoraParams, rows: usize, dropout: Option<Dropout>) -> Self {
        Self {
            params,
            rows,
            dropout: dropout.filter(|d| d.p > 0.0),
        }
    }
}

/// The rows of one group inside a chunk.
pub(super) struct Segment {
    /// Index into the step's groups.
    pub group: usize,
    /// The rows, counted in the chunk.
    pub rows: Range<usize>,
    /// The first row's index inside its group.
    pub group_row: usize,
}

/// What the forward pass keeps of one LoRA site for the backward pass.
pub(super) struct LoraSaved {
    /// The adapter's input after dropout (`None`: no dropout, the
    /// projection's input itself).
    pub dropped: Option<Vec<f32>>,
    /// The mask (with dropout).
    pub mask: Option<Vec<f32>>,
    /// `x̃ · A`, `[tokens, r]`.
    pub xa: Vec<f32>,
}

impl LoraSaved {
    pub(super) fn give(self, pool: &mut Pool) {
        pool.give(self.xa);
        for b in [self.dropped, self.mask].into_iter().flatten() {
            pool.give(b);
        }
    }
}

/// One chunk's shapes and groups.
pub(super) struct Ctx<'a> {
    pub m: &'a HostLlama,
    pub rows: usize,
    pub seq: usize,
    pub tokens: usize,
    pub r: usize,
    pub scale: f32,
    pub layouts: &'a HashMap<Site, SiteLayout>,
    pub groups: &'a [Group<'a>],
    pub segments: Vec<Segment>,
}

impl Ctx<'_> {
    /// The host projection of `site` (its frozen weights in host memory).
    ///
    /// # Panics
    /// Where `site` is not one of a Llama block's projections.
    pub(super) fn projection(&self, site: Site) -> &HostLinear {
        let at = PROJECTIONS
            .iter()
            .position(|&p| p == site.module)
            .expect("a Llama block's projection");
        &self.m.blocks[site.layer].proj[at]
    }

    /// Each segment's token range in the chunk.
    pub(super) fn tokens_of(&self, s: &Segment) -> Range<usize> {
        s.rows.start * self.seq..s.rows.end * self.seq
    }

    /// `out = input · W (+ bias)` for `out` sized `[tokens, fan_out]`: a
    /// frozen projection's product (the adapter's update is
    /// [`Ctx::lora_forward`]'s).
    pub(super) fn frozen(tokens: usize, lin: &HostLinear, input: &[f32], out: &mut [f32]) {
        matmul(
            out,
            tokens,
            lin.fan_out,
            lin.fan_in,
            false,
            1.0,
            Mat::rows(input, lin.fan_in),
            Mat::rows(&lin.w_t, lin.fan_out),
        );
        if let Some(bias) = &lin.bias {
            out.par_chunks_mut(lin.fan_out).for_each(|row| {
                for (y, b) in row.iter_mut().zip(bias) {
                    *y += b;
                }
            });
        }
    }

    /// Adds to `out` (the frozen product of `input`, [`Ctx::frozen`]) the
    /// adapter's `s · x̃ A B` at `site` when it has one, each segment's rows
    /// through its group's factors (returning what the backward pass
    /// needs).
    pub(super) fn lora_forward(
        &self,
        site: Site,
        input: &[f32],
        out: &mut [f32],
        pool: &mut Pool,
    ) -> Option<LoraSaved> {
        let n = self.tokens;
        let l = self.layouts.get(&site)?;
        let (fan_in, fan_out, r) = (l.fan_in, l.fan_out, self.r);
        let dropout = self
            .segments
            .iter()
            .any(|s| self.groups[s.group].dropout.is_some());
        let (dropped, mask) = if dropout {
            let mut mask = pool.take(0);
            for s in &self.segments {
                let len = s.rows.len() * self.seq * fan_in;
                match &self.groups[s.group].dropout {
                    Some(d) => {
                        let skip = s.group_row * self.seq * fan_in;
                        mask.extend_from_slice(&dropout_mask(d, l.site, skip + len)[skip..]);
                    }
                    None => mask.extend(std::iter::repeat_n(1.0, len)),
                }
            }
            let mut dropped = pool.take_for_overwrite(n * fan_in);
            for ((d, x), k) in dropped.iter_mut().zip(input).zip(&mask) {
                *d = x * k;
            }
            (Some(dropped), Some(mask))
        } else {
            (None, None)
        };
        let x_in = dropped.as_deref().unwrap_or(input);
        let mut xa = pool.take_for_overwrite(n * r);
        for s in &self.segments {
            let (a, b) = self.groups[s.group].params.factors(l);
            let t = self.tokens_of(s);
            matmul(
                &mut xa[t.start * r..t.end * r],
                t.len(),
                r,
                fan_in,
                false,
                1.0,
                Mat::rows(&x_in[t.start * fan_in..t.end * fan_in], fan_in),
                Mat::rows(a, r),
            );
            matmul(
                &mut out[t.start * fan_out..t.end * fan_out],
                t.len(),
                fan_out,
                r,
                true,
                self.scale,
                Mat::rows(&xa[t.start * r..t.end * r], r),
                Mat::rows(b, fan_out),
            );
        }
        Some(LoraSaved { dropped, mask, xa })
    }

    /// The adapters' gradients at `site` given `dy` (the gradient of the
    /// projection's output) and its input `input`, each segment's added to
    /// its group's gradient in `grads`; and, with `dx`, the adapters' part
    /// of the input gradient added to it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lora_backward(
        &self,
        site: Site,
        saved: &LoraSaved,
        input: &[f32],
        dy: &[f32],
        mut dx: Option<&mut [f32]>,
        grads: &mut [Vec<f32>],
        pool: &mut Pool,
    ) {
        let Some(l) = self.layouts.get(&site) else {
            return;
        };
        let (n, r, s) = (self.tokens, self.r, self.scale);
        let (fan_in, fan_out) = (l.fan_in, l.fan_out);
        let x_in = saved.dropped.as_deref().unwrap_or(input);
        let mut dxa = pool.take_for_overwrite(n * r);
        let mut through_a = match (&saved.mask, &dx) {
            (Some(_), Some(_)) => Some(pool.take_for_overwrite(n * fan_in)),
            _ => None,
        };
        for seg in &self.segments {
            let (a, b) = self.groups[seg.group].params.factors(l);
            let t = self.tokens_of(seg);
            let dy_t = &dy[t.start * fan_out..t.end * fan_out];
            let xa_t = &saved.xa[t.start * r..t.end * r];
            let x_t = &x_in[t.start * fan_in..t.end * fan_in];
            let dxa_t = &mut dxa[t.start * r..t.end * r];
            let (grad_a, grad_b) = grads[seg.group][l.a_offset..l.b_offset + r * fan_out]
                .split_at_mut(l.b_offset - l.a_offset);
            // dxa = s · dy Bᵀ beside dB = s · (x̃A)ᵀ dy, which does not read
            // it: dB's product, `r` rows, is one task, which so runs while
            // dxa's parts do rather than alone. Each product is the same
            // calls as one after the other, so the same bits.
            rayon::join(
                || {
                    matmul(
                        dxa_t,
                        t.len(),
                        r,
                        fan_out,
                        false,
                        s,
                        Mat::rows(dy_t, fan_out),
                        Mat::transposed(b, fan_out),
                    )
                },
                || {
                    matmul(
                        grad_b,
                        r,
                        fan_out,
                        t.len(),
                        true,
                        s,
                        Mat::transposed(xa_t, r),
                        Mat::rows(dy_t, fan_out),
                    )
                },
            );
            let dxa_t = &*dxa_t;
            // dA = x̃ᵀ dxa beside dx += dxa Aᵀ (masked with dropout).
            let target = match (&mut through_a, dx.as_deref_mut()) {
                (Some(tmp), _) => Some((&mut tmp[t.start * fan_in..t.end * fan_in], false)),
                (None, Some(dx)) => Some((&mut dx[t.start * fan_in..t.end * fan_in], true)),
                (None, None) => None,
            };
            rayon::join(
                || {
                    matmul(
                        grad_a,
                        fan_in,
                        r,
                        t.len(),
                        true,
                        1.0,
                        Mat::transposed(x_t, fan_in),
                        Mat::rows(dxa_t, r),
                    )
                },
                || {
                    if let Some((dst, accumulate)) = target {
                        matmul(
                            dst,
                            t.len(),
                            fan_in,
                            r,
                            accumulate,
                            1.0,
                            Mat::rows(dxa_t, r),
                            Mat::transposed(a, r),
                        );
                    }
                },
            );
        }
        if let (Some(tmp), Some(mask), Some(dx)) = (through_a, &saved.mask, dx) {
            for ((d, t), k) in dx.iter_mut().zip(&tmp).zip(mask) {
                *d += t * k;
            }
            pool.give(tmp);
        }
        pool.give(dxa);
    }

    /// `dx (+)= dy · Wᵀ` through a frozen projection (`dx` sized
    /// `[tokens, fan_in]`).
    pub(super) fn project_back(
        &self,
        lin: &HostLinear,
        dy: &[f32],
        dx: &mut [f32],
        accumulate: bool,
    ) {
        matmul(
            dx,
            self.tokens,
            lin.fan_in,
            lin.fan_out,
            accumulate,
            1.0,
            Mat::rows(dy, lin.fan_out),
            Mat::rows(lin.w.as_slice(), lin.fan_in),
        );
    }

    /// The chunk's attention shape.
    pub(super) fn attention_shape(&self) -> CausalShape {
        CausalShape {
            seq: self.seq,
            heads: self.m.heads,
            kv_heads: self.m.kv_heads,
            head_dim: self.m.head_dim,
        }
    }
}
