//! GPT-2 through the runtime like every other model: cached decoding equals
//! the full forward, rows padded on the left or the right (and decoded past
//! their padding) equal each row alone — learned positions are taken from
//! each row's real tokens, padding takes none — the context limit of
//! `n_positions` gives a typed error without touching the cache, the LoRA
//! hook sees GPT-2's four projection sites, and under `Autodiff<Flex>` an
//! adapter on `c_attn` gets the right gradient (central difference) while
//! the base weights get none. The full forward itself is
//! checked against transformers in `gpt2_hf_logits.rs`.

use crate::runtime_support;

use privmix_models::runtime::to_vec;
use privmix_models::{
    Batch, LanguageModel, LinearDelta, LoadOptions, Model, ModelError, Projection, Site,
};
use runtime_support::{B, load_hf, max_abs_diff, reference};

use burn::tensor::{Tensor, TensorData};
use std::sync::Mutex;

/// Tolerance between two f32 computations of the same logits that differ
/// only in how rows are batched or cached: the per-row arithmetic is the
/// same up to summation order over masked (exactly zero-weight) slots, so
/// differences stay at f32 rounding of O(1) values, ~1e-6.
const TOL: f32 = 1e-5;

/// Logits of `tokens` alone, every position, flattened.
fn alone(model: &Model<B>, tokens: &[u32]) -> Vec<f32> {
    to_vec(model.logits_all(&Batch::single(tokens).unwrap()).unwrap()).unwrap()
}

#[test]
fn cached_decode_equals_full_forward() {
    let model = load_hf("gpt2");
    let tokens = reference("gpt2").input_ids[0].clone();
    let vocab = model.vocab_size();
    let full = alone(&model, &tokens);
    let mut cache = model.new_cache(1);
    let pre = to_vec(
        model
            .forward(&Batch::single(&tokens[..5]).unwrap(), &mut cache, None)
            .unwrap(),
    )
    .unwrap();
    let mut worst = max_abs_diff(&pre, &full[..5 * vocab]);
    for (i, &t) in tokens.iter().enumerate().skip(5) {
        let step = to_vec(
            model
                .logits_last(&Batch::single(&[t]).unwrap(), &mut cache, None)
                .unwrap(),
        )
        .unwrap();
        worst = worst.max(max_abs_diff(&step, &full[i * vocab..(i + 1) * vocab]));
    }
    assert_eq!(cache.slots(), tokens.len());
    println!("gpt2: cached decode max |Δ| {worst:e}");
    assert!(worst <= TOL, "{worst}");
}

/// Rows of lengths 12 and 7 padded (left or right), prefilled together, then
/// three decode steps for both rows: each row's logits equal the row alone.
fn padded_batch_then_decode(left: bool) -> f32 {
    let model = load_hf("gpt2");
    let ids = reference("gpt2").input_ids;
    let rows = vec![ids[0].clone(), ids[1][..7].to_vec()];
    let next = [[5u32, 6, 7], [8, 9, 10]];
    let batch = if left {
        Batch::left_padded(&rows, 0)
    } else {
        Batch::right_padded(&rows, 0)
    }
    .unwrap();
    let vocab = model.vocab_size();
    let mut cache = model.new_cache(2);
    let logits = to_vec(model.forward(&batch, &mut cache, None).unwrap()).unwrap();
    let mut worst: f32 = 0.0;
    for (r, row) in rows.iter().enumerate() {
        let want = alone(&model, row);
        let real: Vec<usize> = (0..batch.len()).filter(|&i| batch.is_real(r, i)).collect();
        assert_eq!(real.len(), row.len());
        for (k, &i) in real.iter().enumerate() {
            let got = &logits[(r * batch.len() + i) * vocab..][..vocab];
            worst = worst.max(max_abs_diff(got, &want[k * vocab..(k + 1) * vocab]));
        }
    }
    for step in 0..3 {
        let b = Batch::new(&[vec![next[0][step]], vec![next[1][step]]]).unwrap();
        let got = to_vec(model.logits_last(&b, &mut cache, None).unwrap()).unwrap();
        for (r, row) in rows.iter().enumerate() {
            let mut full_row = row.clone();
            full_row.extend(&next[r][..=step]);
            let want = alone(&model, &full_row);
            let last = full_row.len() - 1;
            worst = worst.max(max_abs_diff(
                &got[r * vocab..(r + 1) * vocab],
                &want[last * vocab..],
            ));
        }
    }
    let side = if left { "left" } else { "right" };
    println!("gpt2 ({side}-padded): max |Δ| vs rows alone {worst:e}");
    assert!(worst <= TOL, "{side}: {worst}");
    worst
}

