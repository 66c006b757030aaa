//! The host step against burn autodiff (the existing path, which shares no
//! code with it) on the tiny Llama fixtures of the models crate — f32
//! (HF safetensors), Q8_0 (GGUF), and Llama-3 RoPE scaling — with every
//! projection targeted, random non-zero factors, with and without dropout,
//! batched and per block; and against central finite differences of its
//! own loss.
//!
//! Tolerances: the losses agree to 2e-5 relative; each gradient to 2e-4 of
//! its largest entry (both paths are f32, with sums in different orders over
//! two layers and a 256-word softmax).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use privmix_models::{LoadOptions, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Group;
use super::step::HostModel;
use super::weights::HostLlama;
use crate::lora::{LLAMA_TARGET_MODULES, LoraBase, LoraConfig};
use crate::train::params::LoraParams;
use crate::train::trainable::{Dropout, loss_and_gradient};

type AB = Autodiff<Flex>;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures")
        .join(rel)
}

fn models() -> Vec<(&'static str, Model<AB>)> {
    ["hf/llama", "gguf/llama_q8_0.gguf", "hf/llama_scaled"]
        .into_iter()
        .map(|p| {
            (
                p,
                Model::load(LoadOptions::path(fixture(p), &Default::default())).expect(p),
            )
        })
        .collect()
}

/// Every projection targeted, factors drawn at random (B ≠ 0, so that every
/// gradient is non-trivial).
fn params(model: &Model<AB>, seed: u64) -> LoraParams {
    let mut cfg = LoraConfig::new(4, 8.0, &LLAMA_TARGET_MODULES).unwrap();
    cfg.lora_dropout = 0.1;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p = LoraParams::init(&cfg, &model.base_shapes().unwrap(), &mut rng).unwrap();
    for v in p.values_mut() {
        *v = rng.random_range(-0.2..0.2);
    }
    p
}

fn blocks(rows: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..rows as u32)
        .map(|r| {
            (0..len as u32)
                .map(|i| (r * 31 + i * 17 + 3) % vocab)
                .collect()
        })
        .collect()
}

fn assert_close(what: &str, (l, g): &(f64, Vec<f32>), (l_ref, g_ref): &(f64, Vec<f32>)) {
    assert!(
        (l - l_ref).abs() <= 2e-5 * l_ref.abs().max(1.0),
        "{what}: loss {l} vs {l_ref}"
    );
    let scale = g_ref.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: zero reference gradient");
    for (i, (a, b)) in g.iter().zip(g_ref).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * scale,
            "{what}: gradient {i}: {a} vs {b} (max {scale})"
        );
    }
}

#[test]
fn host_step_matches_autodiff_batched_with_and_without_dropout() {
    for (name, model) in models() {
        let host = HostModel::from_model(&model).unwrap().expect("a Llama");
        let p = params(&model, 7);
        let data = blocks(3, 9, 256);
        let refs: Vec<&Vec<u32>> = data.iter().collect();
        for dropout in [
            None,
            Some(Dropout {
                p: 0.25,
                seed: 5,
                pass: 3,
            }),
        ] {
            let want = loss_and_gradient::<AB, _>(&model, &p, &refs, dropout, &Default::default())
                .unwrap();
            let groups = [Group::new(&p, refs.len(), dropout)];
            let got = host.losses_and_gradients(&refs, &groups).unwrap();
            assert_eq!(got.len(), 1);
            assert_close(&format!("{name} dropout {dropout:?}"), &got[0], &want);
        }
    }
}

#[test]
fn host_step_per_block_matches_autodiff_one_block_at_a_time() {
    for (name, model) in models().into_iter().take(2) {
        let host = HostModel::from_model(&model).unwrap().expect("a Llama");
        let p = params(&model, 9);
        let data = blocks(3, 7, 256);
        let refs: Vec<&Vec<u32>> = data.iter().collect();
        let passes: Vec<Dropout> = (0..3)
            .map(|k| Dropout {
                p: 0.2,
                seed: 1,
                pass: 100 + k,
            })
            .collect();
        let groups: Vec<Group> = passes.iter().map(|&d| Group::new(&p, 1, Some(d))).collect();
        let got = host.losses_and_gradients(&refs, &groups).unwrap();
        assert_eq!(got.len(), 3);
        for (k, block) in refs.iter().enumerate() {
            let want = loss_and_gradient::<AB, _>(
                &model,
                &p,
                &[block],
                Some(passes[k]),
                &Default::default(),
            )
            .unwrap();
            assert_close(&format!("{name} block {k}"), &got[k], &want);
        }
    }
}

