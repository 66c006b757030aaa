//! The batched ensemble equals each member run alone: public + 3 members
//! with different adapters (ranks 4, 2, 3; all seven, three and five
//! projections), rows of different lengths, prefill then incremental
//! decoding, teacher-forced block scoring, SubMix pairs and DPS-MOZO prompt rows.

use crate::lora_support;

use burn::tensor::Tensor;
use lora_support::*;
use privmix_ensemble::lora::{LoraAdapter, LoraConfig};
use privmix_ensemble::rows::{LogProbRows, RowLayout};
use privmix_ensemble::runner::{EnsembleError, EnsembleRunner};
use privmix_models::{
    Batch, DecodeProducts, LanguageModel, LinearDelta, LoadOptions, Model, log_softmax,
};

const TOL: f32 = 1e-4;

fn members(model: &Model<B>) -> Vec<LoraAdapter<B>> {
    let base = base_of(model);
    let c = LoraConfig::new(
        3,
        6.0,
        &["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    .unwrap();
    vec![
        load_adapter("full", &base),
        load_adapter("rslora", &base),
        LoraAdapter::random(c, &base, 0.1, 7, &dev()).unwrap(),
    ]
}

/// One row alone through its own cache, with member `m`'s adapter (or none):
/// next-token log-probs after `context`, then after each of `then`.
fn alone(
    model: &Model<B>,
    adapter: Option<&LoraAdapter<B>>,
    context: &[u32],
    then: &[u32],
) -> Vec<Vec<f32>> {
    let delta = adapter.map(|a| a as &dyn LinearDelta<B>);
    let mut cache = model.new_cache(1);
    let mut out = Vec::new();
    let mut step = Batch::single(context).unwrap();
    for i in 0..=then.len() {
        let l: Tensor<B, 2> = model.logits_last(&step, &mut cache, delta).unwrap();
        out.push(log_softmax(l).into_data().to_vec::<f32>().unwrap());
        if i < then.len() {
            step = Batch::single(&[then[i]]).unwrap();
        }
    }
    out
}

fn check_rows(got: &LogProbRows, want: &[Vec<f32>], what: &str) {
    assert_eq!(got.rows(), want.len());
    for (r, w) in want.iter().enumerate() {
        let d = max_abs_diff(got.row(r), w);
        assert!(d < TOL, "{what}: row {r} differs by {d}");
    }
}

#[test]
fn batched_rows_of_different_lengths_equal_each_member_alone() {
    rows_of_different_lengths_equal_each_member_alone(&tiny_llama());
}

/// The same on the tiny llama's Q8_0 GGUF: on plain flex its decode
/// products read the quantised blocks and the members' updates are added in
/// host memory (`RowAdapters::add_host`), while a member alone goes through
/// its `LoraAdapter`'s tensor delta.
#[test]
fn quantised_gguf_rows_equal_each_member_alone() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    rows_of_different_lengths_equal_each_member_alone(
        &Model::load(LoadOptions::path(&path, &dev())).unwrap(),
    );
}

/// The same with 8-bit activations in the decode products
/// (`DecodeProducts::Int8Activations`): each row's activations are
/// quantised on their own, so a row still equals its member alone. The
/// steps (few rows, so the context's too) really take that path: their
/// log-probs differ from the f32 path's, a little.
#[test]
fn int8_activation_rows_equal_each_member_alone() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    let int8 = Model::load(
        LoadOptions::path(&path, &dev()).decode_products(DecodeProducts::Int8Activations),
    )
    .unwrap();
    rows_of_different_lengths_equal_each_member_alone(&int8);
    let f32 = Model::load(LoadOptions::path(&path, &dev())).unwrap();
    let context = [5u32, 17, 99, 3];
    let (a, b) = (
        alone(&int8, None, &context, &[8, 41]),
        alone(&f32, None, &context, &[8, 41]),
    );
    for (x, y) in a.iter().zip(&b) {
        let d = max_abs_diff(x, y);
        // Rounding, not a different network: far below the log-probs' spread.
        assert!(d > 1e-6 && d < 0.2, "log-probs differ by {d}");
    }
}

fn rows_of_different_lengths_equal_each_member_alone(model: &Model<B>) {
    let model = model.clone();
    let ms = members(&model);
    let runner = EnsembleRunner::new(model.clone(), &ms).unwrap();
    assert_eq!(runner.num_members(), 3);
    let layout = RowLayout::public_and_members(3);
    let contexts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99, 3, 250, 8, 41, 77, 12, 200],
        vec![9, 8, 7, 6, 5, 4, 3],
        vec![100, 101, 102, 103],
        vec![42, 43, 44, 45, 46, 47, 48, 49, 50],
    ];
    let next: [[u32; 4]; 3] = [[1, 2, 3, 4], [250, 6, 7, 100], [33, 33, 33, 33]];
    let mut dec = runner.decoder(layout.clone()).unwrap();
    let mut steps = vec![dec.prefill_rows(&contexts).unwrap()];
    for t in &next {
        steps.push(dec.next_log_probs_rows(t).unwrap());
    }
    for (r, member) in layout.rows().iter().enumerate() {
        let then: Vec<u32> = next.iter().map(|t| t[r]).collect();
        let want = alone(&model, member.map(|m| &ms[m]), &contexts[r], &then);
        for (s, w) in want.iter().enumerate() {
            let d = max_abs_diff(steps[s].row(r), w);
            assert!(d < TOL, "row {r} step {s}: {d}");
        }
    }
    // Members really differ from the public model and from each other.
    let s = &steps[0];
    assert!(max_abs_diff(s.row(0), &alone(&model, None, &contexts[1], &[])[0]) > 0.01);
    assert!(max_abs_diff(s.row(1), s.row(2)) > 0.01);
}

