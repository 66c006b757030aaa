//! The runtime's cache and batching against the full forward: incremental
//! decoding through the KV cache, padded batches (left and right), rows
//! dropped from the cache, generation, and typed errors for bad input. The
//! full single-row forward itself is checked against transformers in
//! `llama_hf_logits.rs` / `gemma_hf_logits.rs`.

use crate::runtime_support;

use privmix_models::runtime::{select_positions, to_vec};
use privmix_models::{
    Batch, KvPrecision, LanguageModel, LoadOptions, ModelError, generate_greedy, generate_sampled,
};
use rand::SeedableRng;
use runtime_support::{load_hf, max_abs_diff, reference};

const TOL: f32 = 1e-5;

/// Rows through an f16 cache whose f32 keys and values differed by sum
/// order before rounding (a neighbouring f16 here and there).
const F16_TOL: f32 = 1e-3;

/// Logits of `tokens` alone, every position, flattened.
fn alone<M: LanguageModel<runtime_support::B>>(model: &M, tokens: &[u32]) -> Vec<f32> {
    to_vec(model.logits_all(&Batch::single(tokens).unwrap()).unwrap()).unwrap()
}

#[test]
fn incremental_decode_equals_full_forward() {
    // Gemma 2/3 have sliding window 4 < 12 tokens: the window must slide
    // correctly across cached slots too.
    for name in ["llama", "gemma", "gemma2", "gemma3"] {
        let model = load_hf(name);
        let tokens = reference(name).input_ids[0].clone();
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
        println!("{name}: cached decode max |Δ| {worst:e}");
        assert!(worst <= TOL, "{name}: {worst}");
    }
}

/// Rows of lengths 12 and 7 padded (left or right), prefilled together, then
/// three decode steps for both rows: each row's logits equal the row alone.
fn padded_batch_then_decode(left: bool) {
    for name in ["llama", "gemma3"] {
        let model = load_hf(name);
        let ids = reference(name).input_ids;
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
            let mut full_row = row.clone();
            full_row.extend(next[r]);
            let want = alone(&model, &full_row);
            let real: Vec<usize> = (0..batch.len()).filter(|&i| batch.is_real(r, i)).collect();
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
        println!(
            "{name} ({}): max |Δ| vs rows alone {worst:e}",
            if left { "left" } else { "right" }
        );
        assert!(worst <= TOL, "{name}: {worst}");
    }
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
fn dropping_a_row_from_the_cache_keeps_the_other() {
    let model = load_hf("llama");
    let ids = reference("llama").input_ids;
    let mut cache = model.new_cache(2);
    model
        .forward(&Batch::new(&ids).unwrap(), &mut cache, None)
        .unwrap();
    cache.select_rows(&[1]).unwrap();
    let got = to_vec(
        model
            .logits_last(&Batch::single(&[42]).unwrap(), &mut cache, None)
            .unwrap(),
    )
    .unwrap();
    let mut row = ids[1].clone();
    row.push(42);
    let want = alone(&model, &row);
    let vocab = model.vocab_size();
    assert!(max_abs_diff(&got, &want[(row.len() - 1) * vocab..]) <= TOL);
    assert!(matches!(
        cache.select_rows(&[3]),
        Err(ModelError::BadInput(_))
    ));
}

/// `logits_last` applies the head to each row's last real position only;
/// it must give those positions' rows of the full forward's logits (for
/// every architecture, Gemma 2's final soft-capping included).
#[test]
fn logits_last_picks_each_rows_last_real_token() {
    for name in ["llama", "gemma", "gemma2", "gemma3", "gpt2"] {
        let model = load_hf(name);
        let ids = reference(name).input_ids;
        let rows = vec![ids[0][..4].to_vec(), ids[1].clone()];
        let batch = Batch::right_padded(&rows, 0).unwrap();
        let mut cache = model.new_cache(2);
        let last = to_vec(model.logits_last(&batch, &mut cache, None).unwrap()).unwrap();
        let all = model.logits_all(&batch).unwrap();
        let want = to_vec(select_positions(all, &[3, ids[1].len() - 1])).unwrap();
        let worst = max_abs_diff(&last, &want);
        assert!(worst <= TOL, "{name}: {worst}");
    }
}

#[test]
fn generation_greedy_and_sampled() {
    let model = load_hf("gemma2");
    let prompt = &reference("gemma2").input_ids[0][..6];
    let greedy = generate_greedy(&model, prompt, 5, None).unwrap();
    // Greedy continues with the argmax of the full forward at every step.
    let mut seq = prompt.to_vec();
    for &t in &greedy {
        let lp = model.log_probs_last(&seq).unwrap();
        let argmax = lp
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > lp[b] { i } else { b });
        assert_eq!(t as usize, argmax);
        seq.push(t);
    }
    // A vanishing temperature samples the argmax; a seed fixes the draw.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    assert_eq!(
        generate_sampled(&model, prompt, 5, 1e-6, &mut rng, None).unwrap(),
        greedy
    );
    let a = generate_sampled(
        &model,
        prompt,
        5,
        1.0,
        &mut rand::rngs::StdRng::seed_from_u64(1),
        None,
    )
    .unwrap();
    let b = generate_sampled(
        &model,
        prompt,
        5,
        1.0,
        &mut rand::rngs::StdRng::seed_from_u64(1),
        None,
    )
    .unwrap();
    assert_eq!(a, b);
    assert!(a.iter().all(|&t| (t as usize) < model.vocab_size()));
    for bad in [0.0, -1.0, f64::NAN] {
        let r = generate_sampled(&model, prompt, 1, bad, &mut rng, None);
        assert!(
            matches!(r, Err(ModelError::BadInput(_))),
            "temperature {bad}"
        );
    }
}

