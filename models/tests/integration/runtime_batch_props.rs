//! Property: for any rows (1–4 rows of 1–10 tokens), padded left or right
//! and run as a prefill of the first tokens plus cached decode of the rest,
//! then 0–3 more decode steps of real tokens in every row (after right
//! padding these follow padding slots), every row's logits at its real
//! positions equal that row (with its extra tokens) run alone.
//! Checked on the tiny Gemma 3 (sliding window 4, so the window must follow
//! the per-row positions) and Llama fixtures.

use crate::runtime_support;

use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, Model};
use proptest::prelude::*;
use runtime_support::{B, load_hf, max_abs_diff};

fn check(
    model: &Model<B>,
    rows: &[Vec<u32>],
    left: bool,
    prefill: usize,
    extra: &[u32],
) -> Result<(), TestCaseError> {
    let vocab = model.vocab_size();
    let batch = if left {
        Batch::left_padded(rows, 0)
    } else {
        Batch::right_padded(rows, 0)
    }
    .unwrap();
    let len = batch.len();
    let prefill = prefill.clamp(1, len);
    let mut cache = model.new_cache(rows.len());
    // Prefill the first `prefill` columns, then one column per step.
    let column = |from: usize, to: usize| {
        let t: Vec<Vec<u32>> = (0..rows.len())
            .map(|r| (from..to).map(|i| batch.token(r, i)).collect())
            .collect();
        let m: Vec<Vec<bool>> = (0..rows.len())
            .map(|r| (from..to).map(|i| batch.is_real(r, i)).collect())
            .collect();
        Batch::from_parts(&t, &m).unwrap()
    };
    let mut logits = vec![vec![]; rows.len()];
    let mut steps = vec![(0, prefill)];
    steps.extend((prefill..len).map(|i| (i, i + 1)));
    for (from, to) in steps {
        let out = to_vec(model.forward(&column(from, to), &mut cache, None).unwrap()).unwrap();
        for (r, row_logits) in logits.iter_mut().enumerate() {
            for k in 0..to - from {
                if batch.is_real(r, from + k) {
                    row_logits.extend_from_slice(&out[(r * (to - from) + k) * vocab..][..vocab]);
                }
            }
        }
    }
    for &t in extra {
        let step = Batch::new(&vec![vec![t]; rows.len()]).unwrap();
        let out = to_vec(model.forward(&step, &mut cache, None).unwrap()).unwrap();
        for (r, row_logits) in logits.iter_mut().enumerate() {
            row_logits.extend_from_slice(&out[r * vocab..(r + 1) * vocab]);
        }
    }
    for (r, row) in rows.iter().enumerate() {
        let row: Vec<u32> = row.iter().chain(extra).copied().collect();
        let row = &row;
        let alone = to_vec(model.logits_all(&Batch::single(row).unwrap()).unwrap()).unwrap();
        let d = max_abs_diff(&logits[r], &alone);
        prop_assert!(d <= 1e-5, "row {r}: {d}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn padded_cached_rows_equal_rows_alone(
        rows in prop::collection::vec(prop::collection::vec(1u32..256, 1..=10), 1..=4),
        left in any::<bool>(),
        prefill in 1usize..=10,
        extra in prop::collection::vec(1u32..256, 0..=3),
        gemma in any::<bool>(),
    ) {
        let model = load_hf(if gemma { "gemma3" } else { "llama" });
        check(&model, &rows, left, prefill, &extra)?;
    }
}