/// Central differences of the host loss itself at the largest gradient
/// entries of a few sites' A and B: checks the backward pass against the
/// forward pass, independently of burn.
#[test]
fn host_gradient_matches_finite_differences() {
    let (_, model) = models().remove(1);
    let host = HostModel::from_model(&model).unwrap().expect("a Llama");
    let mut p = params(&model, 3);
    let data = blocks(2, 8, 256);
    let refs: Vec<&Vec<u32>> = data.iter().collect();
    let (_, g) = host
        .losses_and_gradients(&refs, &[Group::new(&p, refs.len(), None)])
        .unwrap()
        .remove(0);
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
    let h = 1e-2f32;
    for &i in order.iter().take(6) {
        let at = p.values()[i];
        let mut loss_at = |v: f32| {
            p.values_mut()[i] = v;
            host.losses_and_gradients(&refs, &[Group::new(&p, refs.len(), None)])
                .unwrap()[0]
                .0
        };
        let fd = (loss_at(at + h) - loss_at(at - h)) / (2.0 * f64::from(h));
        p.values_mut()[i] = at;
        let rel = (fd - f64::from(g[i])).abs() / fd.abs();
        assert!(
            rel < 2e-2,
            "entry {i}: analytic {} vs finite difference {fd}",
            g[i]
        );
    }
}

#[test]
fn tokens_outside_the_vocabulary_are_an_error() {
    let (_, model) = models().remove(0);
    let host = HostModel::from_model(&model).unwrap().expect("a Llama");
    let p = params(&model, 1);
    let bad = [vec![1, 2, 999]];
    let refs: Vec<&Vec<u32>> = bad.iter().collect();
    assert!(
        host.losses_and_gradients(&refs, &[Group::new(&p, 1, None)])
            .is_err()
    );
}

/// Rows in chunks of one or two, with and without recomputing each layer,
/// give the one-pass step's losses and gradients; so does the forward-only
/// loss.
#[test]
fn chunked_and_recomputed_steps_match_the_one_pass_step() {
    for (name, model) in models().into_iter().take(2) {
        let mut host = HostModel::from_model(&model).unwrap().expect("a Llama");
        let p = params(&model, 11);
        let data = blocks(5, 8, 256);
        let refs: Vec<&Vec<u32>> = data.iter().collect();
        let d = Dropout {
            p: 0.2,
            seed: 4,
            pass: 2,
        };
        let groups = [Group::new(&p, 3, Some(d)), Group::new(&p, 2, None)];
        let one_pass = host.losses_and_gradients(&refs, &groups).unwrap();
        // Saved floats per token of the adapters with dropout: x̃A, x̃ and the mask.
        let lora_per_token: usize = p.layout().iter().map(|l| 4 + 2 * l.fan_in).sum();
        let (full, checkpointed) = host.llama.row_floats(7, lora_per_token);
        assert!(full > checkpointed, "{name}: {full} vs {checkpointed}");
        let bytes = std::mem::size_of::<f32>();
        let mut seen = Vec::new();
        for budget in [2 * full * bytes, full * bytes, bytes] {
            host.llama.activation_budget = budget;
            let mode = host.chunking_of(&refs, &groups).unwrap();
            seen.push(mode);
            let what = format!("{mode:?}");
            let got = host.losses_and_gradients(&refs, &groups).unwrap();
            for (k, (g, want)) in got.iter().zip(&one_pass).enumerate() {
                assert_close(&format!("{name} {what} group {k}"), g, want);
            }
            let losses = host.losses(&refs, &groups).unwrap();
            for (l, (want, _)) in losses.iter().zip(&one_pass) {
                assert!(
                    (l - want).abs() <= 1e-5 * want.abs(),
                    "{name} {what}: {l} vs {want}"
                );
            }
        }
        assert!(
            seen.iter().any(|&(rows, re)| (2..5).contains(&rows) && !re),
            "{seen:?}"
        );
        assert!(seen.contains(&(1, true)), "{seen:?}");
    }
}

/// Groups through different adapters in one step (members trained
/// together) get the losses and gradients each gets alone.
#[test]
fn groups_of_different_adapters_match_each_alone() {
    let (_, model) = models().remove(0);
    let mut host = HostModel::from_model(&model).unwrap().expect("a Llama");
    let adapters: Vec<LoraParams> = (0..3).map(|k| params(&model, 20 + k)).collect();
    let data = blocks(6, 8, 256);
    let refs: Vec<&Vec<u32>> = data.iter().collect();
    let pass = |k: u64| Dropout {
        p: 0.1,
        seed: 9,
        pass: k,
    };
    let rows = [1, 3, 2];
    let groups: Vec<Group> = adapters
        .iter()
        .zip(rows)
        .enumerate()
        .map(|(k, (p, r))| Group::new(p, r, Some(pass(k as u64))))
        .collect();
    for budget in [usize::MAX, 4] {
        host.llama.activation_budget = budget;
        let together = host.losses_and_gradients(&refs, &groups).unwrap();
        let mut first = 0;
        for (k, g) in groups.iter().enumerate() {
            let alone = host
                .losses_and_gradients(&refs[first..first + g.rows], &[*g])
                .unwrap();
            assert_close(
                &format!("member {k} budget {budget}"),
                &together[k],
                &alone[0],
            );
            first += g.rows;
        }
    }
}