#[test]
fn left_padded_batch_and_decode_equal_rows_alone() {
    padded_batch_then_decode(true);
}

#[test]
fn right_padded_batch_and_decode_equal_rows_alone() {
    padded_batch_then_decode(false);
}

#[test]
fn positions_matter() {
    // The same token at two positions gives different logits: the learned
    // positions are used (so the padding tests above can fail).
    let model = load_hf("gpt2");
    let vocab = model.vocab_size();
    let two = alone(&model, &[7, 7]);
    assert!(max_abs_diff(&two[..vocab], &two[vocab..]) > 1e-2);
}

#[test]
fn context_longer_than_n_positions_is_a_typed_error() {
    let model = load_hf("gpt2");
    let Model::Gpt2(g) = &model else {
        panic!("not GPT-2")
    };
    let n = g.config.n_positions;
    let too_long = vec![3u32; n + 1];
    assert!(matches!(
        model.logits_all(&Batch::single(&too_long).unwrap()),
        Err(ModelError::BadInput(_))
    ));
    // Filling the context exactly works; one more token is refused and
    // leaves the cache as it was, so the row can still be used.
    let mut cache = model.new_cache(2);
    let rows = vec![vec![3u32; n], vec![4u32; 2]];
    model
        .forward(&Batch::right_padded(&rows, 0).unwrap(), &mut cache, None)
        .unwrap();
    let slots = cache.slots();
    let step = Batch::new(&[vec![5], vec![6]]).unwrap();
    assert!(matches!(
        model.forward(&step, &mut cache, None),
        Err(ModelError::BadInput(_))
    ));
    assert_eq!(cache.slots(), slots);
    // Row 0 pads while row 1 goes on: allowed, and row 1 equals itself alone.
    let step = Batch::from_parts(&[vec![0], vec![6]], &[vec![false], vec![true]]).unwrap();
    let got = to_vec(model.forward(&step, &mut cache, None).unwrap()).unwrap();
    let vocab = model.vocab_size();
    let want = alone(&model, &[4, 4, 6]);
    assert!(max_abs_diff(&got[vocab..], &want[2 * vocab..]) <= TOL);
}

/// Records every site and input width it is asked about, and adds `shift` to
/// `shift · j / 64` to output `j` of [`Projection::MlpCProj`] of layer 1.
struct Recorder {
    seen: Mutex<Vec<(Site, usize)>>,
    shift: f32,
}

impl LinearDelta<B> for Recorder {
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        let [b, s, i] = x.dims();
        self.seen.lock().unwrap().push((site, i));
        let target = Site {
            layer: 1,
            module: Projection::MlpCProj,
        };
        // Not a constant: the final LayerNorm would cancel a uniform shift.
        let ramp: Vec<f32> = (0..b * s * 64)
            .map(|j| self.shift * (j % 64) as f32 / 64.0)
            .collect();
        (site == target).then(|| Tensor::from_data(TensorData::new(ramp, [b, s, 64]), &x.device()))
    }
}

#[test]
fn lora_hook_sees_the_four_gpt2_sites() {
    let model = load_hf("gpt2");
    let tokens = &reference("gpt2").input_ids[0];
    let batch = Batch::single(tokens).unwrap();
    let base = to_vec(model.logits_all(&batch).unwrap()).unwrap();
    let run = |shift| {
        let rec = Recorder {
            seen: Mutex::new(Vec::new()),
            shift,
        };
        let mut cache = model.new_cache(1);
        let out = to_vec(model.forward(&batch, &mut cache, Some(&rec)).unwrap()).unwrap();
        (out, rec.seen.into_inner().unwrap())
    };
    let (zero, seen) = run(0.0);
    assert_eq!(zero, base, "a zero delta changes nothing");
    let want: Vec<(Site, usize)> = (0..2)
        .flat_map(|layer| {
            [
                (Projection::CAttn, 64),
                (Projection::CProj, 64),
                (Projection::CFc, 64),
                (Projection::MlpCProj, 128),
            ]
            .map(|(module, width)| (Site { layer, module }, width))
        })
        .collect();
    assert_eq!(seen, want);
    let (shifted, _) = run(0.5);
    assert!(max_abs_diff(&shifted, &base) > 1e-2, "the delta is added");
}