#[test]
fn bad_input_gives_typed_errors() {
    let model = load_hf("llama");
    let bad = |r: Result<_, ModelError>| matches!(r, Err(ModelError::BadInput(_)));
    assert!(bad(model.log_probs_last(&[1, 256]).map(|_| ())));
    assert!(bad(model.log_probs_last(&[]).map(|_| ())));
    assert!(bad(Batch::new(&[vec![1, 2], vec![3]]).map(|_| ())));
    assert!(bad(
        Batch::from_parts(&[vec![1, 2]], &[vec![true]]).map(|_| ())
    ));
    let mut cache = model.new_cache(2);
    assert!(bad(model
        .forward(&Batch::single(&[1]).unwrap(), &mut cache, None)
        .map(|_| ())));
    let mut other = privmix_models::KvCache::with_storage(1, 1, KvPrecision::F32, true);
    assert!(bad(model
        .forward(&Batch::single(&[1]).unwrap(), &mut other, None)
        .map(|_| ())));
    // A row of only padding has no last token.
    let padded = Batch::from_parts(&[vec![0, 0]], &[vec![false, false]]).unwrap();
    assert!(bad(model
        .logits_last(&padded, &mut model.new_cache(1), None)
        .map(|_| ())));
}

#[test]
fn next_token_log_probs_gather_the_full_distribution() {
    let model = load_hf("gemma3");
    let tokens = reference("gemma3").input_ids[1].clone();
    let got = model.next_token_log_probs(&tokens).unwrap();
    assert_eq!(got.len(), tokens.len() - 1);
    for i in 0..tokens.len() - 1 {
        let lp = model.log_probs_last(&tokens[..=i]).unwrap();
        assert!(
            (got[i] - lp[tokens[i + 1] as usize]).abs() <= TOL,
            "position {i}"
        );
    }
    assert!(matches!(
        model.next_token_log_probs(&tokens[..1]),
        Err(ModelError::BadInput(_))
    ));
}

/// Logits at the last token of `prompt` (one row, its own cache in `kv`),
/// then after each of `then`.
fn alone_steps<B: burn::tensor::backend::Backend, M: LanguageModel<B>>(
    model: &M,
    kv: KvPrecision,
    prompt: &[u32],
    then: &[u32],
) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache_with(1, kv);
    let mut out = vec![
        to_vec(
            model
                .logits_last(&Batch::single(prompt).unwrap(), &mut cache, None)
                .unwrap(),
        )
        .unwrap(),
    ];
    for &t in then {
        let step = Batch::single(&[t]).unwrap();
        out.push(to_vec(model.logits_last(&step, &mut cache, None).unwrap()).unwrap());
    }
    out
}

/// Joined caches (`KvCache::append_rows`), rows dropped and the cache
/// compacted: a 12-token row prefilled alone and two rows of 5 and 3
/// tokens prefilled together (left-padded) are joined, decode 3 steps
/// together, lose the long row (its slots no other row holds are dropped),
/// and decode 2 more. Returns the largest difference of any row's logits
/// from the row decoded alone, and whether all were equal bit for bit.
fn joined_rows_against_alone<B: burn::tensor::backend::Backend, M: LanguageModel<B>>(
    model: &M,
    kv: KvPrecision,
) -> (f32, bool) {
    let prompts: [Vec<u32>; 3] = [
        (0..12).map(|i| (3 + 7 * i) % 97).collect(),
        vec![50, 55, 60, 65, 70],
        vec![81, 2, 40],
    ];
    let then: [[u32; 5]; 3] = [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12], [13, 14, 15, 16, 17]];
    let vocab = model.vocab_size();
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    let mut cache = model.new_cache_with(1, kv);
    let first = Batch::single(&prompts[0]).unwrap();
    got[0].push(to_vec(model.logits_last(&first, &mut cache, None).unwrap()).unwrap());
    let mut pair = model.new_cache_with(2, kv);
    let padded = Batch::left_padded(&prompts[1..], 0).unwrap();
    let out = to_vec(model.logits_last(&padded, &mut pair, None).unwrap()).unwrap();
    got[1].push(out[..vocab].to_vec());
    got[2].push(out[vocab..].to_vec());
    cache.append_rows(pair).unwrap();
    assert_eq!((cache.batch_size(), cache.slots()), (3, 12));
    assert_eq!(cache.compact(), 0);
    let step = |cache: &mut privmix_models::KvCache<B>, rows: &[usize], s: usize| {
        let tokens: Vec<Vec<u32>> = rows.iter().map(|&r| vec![then[r][s]]).collect();
        let batch = Batch::new(&tokens).unwrap();
        to_vec(model.logits_last(&batch, cache, None).unwrap()).unwrap()
    };
    for s in 0..3 {
        let out = step(&mut cache, &[0, 1, 2], s);
        for (r, row) in got.iter_mut().enumerate() {
            row.push(out[r * vocab..(r + 1) * vocab].to_vec());
        }
    }
    cache.select_rows(&[2, 1]).unwrap();
    assert_eq!(cache.compact(), 12 - 5);
    assert_eq!(
        (cache.slots(), cache.real_tokens(0), cache.real_tokens(1)),
        (8, Some(6), Some(8))
    );
    for s in 3..5 {
        let out = step(&mut cache, &[2, 1], s);
        got[2].push(out[..vocab].to_vec());
        got[1].push(out[vocab..].to_vec());
    }
    let (mut worst, mut exact) = (0.0f32, true);
    for (r, rows) in got.iter().enumerate() {
        let want = alone_steps(model, kv, &prompts[r], &then[r][..rows.len() - 1]);
        for (g, w) in rows.iter().zip(&want) {
            worst = worst.max(max_abs_diff(g, w));
            exact &= g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
        }
    }
    (worst, exact)
}