#[test]
fn groups_that_do_not_cover_the_blocks_or_differ_in_shape_are_refused() {
    let (_, model) = models().remove(0);
    let host = HostModel::from_model(&model).unwrap().expect("a Llama");
    let p = params(&model, 1);
    let data = blocks(3, 6, 256);
    let refs: Vec<&Vec<u32>> = data.iter().collect();
    for rows in [[1, 1], [2, 2], [3, 0]] {
        let groups = [Group::new(&p, rows[0], None), Group::new(&p, rows[1], None)];
        assert!(
            host.losses_and_gradients(&refs, &groups).is_err(),
            "{rows:?}"
        );
    }
    let cfg = LoraConfig::new(2, 4.0, &["q_proj"]).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let other = LoraParams::init(&cfg, &model.base_shapes().unwrap(), &mut rng).unwrap();
    let groups = [Group::new(&p, 2, None), Group::new(&other, 1, None)];
    assert!(host.losses_and_gradients(&refs, &groups).is_err());
}

/// Members' rows stay apart in a joint step: a group's loss and gradient
/// are the same whatever tokens the other groups' rows hold (while theirs
/// do change), whether the rows share one chunk or are recomputed chunk by
/// chunk.
#[test]
fn a_groups_gradient_comes_from_its_own_rows_only() {
    let (_, model) = models().remove(0);
    let mut host = HostModel::from_model(&model).unwrap().expect("a Llama");
    let adapters: Vec<LoraParams> = (0..3).map(|k| params(&model, 30 + k)).collect();
    let rows = [2, 2, 2];
    let groups: Vec<Group> = adapters
        .iter()
        .zip(rows)
        .map(|(p, r)| Group::new(p, r, None))
        .collect();
    let data = blocks(6, 8, 256);
    // Groups 0 and 2 get other tokens; group 1 (rows 2 and 3) keeps its own.
    let mut other: Vec<Vec<u32>> = data
        .iter()
        .map(|b| b.iter().map(|t| (t * 7 + 5) % 256).collect())
        .collect();
    other[2..4].clone_from_slice(&data[2..4]);
    for budget in [usize::MAX, 4] {
        host.llama.activation_budget = budget;
        let run = |d: &[Vec<u32>]| {
            let refs: Vec<&Vec<u32>> = d.iter().collect();
            host.losses_and_gradients(&refs, &groups).unwrap()
        };
        let (a, b) = (run(&data), run(&other));
        let (la, ga) = &a[1];
        let (lb, gb) = &b[1];
        let scale = ga.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0);
        assert!(
            (la - lb).abs() <= 1e-6 * la.abs(),
            "budget {budget}: {la} vs {lb}"
        );
        for (i, (x, y)) in ga.iter().zip(gb).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 * scale,
                "budget {budget}: gradient {i}: {x} vs {y}"
            );
        }
        for k in [0, 2] {
            let moved = a[k]
                .1
                .iter()
                .zip(&b[k].1)
                .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                moved > 1e-3 * scale,
                "budget {budget}: group {k} ignored its rows"
            );
        }
    }
}

/// On burn-flex with f32 weights, the host copy reads the embedding table
/// and the backward products' weights from the model's own storage (not
/// copied: these are a large part of the step's memory), and reads them
/// right: the shared rows are the model's values.
#[cfg(feature = "flex")]
#[test]
fn the_host_copy_shares_the_models_f32_storage() {
    use super::weights::HostRows;
    let model: Model<AB> =
        Model::load(LoadOptions::path(fixture("hf/llama"), &Default::default())).unwrap();
    let host = HostLlama::from_model(&model).unwrap().expect("a Llama");
    assert!(matches!(host.embed, HostRows::Shared { .. }));
    let Model::Llama(m) = &model else {
        panic!("a Llama")
    };
    let table = privmix_models::runtime::to_vec(m.embed_tokens().clone()).unwrap();
    assert_eq!(host.embedding(), table.as_slice());
    for lin in host
        .blocks
        .iter()
        .flat_map(|b| b.proj.iter())
        .chain([&host.head])
    {
        assert!(matches!(lin.w, HostRows::Shared { .. }));
        let w = crate::lora::transpose(&lin.w_t, lin.fan_in, lin.fan_out);
        assert_eq!(lin.w.as_slice(), w.as_slice());
    }
}