type AB = burn::backend::Autodiff<burn::backend::Flex>;

/// A rank-2 adapter `Δ(x) = x A B` on layer 0's fused `c_attn` (64 → 192).
struct CAttnLora {
    a: Tensor<AB, 2>,
    b: Tensor<AB, 2>,
}

impl LinearDelta<AB> for CAttnLora {
    fn delta(&self, site: Site, x: &Tensor<AB, 3>) -> Option<Tensor<AB, 3>> {
        if site
            != (Site {
                layer: 0,
                module: Projection::CAttn,
            })
        {
            return None;
        }
        let [batch, seq, width] = x.dims();
        Some(
            x.clone()
                .reshape([batch * seq, width])
                .matmul(self.a.clone())
                .matmul(self.b.clone())
                .reshape([batch, seq, 192]),
        )
    }
}

fn param(n: usize, seed: usize, shape: [usize; 2]) -> Tensor<AB, 2> {
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.2)
        .collect();
    Tensor::from_data(TensorData::new(v, shape), &Default::default()).require_grad()
}

/// Sum of the logits at the last position (enough to differentiate).
fn last_logits_sum(model: &Model<AB>, tokens: &[u32], lora: &CAttnLora) -> f32 {
    let mut cache = model.new_cache(1);
    let out = model
        .logits_last(&Batch::single(tokens).unwrap(), &mut cache, Some(lora))
        .unwrap();
    to_vec(out.sum()).unwrap()[0]
}

#[test]
fn lora_on_c_attn_trains_under_autodiff_with_frozen_base() {
    let model = Model::<AB>::load(LoadOptions::path(
        runtime_support::fixture("hf/gpt2"),
        &Default::default(),
    ))
    .unwrap();
    let tokens = reference("gpt2").input_ids[0][..6].to_vec();
    let lora = CAttnLora {
        a: param(64 * 2, 1, [64, 2]),
        b: param(2 * 192, 2, [2, 192]),
    };
    let mut cache = model.new_cache(1);
    let loss = model
        .logits_last(&Batch::single(&tokens).unwrap(), &mut cache, Some(&lora))
        .unwrap()
        .sum();
    let grads = loss.backward();
    let gb = to_vec(lora.b.grad(&grads).expect("no gradient on B")).unwrap();
    assert!(gb.iter().all(|x| x.is_finite()) && gb.iter().any(|&x| x != 0.0));
    let Model::Gpt2(g) = &model else {
        panic!("not GPT-2")
    };
    assert!(
        g.wte().grad(&grads).is_none()
            && g.wpe()
                .expect("GPT-2 has learned positions")
                .grad(&grads)
                .is_none()
    );
    for module in [
        Projection::CAttn,
        Projection::CProj,
        Projection::CFc,
        Projection::MlpCProj,
    ] {
        let lin = g.projection(Site { layer: 0, module }).unwrap();
        assert!(lin.weight_t().grad(&grads).is_none(), "{module:?}");
    }
    // The gradient is the derivative: central difference on the entry of B
    // with the largest gradient. Step 1e-2 on an O(0.1) weight: the f32
    // rounding of the difference quotient is ~1e-4 relative, the truncation
    // error O(h²) of a smooth network; 2% bounds both.
    let (k, gk) = gb
        .iter()
        .enumerate()
        .fold((0, 0.0f32), |(bi, bv), (i, &v)| {
            if v.abs() > bv.abs() { (i, v) } else { (bi, bv) }
        });
    let h = 1e-2f32;
    let at = |d: f32| {
        let mut b = to_vec(lora.b.clone()).unwrap();
        b[k] += d;
        let moved = CAttnLora {
            a: lora.a.clone(),
            b: Tensor::from_data(TensorData::new(b, [2, 192]), &Default::default()),
        };
        last_logits_sum(&model, &tokens, &moved)
    };
    let fd = (at(h) - at(-h)) / (2.0 * h);
    println!("dL/dB[{k}]: autodiff {gk}, central difference {fd}");
    assert!(
        (fd - gk).abs() <= 0.02 * gk.abs().max(1e-3),
        "autodiff {gk} vs finite difference {fd}"
    );
}
