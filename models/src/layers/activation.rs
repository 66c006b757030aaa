//! Activation functions, written out so that each model names exactly the
//! variant its reference implementation uses.

use burn::tensor::{Tensor, backend::Backend};

/// SiLU (swish): `x · σ(x)`, Llama's MLP gate (HF `"silu"`).
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    // On plain burn-flex, vectorised in host memory (see `vexp`): burn-flex
    // takes each exponential through libm, one element at a time.
    #[cfg(feature = "flex")]
    if crate::runtime::is_plain_flex::<B>() {
        let (dims, device) = (x.shape(), x.device());
        if let Ok(mut v) = crate::runtime::to_vec(x.clone()) {
            crate::cpu::vexp::silu_in_place(&mut v);
            return Tensor::from_data(burn::tensor::TensorData::new(v, dims), &device);
        }
    }
    burn::tensor::activation::silu(x)
}

/// GELU with the tanh approximation,
/// `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`: HF
/// `"gelu_pytorch_tanh"` / `"gelu_new"`, used by Gemma's GeGLU and GPT-2.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    burn::tensor::activation::gelu_approximate(x)
}

/// Exact GELU, `x · Φ(x)` (HF `"gelu"`).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    burn::tensor::activation::gelu(x)
}

/// Soft-capping `cap · tanh(x / cap)` (Gemma 2 attention logits and final
/// logits): smooth, odd, and bounded by `cap` in absolute value.
pub fn soft_cap<B: Backend, const D: usize>(x: Tensor<B, D>, cap: f64) -> Tensor<B, D> {
    (x / cap).tanh() * cap
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn gelu_tanh_matches_the_formula() {
        let xs = [-3.0f32, -0.5, 0.0, 0.7, 2.5];
        let t = Tensor::<Flex, 1>::from_floats(xs, &Default::default());
        let got = gelu_tanh(t).into_data().to_vec::<f32>().unwrap();
        for (x, g) in xs.iter().zip(got) {
            let x = f64::from(*x);
            let want = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            assert!((f64::from(g) - want).abs() < 1e-6, "{x}: {g} vs {want}");
        }
    }

    #[test]
    fn soft_cap_bounds_and_is_near_identity_for_small_inputs() {
        let t = Tensor::<Flex, 1>::from_floats([-100.0f32, 1e-3, 100.0], &Default::default());
        let got = soft_cap(t, 2.0).into_data().to_vec::<f32>().unwrap();
        assert!(got[0] >= -2.0 && got[0] < -1.99);
        assert!((got[1] - 1e-3).abs() < 1e-8);
        assert!(got[2] <= 2.0 && got[2] > 1.99);
    }
}
