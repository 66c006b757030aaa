//! Members' factors held in f16 (`FactorPrecision::F16`): each row equals
//! its member alone with the member's factors rounded to f16 (host-held on
//! plain flex, f32 safetensors and Q8_0 GGUF alike; tensors on
//! `Autodiff<Flex>`), the rounding really happens and moves the log-probs
//! by little, and a factor beyond f16's range is a typed error. With an f16
//! KV cache too (`KvPrecision::F16`), each row equals its rounded member
//! alone through an f16 cache of its own.

use crate::lora_support;

use burn::backend::{Autodiff, Flex};
use lora_support::*;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig, LoraError};
use privmix_ensemble::rows::{LogProbRows, RowLayout};
use privmix_ensemble::runner::{EnsembleError, EnsembleRunner};
use privmix_ensemble::stacked::FactorPrecision;
use privmix_models::ModelBackend;
use privmix_models::runtime::to_vec;
use privmix_models::{
    Batch, KvPrecision, LanguageModel, LinearDelta, LoadOptions, Model, log_softmax,
};

const TOL: f32 = 1e-4;

/// Three members: PEFT fixtures (plain and rsLoRA scaling) and a random
/// rank-3 adapter on five projections.
fn members<B: ModelBackend>(model: &Model<B>, device: &B::Device) -> Vec<LoraAdapter<B>> {
    let base = model.base_shapes().unwrap();
    let c = LoraConfig::new(
        3,
        6.0,
        &["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    .unwrap();
    let peft = |name: &str| LoraAdapter::<B>::load_peft(peft_dir(name), &base, device).unwrap();
    vec![
        peft("full"),
        peft("rslora"),
        LoraAdapter::random(c, &base, 0.1, 7, device).unwrap(),
    ]
}

/// `m` with its scale folded into `B` (as stacking folds it, in f32) and
/// every entry rounded to the nearest f16, and a scale of exactly 1: the
/// adapter that f16-held factors apply.
fn rounded_twin<B: ModelBackend>(
    m: &LoraAdapter<B>,
    model: &Model<B>,
    device: &B::Device,
) -> LoraAdapter<B> {
    let round = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect()
    };
    let mut config = m.config().clone();
    config.lora_alpha = config.r as f64;
    config.use_rslora = false;
    let factors = m
        .sites()
        .into_iter()
        .map(|site| {
            let f = m.factors(site).unwrap();
            let a = round(to_vec(f.a.clone()).unwrap());
            let b = round(to_vec(f.b.clone().mul_scalar(m.scale())).unwrap());
            (site, a, b)
        })
        .collect();
    LoraAdapter::from_host(config, factors, &model.base_shapes().unwrap(), device).unwrap()
}

/// Prefill of two contexts' rows then two steps, public row first.
fn decode<B: ModelBackend>(
    model: &Model<B>,
    members: &[LoraAdapter<B>],
    precision: FactorPrecision,
) -> Vec<LogProbRows> {
    let runner = EnsembleRunner::with_precision(model.clone(), members, precision).unwrap();
    let mut dec = runner
        .decoder(RowLayout::public_and_members(members.len()))
        .unwrap();
    let contexts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99, 3, 250, 8, 41],
        vec![9, 8, 7, 6, 5],
        vec![100, 101, 102, 103],
        vec![42, 43, 44, 45, 46, 47, 48, 49],
    ];
    let mut out = vec![dec.prefill_rows(&contexts[..=members.len()]).unwrap()];
    for t in [[1u32, 2, 3, 4], [250, 6, 7, 100]] {
        out.push(dec.next_log_probs_rows(&t[..=members.len()]).unwrap());
    }
    out
}

/// Largest |difference| between two runs' log-probs, over every step and row.
fn max_diff(a: &[LogProbRows], b: &[LogProbRows]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| (0..x.rows()).map(move |r| max_abs_diff(x.row(r), y.row(r))))
        .fold(0.0, f32::max)
}

/// F16-held factors against the f32 runner over the rounded twins, and
/// against the f32 runner over the members themselves.
fn check<B: ModelBackend>(model: &Model<B>, device: &B::Device, what: &str) {
    let ms = members(model, device);
    let twins: Vec<_> = ms.iter().map(|m| rounded_twin(m, model, device)).collect();
    let half = decode(model, &ms, FactorPrecision::F16);
    let twin = decode(model, &twins, FactorPrecision::F32);
    let exact = decode(model, &ms, FactorPrecision::F32);
    let d = max_diff(&half, &twin);
    assert!(
        d < TOL,
        "{what}: f16 factors vs rounded twins differ by {d}"
    );
    // The public row has no factors: the same bits whatever the precision.
    for (h, e) in half.iter().zip(&exact) {
        assert_eq!(h.row(0), e.row(0), "{what}: public row");
    }
    // Rounding happened, and moved the members' log-probs by little.
    let moved = max_diff(&half, &exact);
    assert!(
        moved > 0.0 && moved < 1e-2,
        "{what}: f16 rounding moved log-probs by {moved}"
    );
    // F16 holding rounds once: rounding twins again changes nothing.
    let again = decode(model, &twins, FactorPrecision::F16);
    assert!(max_diff(&again, &twin) < TOL, "{what}: twins held in f16");
}