#[test]
fn shared_context_decoding_gives_public_then_member_rows() {
    let model = tiny_llama();
    let ms = members(&model);
    let runner = EnsembleRunner::new(model.clone(), &ms).unwrap();
    let mut dec = runner.decoder(RowLayout::public_and_members(3)).unwrap();
    let context = [7u32, 99, 12, 5, 180];
    let then = [3u32, 64];
    let out = [
        dec.prefill(&context).unwrap(),
        dec.next_log_probs(then[0]).unwrap(),
        dec.next_log_probs(then[1]).unwrap(),
    ];
    let want: Vec<Vec<Vec<f32>>> = std::iter::once(None)
        .chain(ms.iter().map(Some))
        .map(|a| alone(&model, a, &context, &then))
        .collect();
    for (s, rows) in out.iter().enumerate() {
        let w: Vec<Vec<f32>> = want.iter().map(|r| r[s].clone()).collect();
        check_rows(rows, &w, &format!("step {s}"));
        assert_eq!(rows.member_rows(), &rows.as_flat()[256..]);
        assert_eq!(rows.member_rows().len(), 3 * 256);
        // Log-probabilities of a distribution.
        for r in 0..rows.rows() {
            let mass: f64 = rows.row(r).iter().map(|&l| f64::from(l).exp()).sum();
            assert!((mass - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn submix_pairs_layout_runs_the_named_members() {
    let model = tiny_llama();
    let ms = members(&model);
    let runner = EnsembleRunner::new(model.clone(), &ms).unwrap();
    let layout = RowLayout::submix_pairs(&[(0, 1), (2, 0)]);
    assert_eq!(layout.rows(), &[None, Some(0), Some(1), Some(2), Some(0)]);
    let context = [11u32, 22, 33, 44];
    let got = runner
        .decoder(layout.clone())
        .unwrap()
        .prefill(&context)
        .unwrap();
    let want: Vec<Vec<f32>> = layout
        .rows()
        .iter()
        .map(|m| alone(&model, m.map(|i| &ms[i]), &context, &[])[0].clone())
        .collect();
    check_rows(&got, &want, "submix");
    assert_eq!(got.row(1), got.row(4));
}

#[test]
fn dps_mozo_prompt_rows_equal_each_prompt_alone() {
    let model = tiny_llama();
    let runner = EnsembleRunner::new(model.clone(), &[]).unwrap();
    // A zero-shot prompt and three one-shot prompts of different lengths.
    let prompts: Vec<Vec<u32>> = vec![
        vec![40, 41, 42],
        vec![1, 2, 3, 4, 5, 6, 40, 41, 42],
        vec![9, 9, 40, 41, 42],
        vec![200, 201, 202, 203, 204, 205, 206, 40, 41, 42],
    ];
    let mut dec = runner.decoder(RowLayout::public_only(4)).unwrap();
    let first = dec.prefill_rows(&prompts).unwrap();
    let second = dec.next_log_probs(77).unwrap();
    for (r, p) in prompts.iter().enumerate() {
        let w = alone(&model, None, p, &[77]);
        assert!(max_abs_diff(first.row(r), &w[0]) < TOL);
        assert!(max_abs_diff(second.row(r), &w[1]) < TOL);
    }
}

#[test]
fn block_scores_equal_teacher_forcing_alone() {
    let model = tiny_llama();
    let ms = members(&model);
    let runner = EnsembleRunner::new(model.clone(), &ms).unwrap();
    let layout = RowLayout::public_and_members(3);
    let block: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 256).collect();
    let scores = runner.score_block(&layout, &block).unwrap();
    let full = runner.score_block_full(&layout, &block).unwrap();
    assert_eq!((scores.positions(), full.len()), (11, 11));
    for (r, member) in layout.rows().iter().enumerate() {
        // Position i alone: next-token log-probs after block[..=i].
        let want = alone(&model, member.map(|m| &ms[m]), &block[..1], &block[1..11]);
        for i in 0..11 {
            let d = max_abs_diff(full[i].row(r), &want[i]);
            assert!(d < TOL, "row {r} position {i}: {d}");
            let t = block[i + 1] as usize;
            assert!((scores.row(r)[i] - want[i][t]).abs() < TOL);
        }
        let ppl = scores.perplexity(r);
        assert!(ppl.is_finite() && ppl > 1.0);
    }
}

#[test]
fn bad_runner_input_gets_typed_errors() {
    let model = tiny_llama();
    let ms = members(&model);
    let runner = EnsembleRunner::new(model.clone(), &ms).unwrap();
    let e = runner.decoder(RowLayout::members(&[0, 3])).unwrap_err();
    assert_eq!(
        e,
        EnsembleError::MemberOutOfRange {
            member: 3,
            members: 3
        }
    );
    assert!(matches!(
        runner.decoder(RowLayout::custom(vec![])),
        Err(EnsembleError::BadInput(_))
    ));
    let layout = RowLayout::public_and_members(3);
    assert!(matches!(
        runner.score_block(&layout, &[5]),
        Err(EnsembleError::BadInput(_))
    ));
    let mut dec = runner.decoder(layout.clone()).unwrap();
    assert!(matches!(dec.prefill(&[]), Err(EnsembleError::BadInput(_))));
    assert!(matches!(
        dec.prefill_rows(&[vec![1], vec![2]]),
        Err(EnsembleError::BadInput(_))
    ));
    assert!(matches!(
        dec.prefill_rows(&[vec![1], vec![2], vec![], vec![3]]),
        Err(EnsembleError::BadInput(_))
    ));
    let mut dec = runner.decoder(layout).unwrap();
    assert!(matches!(
        dec.prefill(&[1, 999]),
        Err(EnsembleError::Model(_))
    ));
}