/// Every architecture (Gemma 2/3's sliding window of 4 follows each row's
/// positions across the padding), f32 and f16 caches, on plain flex
/// (host-held keys and values) and on `Autodiff<Flex>` (tensors).
#[test]
fn joined_caches_decode_each_row_as_alone() {
    use burn::backend::{Autodiff, Flex};
    for name in ["llama", "gemma", "gemma2", "gemma3", "gpt2"] {
        let dir = runtime_support::fixture(&format!("hf/{name}"));
        let host = load_hf(name);
        let tensors = privmix_models::Model::<Autodiff<Flex>>::load(LoadOptions::path(
            &dir,
            &Default::default(),
        ))
        .unwrap();
        for kv in [KvPrecision::F32, KvPrecision::F16] {
            let (h, h_exact) = joined_rows_against_alone(&host, kv);
            let (t, t_exact) = joined_rows_against_alone(&tensors, kv);
            println!(
                "{name} {kv:?}: joined vs alone max |Δ logit| host {h:e} (bit for bit: {h_exact}), \
                 tensors {t:e} (bit for bit: {t_exact})"
            );
            // Llama and Gemma decode with per-row products (`few_rows`) and
            // host attention, where masked slots weigh exactly 0: the same
            // bits. GPT-2's `[in, out]` weights go through gemm, whose
            // blocking may follow the row count.
            if name == "gpt2" {
                assert!(
                    h <= TOL,
                    "{name} {kv:?}: host rows differ from alone by {h}"
                );
            } else {
                assert!(h_exact, "{name} {kv:?}: host rows differ from alone by {h}");
            }
            // burn's ops sum the joined (longer, more) rows in another
            // order; in an f16 cache such a difference can move a key or
            // value to the neighbouring f16 (2⁻¹¹ of it).
            let tol = if kv == KvPrecision::F16 { F16_TOL } else { TOL };
            assert!(
                t <= tol,
                "{name} {kv:?}: tensor rows differ from alone by {t}"
            );
        }
    }
}

/// Caches of other layer counts, precisions or key/value heads are
/// refused with a typed error, the cache unchanged.
#[test]
fn mismatched_caches_are_not_joined() {
    let (llama, gemma) = (load_hf("llama"), load_hf("gemma"));
    let prefilled = |model: &privmix_models::Model<runtime_support::B>, kv: KvPrecision| {
        let mut cache = model.new_cache_with(1, kv);
        model
            .forward(&Batch::single(&[1, 2, 3]).unwrap(), &mut cache, None)
            .unwrap();
        cache
    };
    let base = prefilled(&llama, KvPrecision::F32);
    // Gemma's fixture has one key/value head, the Llama's two.
    for other in [
        prefilled(&gemma, KvPrecision::F32),
        prefilled(&llama, KvPrecision::F16),
        privmix_models::KvCache::with_storage(llama.num_layers() + 1, 1, KvPrecision::F32, true),
    ] {
        let mut cache = base.clone();
        let e = cache.append_rows(other).unwrap_err();
        assert!(matches!(e, ModelError::CacheMismatch(_)), "{e}");
        assert_eq!((cache.batch_size(), cache.slots()), (1, 3));
    }
    // The cache still decodes as before.
    let step = Batch::single(&[4]).unwrap();
    let (mut a, mut b) = (base.clone(), base);
    let mut cache = prefilled(&llama, KvPrecision::F32);
    assert!(
        cache
            .append_rows(prefilled(&gemma, KvPrecision::F32))
            .is_err()
    );
    let got = to_vec(llama.logits_last(&step, &mut cache, None).unwrap()).unwrap();
    let want = to_vec(llama.logits_last(&step, &mut a, None).unwrap()).unwrap();
    assert_eq!(got, want);
    assert_eq!(b.batch_size(), 1);
    b.select_rows(&[]).unwrap();
    assert_eq!((b.batch_size(), b.slots()), (0, 0));
}
