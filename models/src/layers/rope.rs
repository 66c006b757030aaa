//! Rotary position embeddings (Su et al. 2021, "RoFormer").
//!
//! Dimension pairs `(a, b)` of each head are rotated by the angle
//! `position · inv_freq[i]`, `inv_freq[i] = θ^(-2i/d)`. Two pairings exist:
//! - [`RopeStyle::RotateHalf`] pairs `(i, i + d/2)`: Hugging Face's
//!   `rotate_half` (and llama.cpp's "NEOX" mode);
//! - [`RopeStyle::Interleaved`] pairs `(2i, 2i + 1)`: the original Meta
//!   Llama code and llama.cpp's "NORM" mode, which is why llama.cpp's
//!   converter permutes the rows of HF Llama Q/K weights.
//!
//! Angles are computed as in HF transformers: `inv_freq` and the product
//! `inv_freq · position` in f32, then `cos`/`sin` in f32.

use burn::tensor::{Tensor, TensorData, backend::Backend};

/// How rotation pairs are laid out inside a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)` (HF `rotate_half`).
    RotateHalf,
    /// Pairs `(2i, 2i + 1)` (Meta / llama.cpp "NORM").
    Interleaved,
}

/// Frequency scaling for context extension.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation: every `inv_freq` divided by `factor` (HF `"linear"`).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1 frequency-dependent scaling (HF `_compute_llama3_parameters`):
    /// long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        /// Divisor for low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Pre-training context length.
        original_max_position_embeddings: f64,
    },
}

/// Inverse frequencies of a RoPE with base `theta` over `dim` rotary dimensions.
pub fn inv_freq(theta: f64, dim: usize, scaling: RopeScaling) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
            let expo = (2 * i) as f32 / dim as f32;
            let f = (1.0 / theta.powf(f64::from(expo))) as f32;
            match scaling {
                RopeScaling::None => f,
                RopeScaling::Linear { factor } => (f64::from(f) / factor) as f32,
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: old,
                } => {
                    let f = f64::from(f);
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let low_wavelen = old / low_freq_factor;
                    let high_wavelen = old / high_freq_factor;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    if wavelen < high_wavelen || wavelen > low_wavelen {
                        scaled as f32
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    }
                }
            }
        })
        .collect()
}

/// A rotary embedding: inverse frequencies and the pairing style.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

/// `cos` and `sin` tables for one forward step, `[batch, 1, seq, head_dim]`,
/// laid out for the rope's style.
#[derive(Debug, Clone)]
pub struct RopeAngles<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    style: RopeStyle,
    /// The same tables in host memory, `[batch, seq, head_dim]`, for
    /// `RopeAngles::apply_host` (plain burn-flex only).
    #[cfg_attr(not(feature = "flex"), allow(dead_code))]
    host: std::sync::Arc<(Vec<f32>, Vec<f32>)>,
}

impl Rope {
    /// A rope over `head_dim` dimensions (even) with base `theta`.
    pub fn new(theta: f64, head_dim: usize, scaling: RopeScaling, style: RopeStyle) -> Self {
        Self {
            inv_freq: inv_freq(theta, head_dim, scaling),
            style,
        }
    }

    /// Angle tables for `positions[row][i]` (all rows the same length).
    pub fn angles<B: Backend>(
        &self,
        positions: &[Vec<usize>],
        device: &B::Device,
    ) -> RopeAngles<B> {
        let d = 2 * self.inv_freq.len();
        let b = positions.len();
        let s = positions.first().map_or(0, Vec::len);
        let (cos, sin) = self.host_tables(positions.iter().flatten().copied());
        let shape = [b, 1, s, d];
        RopeAngles {
            cos: Tensor::from_data(TensorData::new(cos.clone(), shape), device),
            sin: Tensor::from_data(TensorData::new(sin.clone(), shape), device),
            style: self.style,
            host: std::sync::Arc::new((cos, sin)),
        }
    }
}

impl Rope {
    /// The pairing style.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// The rotated dimensions per head.
    pub fn head_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// `cos` and `sin` tables in host memory, `head_dim` entries per
    /// position of `positions` in turn, laid out for the style (the values
    /// [`Rope::angles`] puts in its tensors; [`rotate_host`] reads them).
    pub fn host_tables(&self, positions: impl IntoIterator<Item = usize>) -> (Vec<f32>, Vec<f32>) {
        let d = self.head_dim();
        let positions = positions.into_iter();
        let mut cos = Vec::with_capacity(positions.size_hint().0 * d);
        let mut sin = Vec::with_capacity(positions.size_hint().0 * d);
        for p in positions {
            let angle: Vec<f32> = self.inv_freq.iter().map(|f| f * p as f32).collect();
            match self.style {
                RopeStyle::RotateHalf => {
                    for _ in 0..2 {
                        cos.extend(angle.iter().map(|a| a.cos()));
                        sin.extend(angle.iter().map(|a| a.sin()));
                    }
                }
                RopeStyle::Interleaved => {
                    for a in &angle {
                        cos.extend([a.cos(), a.cos()]);
                        sin.extend([a.sin(), a.sin()]);
                    }
                }
            }
        }
        (cos, sin)
    }
}