#[test]
fn f16_factors_equal_rounded_members_on_safetensors_host_path() {
    check(&tiny_llama(), &dev(), "f32 safetensors, plain flex");
}

#[test]
fn f16_factors_equal_rounded_members_on_quantised_host_path() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    check(
        &Model::<B>::load(LoadOptions::path(&path, &dev())).unwrap(),
        &dev(),
        "Q8_0 GGUF, plain flex",
    );
}

/// On a backend other than plain flex the factors are stacked tensors; f16
/// holding rounds their values the same way.
#[test]
fn f16_factors_equal_rounded_members_on_tensor_path() {
    type AB = Autodiff<Flex>;
    let device = Default::default();
    let model = Model::<AB>::load(LoadOptions::path(llama_dir(), &device)).unwrap();
    check(&model, &device, "tensors, Autodiff<Flex>");
}

#[test]
fn factor_beyond_f16_range_is_a_typed_error() {
    let model = tiny_llama();
    let base = base_of(&model);
    // Entries of about 0.1, times a scale of 10⁶ / 4: far past 65 504.
    let c = LoraConfig::new(4, 1e6, &["q_proj"]).unwrap();
    let big = LoraAdapter::random(c, &base, 0.1, 3, &dev()).unwrap();
    let err = EnsembleRunner::with_precision(
        model.clone(),
        std::slice::from_ref(&big),
        FactorPrecision::F16,
    )
    .unwrap_err();
    match err {
        EnsembleError::Lora(LoraError::HalfOverflow { tensor, value }) => {
            assert!(tensor.ends_with("q_proj.lora_B (scaled)"), "{tensor}");
            assert!(value.abs() >= 65_520.0, "{value}");
        }
        other => panic!("expected HalfOverflow, got {other:?}"),
    }
    // The same adapter held in f32 is fine.
    assert!(EnsembleRunner::new(model, &[big]).is_ok());
}

/// One row alone through its own cache in `kv`, with `adapter` (or none):
/// next-token log-probs after `context`, then after each of `then`.
fn alone(
    model: &Model<B>,
    adapter: Option<&LoraAdapter<B>>,
    context: &[u32],
    then: &[u32],
    kv: KvPrecision,
) -> Vec<Vec<f32>> {
    let delta = adapter.map(|a| a as &dyn LinearDelta<B>);
    let mut cache = model.new_cache_with(1, kv);
    let mut out = Vec::new();
    let mut step = Batch::single(context).unwrap();
    for i in 0..=then.len() {
        let l = model.logits_last(&step, &mut cache, delta).unwrap();
        out.push(to_vec(log_softmax(l)).unwrap());
        if i < then.len() {
            step = Batch::single(&[then[i]]).unwrap();
        }
    }
    out
}

/// f16 factors and an f16 cache: every row of the runner equals its
/// member, rounded, alone through an f16 cache; the public row equals the
/// model alone through one. The f16 cache moves the log-probs a little.
#[test]
fn f16_cache_rows_equal_rounded_members_alone_with_f16_caches() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    let model = Model::<B>::load(LoadOptions::path(&path, &dev())).unwrap();
    let ms = members(&model, &dev());
    let twins: Vec<_> = ms.iter().map(|m| rounded_twin(m, &model, &dev())).collect();
    let runner = EnsembleRunner::with_precision(model.clone(), &ms, FactorPrecision::F16)
        .unwrap()
        .with_kv_precision(KvPrecision::F16);
    assert_eq!(runner.kv_precision(), KvPrecision::F16);
    let layout = RowLayout::public_and_members(ms.len());
    let mut dec = runner.decoder(layout.clone()).unwrap();
    let context = [5u32, 17, 99, 3, 250, 8, 41, 77, 12, 200];
    let then = [1u32, 2, 3];
    let mut steps = vec![dec.prefill(&context).unwrap()];
    for &t in &then {
        steps.push(dec.next_log_probs(t).unwrap());
    }
    let mut moved = 0.0f32;
    for (r, member) in layout.rows().iter().enumerate() {
        let twin = member.map(|m| &twins[m]);
        let want = alone(&model, twin, &context, &then, KvPrecision::F16);
        let f32_cache = alone(&model, twin, &context, &then, KvPrecision::F32);
        for (s, (w, e)) in want.iter().zip(&f32_cache).enumerate() {
            let d = max_abs_diff(steps[s].row(r), w);
            assert!(d < TOL, "row {r} step {s}: {d}");
            moved = moved.max(max_abs_diff(w, e));
        }
    }
    assert!(
        moved > 1e-6 && moved < 1e-2,
        "f16 cache moved log-probs by {moved}"
    );
}