/// The trainers take the host step exactly where the model's execution plan
/// says so: a Llama on `Autodiff<Flex>` (whatever its file format), not
/// Gemma (its plan names why), not when burn autodiff is asked for.
#[test]
fn the_execution_plan_chooses_the_host_step() {
    use crate::train::{StepPath, TrainConfig, Trainer};
    let trainer = |model: &Model<AB>, path| {
        let lora = LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]).unwrap();
        Trainer::new(
            model,
            blocks(2, 5, 64),
            Vec::new(),
            TrainConfig::new(lora, 1, 3),
        )
        .unwrap()
        .with_step_path(path)
        .uses_host_step()
        .unwrap()
    };
    for (name, model) in models() {
        assert!(model.plan().host_training, "{name}: {}", model.plan());
        assert!(trainer(&model, StepPath::Fastest), "{name}");
        assert!(!trainer(&model, StepPath::Autodiff), "{name}");
    }
    let gemma: Model<AB> =
        Model::load(LoadOptions::path(fixture("hf/gemma"), &Default::default())).unwrap();
    assert!(!gemma.plan().host_training);
    assert!(
        gemma.plan().to_string().contains("no host training step"),
        "{}",
        gemma.plan()
    );
    assert!(!trainer(&gemma, StepPath::Fastest));
    let plain: Model<Flex> =
        Model::load(LoadOptions::path(fixture("hf/llama"), &Default::default())).unwrap();
    assert!(!plain.plan().host_training, "no autodiff, no training step");
}

/// FNV-1a over the bits of each group's loss and gradient.
fn step_digest(out: &[(f64, Vec<f32>)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (loss, grad) in out {
        eat(&loss.to_bits().to_le_bytes());
        for g in grad {
            eat(&g.to_bits().to_le_bytes());
        }
    }
    h
}

/// The step's digests on this machine's instruction set: each fixture's
/// losses and gradients for two groups (one with dropout) over 3 blocks of
/// 9 tokens. Moving the step's operations between crates must keep these
/// bits (the cached training results of the benchmarks depend on them).
///
/// Golden: produced by `ensemble/src/train/host/step_digests.sh`, run at
/// the commit that added this test (before the products and the attention
/// moved to `privmix-models`). The products (`gemm`'s kernels) and `exp`
/// choose their code by instruction set, so the bits are pinned for the
/// instruction set they were produced on; elsewhere only the agreement
/// tests above apply.
const STEP_DIGESTS: (privmix_models::cpu::Isa, [u64; 3]) = (
    privmix_models::cpu::Isa::Avx512Vnni,
    [0x6a49650b32a8d70b, 0x7c6f9de095943400, 0xe961c2a02aa4ac60],
);

/// The instruction set that decides the training step's bits. AMX int8 tiles
/// serve only the products of tiled weights with 8-bit rows, which training
/// never takes; a CPU with them runs the step's f32 products and `exp` on
/// AVX-512 VNNI's code.
fn training_isa(detected: privmix_models::cpu::Isa) -> privmix_models::cpu::Isa {
    use privmix_models::cpu::Isa;
    match detected {
        Isa::AmxInt8 => Isa::Avx512Vnni,
        other => other,
    }
}

#[test]
fn the_step_keeps_its_bits() {
    let digests: Vec<u64> = models()
        .iter()
        .map(|(_, model)| {
            let host = HostModel::from_model(model).unwrap().expect("a Llama");
            let (p1, p2) = (params(model, 3), params(model, 4));
            let data = blocks(3, 9, 256);
            let refs: Vec<&Vec<u32>> = data.iter().collect();
            let dropout = Dropout {
                p: 0.25,
                seed: 11,
                pass: 2,
            };
            let groups = [Group::new(&p1, 2, None), Group::new(&p2, 1, Some(dropout))];
            step_digest(&host.losses_and_gradients(&refs, &groups).unwrap())
        })
        .collect();
    if std::env::var_os("PRIVMIX_PRINT_STEP_DIGESTS").is_some() {
        println!(
            "isa {:?} digests {digests:#018x?}",
            privmix_models::cpu::Isa::detected()
        );
    }
    let (isa, want) = STEP_DIGESTS;
    if training_isa(privmix_models::cpu::Isa::detected()) == isa {
        assert_eq!(digests, want, "the host step's bits changed on {isa:?}");
    }
}