/// Where the partner of rotation pair `p` lies: pair `p` is
/// `(stride · p, stride · p + partner)`.
pub(crate) fn pairing(style: RopeStyle, head_dim: usize) -> (usize, usize) {
    match style {
        RopeStyle::RotateHalf => (1, head_dim / 2),
        RopeStyle::Interleaved => (2, 1),
    }
}

/// Rotates every head of `x` in place, in host memory: `x` holds
/// `head_dim`-wide heads, `heads` per token, token `i` rotated by the
/// tables' position `first + i` ([`Rope::host_tables`]); each pair
/// `(a, b)` becomes `(a·cos − b·sin, b·cos + a·sin)`. The kernel of the
/// decode path's host rotation (`RopeAngles::apply_host`); its backward
/// pass (the rotation by the opposite angle) is
/// `privmix_models::ops::backward::rotate_host_backward`.
pub fn rotate_host(
    x: &mut [f32],
    heads: usize,
    (cos, sin): (&[f32], &[f32]),
    head_dim: usize,
    first: usize,
    style: RopeStyle,
) {
    // (a, b) -> (a·cos − b·sin, b·cos + a·sin), as x·cos + rot·sin with rot = (−b, a).
    for_each_pair(
        x,
        heads,
        (cos, sin),
        head_dim,
        first,
        style,
        |a, b, c, s| (a * c.0 + -b * s.0, b * c.1 + a * s.1),
    );
}

/// Replaces each rotated pair `(a, b)` of every head of `x` (laid out as
/// [`rotate_host`]'s) by `pair(a, b, (cos_lo, cos_hi), (sin_lo, sin_hi))`, the table
/// entries at the pair's two places: the walk over heads, positions and pairings that
/// the rotation and its backward pass share.
pub(crate) fn for_each_pair(
    x: &mut [f32],
    heads: usize,
    (cos, sin): (&[f32], &[f32]),
    head_dim: usize,
    first: usize,
    style: RopeStyle,
    mut pair: impl FnMut(f32, f32, (f32, f32), (f32, f32)) -> (f32, f32),
) {
    let d = head_dim;
    let (stride, partner) = pairing(style, d);
    for (at, head) in x.chunks_exact_mut(d).enumerate() {
        let table = (first + at / heads) * d;
        let (c, s) = (&cos[table..table + d], &sin[table..table + d]);
        for p in 0..d / 2 {
            let (lo, hi) = (stride * p, stride * p + partner);
            (head[lo], head[hi]) = pair(head[lo], head[hi], (c[lo], c[hi]), (s[lo], s[hi]));
        }
    }
}

