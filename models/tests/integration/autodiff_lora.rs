//! The LoRA hook under autodiff: with `B = Autodiff<Flex>`, a loss backward
//! through a [`LinearDelta`] gives gradients on the adapter's tensors (checked
//! against a central finite difference) and none on the frozen base weights.

use crate::runtime_support;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use privmix_models::runtime::to_vec;
use privmix_models::{
    Batch, LanguageModel, LinearDelta, LoadOptions, Model, Projection, Site, log_softmax,
};
use runtime_support::{fixture, reference};

type AB = Autodiff<Flex>;

/// A rank-2 adapter on layer 0's query and value projections:
/// `Δ(x) = x A_m B_m`.
struct Lora {
    q: (Tensor<AB, 2>, Tensor<AB, 2>),
    v: (Tensor<AB, 2>, Tensor<AB, 2>),
}

impl LinearDelta<AB> for Lora {
    fn delta(&self, site: Site, x: &Tensor<AB, 3>) -> Option<Tensor<AB, 3>> {
        let (a, b) = match (site.layer, site.module) {
            (0, Projection::Q) => &self.q,
            (0, Projection::V) => &self.v,
            _ => return None,
        };
        let [batch, seq, width] = x.dims();
        let out = b.dims()[1];
        Some(
            x.clone()
                .reshape([batch * seq, width])
                .matmul(a.clone())
                .matmul(b.clone())
                .reshape([batch, seq, out]),
        )
    }
}

fn param(values: Vec<f32>, shape: [usize; 2]) -> Tensor<AB, 2> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default()).require_grad()
}

fn pseudo_random(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.2)
        .collect()
}

/// Sum of the log-probabilities of each next token (a language-model loss).
fn log_likelihood(model: &Model<AB>, tokens: &[u32], lora: &Lora) -> Tensor<AB, 1> {
    let batch = Batch::single(&tokens[..tokens.len() - 1]).unwrap();
    let mut cache = model.new_cache(1);
    let lp = log_softmax(model.forward(&batch, &mut cache, Some(lora)).unwrap());
    let targets: Vec<i64> = tokens[1..].iter().map(|&t| i64::from(t)).collect();
    let n = targets.len();
    let idx = Tensor::<AB, 3, burn::tensor::Int>::from_data(
        TensorData::new(targets, [1, n, 1]),
        &Default::default(),
    );
    lp.gather(2, idx).sum().reshape([1])
}

#[test]
fn adapter_gets_gradients_and_base_weights_stay_frozen() {
    let model =
        Model::<AB>::load(LoadOptions::path(fixture("hf/llama"), &Default::default())).unwrap();
    let tokens = reference("llama").input_ids[0].clone();
    // Layer 0: hidden 64, q out 64, v out 32 (2 kv heads × 16).
    let lora = Lora {
        q: (
            param(pseudo_random(64 * 2, 1), [64, 2]),
            param(pseudo_random(2 * 64, 2), [2, 64]),
        ),
        v: (
            param(pseudo_random(64 * 2, 3), [64, 2]),
            param(pseudo_random(2 * 32, 4), [2, 32]),
        ),
    };
    let loss = log_likelihood(&model, &tokens, &lora);
    let grads = loss.backward();
    for (name, t) in [
        ("qA", &lora.q.0),
        ("qB", &lora.q.1),
        ("vA", &lora.v.0),
        ("vB", &lora.v.1),
    ] {
        let g = to_vec(
            t.grad(&grads)
                .unwrap_or_else(|| panic!("{name}: no gradient")),
        )
        .unwrap();
        assert!(
            g.iter().all(|x| x.is_finite()) && g.iter().any(|&x| x != 0.0),
            "{name}: {g:?}"
        );
    }
    let Model::Llama(llama) = &model else {
        panic!("not llama")
    };
    assert!(
        llama.embed_tokens().grad(&grads).is_none(),
        "embedding got a gradient"
    );
    for layer in 0..2 {
        let attn = llama.attention(layer).unwrap();
        let [q, k, v] = attn.separate_qkv().unwrap();
        for lin in [q, k, v, &attn.o_proj] {
            assert!(
                lin.weight_t().grad(&grads).is_none(),
                "layer {layer}: base weight got a gradient"
            );
        }
    }

    // The gradient is the derivative: central difference on the entry of
    // q's B with the largest gradient.
    let g = to_vec(lora.q.1.grad(&grads).unwrap()).unwrap();
    let (k, gk) = g.iter().enumerate().fold((0, 0.0f32), |(bi, bv), (i, &v)| {
        if v.abs() > bv.abs() { (i, v) } else { (bi, bv) }
    });
    let h = 1e-2f32;
    let at = |delta: f32| {
        let mut b = pseudo_random(2 * 64, 2);
        b[k] += delta;
        let l = Lora {
            q: (lora.q.0.clone(), param(b, [2, 64])),
            v: lora.v.clone(),
        };
        to_vec(log_likelihood(&model, &tokens, &l)).unwrap()[0]
    };
    let fd = (at(h) - at(-h)) / (2.0 * h);
    println!("dL/dB[{k}]: autodiff {gk}, central difference {fd}");
    assert!(
        (fd - gk).abs() <= 0.02 * gk.abs().max(1e-3),
        "autodiff {gk} vs finite difference {fd}"
    );
}