impl<B: Backend> RopeAngles<B> {
    /// Rotates `x` (`[batch, heads, seq, head_dim]`).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let rotated = self.rotate_pairs(x.clone());
        x * self.cos.clone() + rotated * self.sin.clone()
    }

    /// [`RopeAngles::apply_seq_major`] in host memory, in place, on `x`
    /// laid out `[batch, seq, heads, head_dim]` (row-major): the same f32
    /// products and sums of the same values, so the same bits (tested).
    ///
    /// Why: on plain burn-flex the decode path reads the rotated queries and
    /// keys into host memory anyway (`KvCache::attend`); rotating them there
    /// saves the tensor path's dozen ops per layer, each of which copies
    /// its operands (at N = 8, nine rows of them).
    #[cfg(feature = "flex")]
    pub(crate) fn apply_host(&self, x: &mut [f32], heads: usize) {
        self.apply_host_from(x, 0, heads);
    }

    /// [`RopeAngles::apply_host`] of the tokens `first..` of the step
    /// (token `i` of row `r` is `r · seq + i`) that `x` holds.
    #[cfg(feature = "flex")]
    pub(crate) fn apply_host_from(&self, x: &mut [f32], first: usize, heads: usize) {
        let (cos, sin) = &*self.host;
        let d = self.cos.dims()[3];
        let positions = cos.len() / d.max(1);
        debug_assert!(x.len() <= (positions - first.min(positions)) * heads * d);
        rotate_host(x, heads, (cos, sin), d, first, self.style);
    }

    /// Rotates `x` laid out `[batch, seq, heads, head_dim]` (a projection's
    /// output as reshaped, before heads are moved forward); the same values
    /// as [`RopeAngles::apply`] on the swapped layout.
    ///
    /// Why: the tables are repeated over the heads first, so both products
    /// are between contiguous tensors of one shape. burn-flex has SIMD paths
    /// for that, but a broadcast over a middle (heads) axis, or a permuted
    /// operand, falls back to element-by-element strided iteration, about a
    /// hundred times slower on a 32-token prefill.
    pub fn apply_seq_major(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, s, h, d] = x.dims();
        // `[b, 1, s, d]` and `[b, s, 1, d]` list the same values in the same order.
        let per_head = |t: &Tensor<B, 4>| t.clone().reshape([b, s, 1, d]).repeat_dim(2, h);
        let rotated = self.rotate_pairs(x.clone());
        x * per_head(&self.cos) + rotated * per_head(&self.sin)
    }

    /// `(a, b) → (−b, a)` for every rotation pair of the last axis.
    fn rotate_pairs(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [n0, n1, n2, d] = x.dims();
        match self.style {
            RopeStyle::RotateHalf => {
                let x1 = x.clone().narrow(3, 0, d / 2);
                let x2 = x.narrow(3, d / 2, d / 2);
                Tensor::cat(vec![x2.neg(), x1], 3)
            }
            RopeStyle::Interleaved => {
                let pairs = x.reshape([n0, n1, n2, d / 2, 2]);
                let even = pairs.clone().narrow(4, 0, 1);
                let odd = pairs.narrow(4, 1, 1);
                Tensor::cat(vec![odd.neg(), even], 4).reshape([n0, n1, n2, d])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// llama.cpp's `permute` of one head's rows: HF row `c·d/2 + j` goes to `2j + c`.
    fn to_interleaved(v: &[f32], d: usize) -> Vec<f32> {
        let mut out = vec![0.0; v.len()];
        for (head, chunk) in v.chunks(d).enumerate() {
            for c in 0..2 {
                for j in 0..d / 2 {
                    out[head * d + 2 * j + c] = chunk[c * d / 2 + j];
                }
            }
        }
        out
    }

    #[test]
    fn interleaved_on_permuted_heads_equals_rotate_half() {
        let dev = Default::default();
        let (h, s, d) = (2, 3, 8);
        let x: Vec<f32> = (0..h * s * d)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let positions = vec![vec![0, 5, 17]];
        let half = Rope::new(10_000.0, d, RopeScaling::None, RopeStyle::RotateHalf);
        let inter = Rope::new(10_000.0, d, RopeScaling::None, RopeStyle::Interleaved);
        let xt = Tensor::<Flex, 4>::from_data(TensorData::new(x.clone(), [1, h, s, d]), &dev);
        let y = half.angles::<Flex>(&positions, &dev).apply(xt);
        let xp = to_interleaved(&x, d);
        let xpt = Tensor::<Flex, 4>::from_data(TensorData::new(xp, [1, h, s, d]), &dev);
        let yp = inter.angles::<Flex>(&positions, &dev).apply(xpt);
        let want = to_interleaved(&y.into_data().to_vec::<f32>().unwrap(), d);
        let got = yp.into_data().to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn seq_major_and_host_layouts_give_the_same_values() {
        let dev = Default::default();
        let (b, h, s, d) = (2, 3, 4, 8);
        let x: Vec<f32> = (0..b * h * s * d)
            .map(|i| ((i * 29 % 13) as f32 - 6.0) / 4.0)
            .collect();
        let positions = vec![vec![0, 1, 2, 3], vec![0, 0, 7, 9]];
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            let angles =
                Rope::new(10_000.0, d, RopeScaling::None, style).angles::<Flex>(&positions, &dev);
            let xs = Tensor::<Flex, 4>::from_data(TensorData::new(x.clone(), [b, s, h, d]), &dev);
            let want = angles.apply(xs.clone().swap_dims(1, 2));
            let seq_major = angles.apply_seq_major(xs);
            let mut host = x.clone();
            angles.apply_host(&mut host, h);
            assert_eq!(seq_major.clone().into_data().to_vec::<f32>().unwrap(), host);
            let got = seq_major.swap_dims(1, 2);
            // Same products and sums of the same f32 values: bit-identical.
            assert_eq!(
                got.into_data().to_vec::<f32>().unwrap(),
                want.into_data().to_vec::<f32>().unwrap()
            );
        }
    }

    #[test]
    fn rotation_preserves_pair_norms_and_position_zero_is_identity() {
        let dev = Default::default();
        let rope = Rope::new(10_000.0, 4, RopeScaling::None, RopeStyle::RotateHalf);
        let x = Tensor::<Flex, 4>::from_data(
            TensorData::new(
                vec![1.0f32, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0],
                [1, 1, 2, 4],
            ),
            &dev,
        );
        let y = rope
            .angles::<Flex>(&[vec![0, 3]], &dev)
            .apply(x)
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(&y[..4], &[1.0, 2.0, 3.0, 4.0]);
        let n = |a: f32, b: f32| a * a + b * b;
        assert!((n(y[4], y[6]) - n(1.0, 3.0)).abs() < 1e-5);
        assert!((n(y[5], y[7]) - n(2.0, 4.0)).abs() < 1e-5);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let plain = inv_freq(500_000.0, 16, RopeScaling::None);
        let scaled = inv_freq(500_000.0, 16, scaling);
        assert_eq!(plain[0], scaled[0]); // wavelength 2π < 16: kept
        let last = plain.len() - 1; // wavelength ≫ 64: divided by 8
        assert!((scaled[last] - plain[last] / 8.0).abs() <= 1e-7 * plain[last]);
    }
}
