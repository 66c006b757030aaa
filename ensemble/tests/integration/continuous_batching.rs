//! Continuous batching: requests of their own prompts and row
//! layouts, each prefilled in a decoder of its own (whole, or in chunks as
//! a server with a per-step prefill budget does) or together with the
//! requests arriving at the same step (one decoder, prompts left-padded:
//! `Decoder::prefill_rows`; a request that ends there dropped with
//! `Decoder::retain_rows`), join one running batch at step boundaries
//! (`Decoder::append`) and leave it when done (`Decoder::retain_rows`, or
//! `Decoder::leave`, the others in order or not). Every row's
//! log-probabilities at every step
//! equal those of its request decoded alone: bit for bit where a row's
//! computation does not depend on the rows beside it (plain flex with f32
//! safetensors weights: per-row products, and host attention, in which the
//! masked padding slots get probability exactly 0), and otherwise within
//! the padded-batch tolerance of `models/tests/integration/runtime_batch_props.rs`
//! (1e-5; 1e-3 through an f16 cache, where a sum-order difference can move
//! a key to the neighbouring f16) where burn's ops sum the padded slots
//! (`Autodiff<Flex>`), and of the host step's tests (1e-4) for the Q8_0
//! GGUF, whose products switch kernels at 8 rows on AVX-512 CPUs. With the
//! tiny Llama (PEFT and random members) and the tiny Gemma 3 (sliding
//! window 4, random members), f32 and f16 caches.

use crate::lora_support;

use burn::backend::{Autodiff, Flex};
use lora_support::*;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_ensemble::rows::{LogProbRows, RowLayout};
use privmix_ensemble::runner::{Decoder, EnsembleError, EnsembleRunner};
use privmix_models::ModelBackend;
use privmix_models::{KvPrecision, LanguageModel, LoadOptions, Model};
use proptest::prelude::*;

/// The padded-batch tolerance of the models' tests (logits there,
/// log-probabilities here).
const TOL: f32 = 1e-5;

/// The same through an f16 cache on the tensor path: keys and values
/// whose f32 sums differ in order may round to neighbouring f16s (2⁻¹¹
/// of them apart).
const F16_TOL: f32 = 1e-3;

/// What a schedule must meet: the same bits, or a tolerance.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Exact,
    Within(f32),
}

/// [`TOL`], or [`F16_TOL`] for an f16 cache.
fn tolerance(kv: KvPrecision) -> Expect {
    Expect::Within(if kv == KvPrecision::F16 { F16_TOL } else { TOL })
}

/// One request: its prompt, its rows, the step boundary at which it joins
/// the batch and how many decode steps it runs there.
#[derive(Debug, Clone)]
struct Request {
    prompt: Vec<u32>,
    layout: RowLayout,
    arrive: usize,
    steps: usize,
}

/// Row `row`'s token of request `id` at its decode step `step` (each row
/// its own, so that rows swapped or misaligned would show).
fn token(id: usize, row: usize, step: usize, vocab: usize) -> u32 {
    ((17 * id + 31 * row + 7 * step + 5) % vocab) as u32
}

fn tokens(id: usize, rows: usize, step: usize, vocab: usize) -> Vec<u32> {
    (0..rows).map(|row| token(id, row, step, vocab)).collect()
}

type Runner<B> = EnsembleRunner<B, Model<B>>;

/// Request `id` decoded alone: its prefill's rows, then each step's.
fn alone<B: ModelBackend>(runner: &Runner<B>, id: usize, req: &Request) -> Vec<LogProbRows> {
    let vocab = runner.model().vocab_size();
    let mut d = runner.decoder(req.layout.clone()).unwrap();
    let mut out = vec![d.prefill(&req.prompt).unwrap()];
    for step in 0..req.steps {
        let t = tokens(id, req.layout.len(), step, vocab);
        out.push(d.next_log_probs_rows(&t).unwrap());
    }
    out
}

/// How finished requests leave the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaving {
    /// `Decoder::retain_rows`, the others in order.
    Retain,
    /// `Decoder::leave` (compaction deferred), the others in order (rows
    /// after a leaving one move in place).
    LeaveInOrder,
    /// `Decoder::leave`, the others in reverse order (rows copied).
    LeaveReversed,
}

const LEAVINGS: [Leaving; 3] = [
    Leaving::Retain,
    Leaving::LeaveInOrder,
    Leaving::LeaveReversed,
];

/// How arriving requests are prefilled before they join the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefilling {
    /// Each in a decoder of its own, its whole prompt at once.
    Alone,
    /// Each in a decoder of its own, its prompt in chunks of this many
    /// tokens (one forward each).
    Chunked(usize),
    /// Those arriving at one step together, in one decoder.
    Together,
}

const PREFILLINGS: [Prefilling; 4] = [
    Prefilling::Alone,
    Prefilling::Chunked(1),
    Prefilling::Chunked(4),
    Prefilling::Together,
];

/// Prefills the requests `arriving` at one step as `how` says, pushes each
/// one's prefill rows to `out`, and returns the decoders to join the batch
/// (in that order, each request's rows in the order of `arriving`; a
/// request of no steps is dropped before it joins).
fn prefill_arrivals<'r, B: ModelBackend>(
    runner: &'r Runner<B>,
    reqs: &[Request],
    arriving: &[usize],
    how: Prefilling,
    out: &mut [Vec<LogProbRows>],
) -> Vec<Decoder<'r, B, Model<B>>> {
    let mut joining = Vec::new();
    match how {
        Prefilling::Alone | Prefilling::Chunked(_) => {
            for &id in arriving {
                let req = &reqs[id];
                let mut d = runner.decoder(req.layout.clone()).unwrap();
                let chunk = match how {
                    Prefilling::Chunked(n) => n,
                    _ => req.prompt.len(),
                };
                let mut last = None;
                for piece in req.prompt.chunks(chunk) {
                    last = Some(d.prefill(piece).unwrap());
                }
                out[id].push(last.unwrap());
                if req.steps > 0 {
                    joining.push(d);
                }
            }
        }
        Prefilling::Together => {
            if arriving.is_empty() {
                return joining;
            }
            let rows: Vec<Option<usize>> = arriving
                .iter()
                .flat_map(|&id| reqs[id].layout.rows().iter().copied())
                .collect();
            let contexts: Vec<Vec<u32>> = arriving
                .iter()
                .flat_map(|&id| std::iter::repeat_n(reqs[id].prompt.clone(), reqs[id].layout.len()))
                .collect();
            let mut d = runner.decoder(RowLayout::custom(rows)).unwrap();
            let all = d.prefill_rows(&contexts).unwrap();
            let (mut first, mut keep) = (0, Vec::new());
            for &id in arriving {
                let n = reqs[id].layout.len();
                out[id].push(all.slice(first..first + n).unwrap());
                if reqs[id].steps > 0 {
                    keep.extend(first..first + n);
                }
                first += n;
            }
            if keep.is_empty() {
                return joining;
            }
            if keep.len() < d.len() {
                d.retain_rows(&keep).unwrap();
            }
            joining.push(d);
        }
    }
    joining
}

/// Every request through one batch: at each step boundary the finished
/// requests leave (as `leaving` says) and the arriving ones, each prefilled
/// alone, join; then one step of all rows. Returns each request's prefill
/// and step rows. Checks on the way that the cache holds as many slots per
/// row as the longest context in the batch (padding left by rows that left
/// is gone), or with `Decoder::leave` at most twice as many (or 16).
fn batched<B: ModelBackend>(
    runner: &Runner<B>,
    reqs: &[Request],
    leaving: Leaving,
    prefilling: Prefilling,
) -> Vec<Vec<LogProbRows>> {
    let vocab = runner.model().vocab_size();
    let mut batch = runner.empty_decoder();
    assert!(batch.is_empty());
    let mut active: Vec<usize> = Vec::new();
    let mut done = vec![0usize; reqs.len()];
    let mut out = vec![Vec::new(); reqs.len()];
    let last_arrival = reqs.iter().map(|r| r.arrive).max().unwrap_or(0);
    for clock in 0.. {
        let mut starts = Vec::new();
        let mut first = 0;
        for &id in &active {
            starts.push((id, first));
            first += reqs[id].layout.len();
        }
        starts.retain(|&(id, _)| done[id] < reqs[id].steps);
        if leaving == Leaving::LeaveReversed {
            starts.reverse();
        }
        active = starts.iter().map(|&(id, _)| id).collect();
        let keep: Vec<usize> = starts
            .iter()
            .flat_map(|&(id, start)| start..start + reqs[id].layout.len())
            .collect();
        match leaving {
            Leaving::Retain => batch.retain_rows(&keep).unwrap(),
            Leaving::LeaveInOrder | Leaving::LeaveReversed => batch.leave(&keep).unwrap(),
        }
        let arriving: Vec<usize> = (0..reqs.len())
            .filter(|&id| reqs[id].arrive == clock)
            .collect();
        for d in prefill_arrivals(runner, reqs, &arriving, prefilling, &mut out) {
            batch.append(d).unwrap();
        }
        active.extend(arriving.iter().filter(|&&id| reqs[id].steps > 0));
        let rows: usize = active.iter().map(|&id| reqs[id].layout.len()).sum();
        assert_eq!(batch.len(), rows);
        let longest = (0..rows).map(|r| batch.context_len(r).unwrap()).max();
        let longest = longest.unwrap_or(0);
        if leaving == Leaving::Retain {
            assert_eq!(batch.cache_slots(), longest, "step {clock}");
        } else {
            let slots = batch.cache_slots();
            assert!(
                longest <= slots && slots <= (2 * longest).max(16),
                "step {clock}: {slots} slots, longest context {longest}"
            );
        }
        if active.is_empty() {
            if clock >= last_arrival {
                break;
            }
            continue;
        }
        let t: Vec<u32> = active
            .iter()
            .flat_map(|&id| tokens(id, reqs[id].layout.len(), done[id], vocab))
            .collect();
        let step = batch.next_log_probs_rows(&t).unwrap();
        assert_eq!(step.rows(), rows);
        let mut first = 0;
        for &id in &active {
            let n = reqs[id].layout.len();
            out[id].push(step.slice(first..first + n).unwrap());
            done[id] += 1;
            first += n;
        }
    }
    out
}

/// The largest difference between joined and alone over every request,
/// step and row, and whether all were equal bit for bit.
fn compare<B: ModelBackend>(
    runner: &Runner<B>,
    reqs: &[Request],
    leaving: Leaving,
    prefilling: Prefilling,
) -> (f32, bool) {
    let joined = batched(runner, reqs, leaving, prefilling);
    let (mut worst, mut exact) = (0.0f32, true);
    for (id, req) in reqs.iter().enumerate() {
        let want = alone(runner, id, req);
        assert_eq!(joined[id].len(), want.len(), "request {id}: steps");
        for (step, (got, want)) in joined[id].iter().zip(&want).enumerate() {
            assert_eq!(got.layout(), want.layout(), "request {id} step {step}");
            let (g, w) = (got.as_flat(), want.as_flat());
            assert!(g.iter().all(|x| x.is_finite()));
            exact &= g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            worst = worst.max(max_abs_diff(g, w));
        }
    }
    (worst, exact)
}

/// Three members over `model`: on the tiny Llama the PEFT fixtures and a
/// random adapter; on other bases random adapters only.
fn members<B: ModelBackend>(model: &Model<B>, llama: bool) -> Vec<LoraAdapter<B>> {
    let base = model.base_shapes().unwrap();
    let device = model.device();
    let random = |r: usize, targets: &[&str], seed: u64| {
        let c = LoraConfig::new(r, 2.0 * r as f64, targets).unwrap();
        LoraAdapter::random(c, &base, 0.1, seed, &device).unwrap()
    };
    let third = random(
        3,
        &["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        7,
    );
    if llama {
        let peft = |name: &str| LoraAdapter::load_peft(peft_dir(name), &base, &device).unwrap();
        vec![peft("full"), peft("rslora"), third]
    } else {
        vec![
            random(4, &["q_proj", "v_proj", "down_proj"], 3),
            random(2, &["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"], 5),
            third,
        ]
    }
}

fn runner<B: ModelBackend>(model: Model<B>, llama: bool, kv: KvPrecision) -> Runner<B> {
    let ms = members(&model, llama);
    EnsembleRunner::new(model, &ms)
        .unwrap()
        .with_kv_precision(kv)
}

/// Three requests: A (public + 3 members, 10-token prompt) from the start
/// for 6 steps; B (members 2 and 0, 3 tokens) joins at step 2 and leaves
/// early, after 2 steps; C (SubMix pair (1, 2) behind the public row, 9
/// tokens, a prefill longer than a host step) joins at step 3 and outlives
/// A, whose leaving frees the 4 slots C's rows never held. Up to 9 rows at
/// once.
fn schedule() -> Vec<Request> {
    vec![
        Request {
            prompt: vec![5, 17, 99, 3, 250, 8, 41, 77, 12, 200],
            layout: RowLayout::public_and_members(3),
            arrive: 0,
            steps: 6,
        },
        Request {
            prompt: vec![9, 8, 7],
            layout: RowLayout::members(&[2, 0]),
            arrive: 2,
            steps: 2,
        },
        Request {
            prompt: (0..9).map(|i| (40 + 19 * i) % 256).collect(),
            layout: RowLayout::submix_pairs(&[(1, 2)]),
            arrive: 3,
            steps: 5,
        },
    ]
}

fn check_schedule<B: ModelBackend>(runner: &Runner<B>, expect: Expect, what: &str) {
    check_schedule_leaving(runner, expect, what, Leaving::Retain);
}

fn check_schedule_leaving<B: ModelBackend>(
    runner: &Runner<B>,
    expect: Expect,
    what: &str,
    leaving: Leaving,
) {
    let (worst, bitwise) = compare(runner, &schedule(), leaving, Prefilling::Alone);
    println!(
        "{what}, {leaving:?}: joined vs alone max |Δ log p| {worst:e}, bit for bit: {bitwise}"
    );
    match expect {
        Expect::Exact => assert!(bitwise, "{what}: rows differ from alone by up to {worst}"),
        Expect::Within(tol) => assert!(worst <= tol, "{what}: rows differ from alone by {worst}"),
    }
}

#[test]
fn joined_requests_equal_each_alone_on_the_host_path() {
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let r = runner(tiny_llama(), true, kv);
        for leaving in LEAVINGS {
            check_schedule_leaving(
                &r,
                Expect::Exact,
                &format!("tiny llama, plain flex, {kv:?} cache"),
                leaving,
            );
        }
    }
}

/// What prefilling as `how` must meet on the host path: the same bits
/// alone; within [`TOL`] ([`F16_TOL`] through an f16 cache, where a later
/// chunk reads the earlier ones' keys and values rounded to f16 while a
/// whole prompt attends its own in f32) in chunks or together, whose
/// forwards take
/// another route than the request's whole prompt alone (a chunk of at most
/// `HOST_QUERIES_MAX` tokens the host steps where the whole prompt goes
/// through burn's products, or the reverse; prompts padded to a longer one
/// through burn's products, which sum the padded slots), so that sums run
/// in another order. The steps after the prefill are those of the batch.
fn host_expect(how: Prefilling, kv: KvPrecision) -> Expect {
    match how {
        Prefilling::Alone => Expect::Exact,
        Prefilling::Chunked(_) | Prefilling::Together => tolerance(kv),
    }
}

/// Arrivals prefilled in chunks, or together with the others arriving at
/// the same step (B and C arrive together here), decode as each alone.
#[test]
fn requests_prefilled_in_chunks_or_together_equal_each_alone() {
    let mut reqs = schedule();
    reqs[2].arrive = reqs[1].arrive;
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let r = runner(tiny_llama(), true, kv);
        for prefilling in PREFILLINGS {
            let (worst, bitwise) = compare(&r, &reqs, Leaving::LeaveInOrder, prefilling);
            let what = format!("{kv:?} cache, {prefilling:?}");
            println!("{what}: max |Δ log p| {worst:e}, bit for bit: {bitwise}");
            match host_expect(prefilling, kv) {
                Expect::Exact => assert!(bitwise, "{what}: rows differ by up to {worst}"),
                Expect::Within(tol) => assert!(worst <= tol, "{what}: rows differ by {worst}"),
            }
        }
    }
}

#[test]
fn joined_requests_equal_each_alone_with_a_sliding_window() {
    let dir = llama_dir().join("../gemma3");
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let model = Model::<Flex>::load(LoadOptions::path(&dir, &dev())).unwrap();
        check_schedule(
            &runner(model, false, kv),
            Expect::Exact,
            &format!("tiny gemma 3, plain flex, {kv:?} cache"),
        );
    }
}

/// The Q8_0 GGUF's decode steps run in host memory end to end
/// (`llama/host_step.rs`). On an AVX-512 CPU its products take another
/// kernel from 8 rows (`f32_tiles`), whose sums run in another order, so a
/// row there differs from alone by rounding, within the tolerance the
/// host step's own tests give two such kernels (1e-4,
/// `models/tests/integration/llama_host_step.rs`); elsewhere bit for bit.
#[test]
fn joined_requests_equal_each_alone_through_the_host_step() {
    let path = llama_dir().join("../../gguf/llama_q8_0.gguf");
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let model = Model::<Flex>::load(LoadOptions::path(&path, &dev())).unwrap();
        let tol = if kv == KvPrecision::F16 {
            F16_TOL
        } else {
            1e-4
        };
        check_schedule(
            &runner(model, true, kv),
            Expect::Within(tol),
            &format!("tiny llama Q8_0 GGUF, {kv:?} cache"),
        );
    }
}

/// The server's default products: 8-bit activations
/// (`DecodeProducts::Int8Activations`), which take every product through
/// the same integer-sum kernel whatever its number of rows, so a row's
/// log-probabilities do not depend on the rows beside it: joined requests
/// equal each alone bit for bit through an f32 cache, and within the f16
/// cache's tolerance through an f16 one (the cache the server's default
/// `--f16-kv` keeps).
#[test]
fn joined_requests_equal_each_alone_with_int8_activations() {
    use privmix_models::DecodeProducts;
    let path = llama_dir().join("../../gguf/llama_q8_0.gguf");
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let model = Model::<Flex>::load(
            LoadOptions::path(&path, &dev()).decode_products(DecodeProducts::Int8Activations),
        )
        .unwrap();
        // The fixture's products really take 8-bit activations (their widths are
        // multiples of 16; `runner.rs` shows they differ from the f32 path's).
        assert!(model.plan().host_int8, "{}", model.plan());
        let expect = if kv == KvPrecision::F16 {
            Expect::Within(F16_TOL)
        } else {
            Expect::Exact
        };
        check_schedule(
            &runner(model, true, kv),
            expect,
            &format!("tiny llama Q8_0 GGUF, 8-bit activations, {kv:?} cache"),
        );
    }
}

/// On `Autodiff<Flex>` the caches hold burn tensors and attention is
/// burn's eager attention over the padded slots.
#[test]
fn joined_requests_equal_each_alone_on_the_tensor_path() {
    type AB = Autodiff<Flex>;
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let model = Model::<AB>::load(LoadOptions::path(llama_dir(), &Default::default())).unwrap();
        check_schedule(
            &runner(model, true, kv),
            tolerance(kv),
            &format!("tiny llama, Autodiff<Flex> tensors, {kv:?} cache"),
        );
    }
}

/// A request's layout: public and members, members only, or public rows.
fn layouts() -> impl Strategy<Value = RowLayout> {
    prop_oneof![
        (0usize..=3).prop_map(RowLayout::public_and_members),
        prop::collection::vec(0usize..3, 1..=3).prop_map(|m| RowLayout::members(&m)),
        (1usize..=2).prop_map(RowLayout::public_only),
    ]
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    let request = (
        prop::collection::vec(0u32..256, 1..=14),
        layouts(),
        0usize..5,
        0usize..5,
    )
        .prop_map(|(prompt, layout, arrive, steps)| Request {
            prompt,
            layout,
            arrive,
            steps,
        });
    prop::collection::vec(request, 2..=3)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random schedules of 2–3 requests (prompts of 1–14 tokens, any
    /// layouts, joining at steps 0–4, each leaving after 0–4 steps,
    /// prefilled alone, in chunks or together): rows equal their request
    /// alone, bit for bit on the host path where prefilled alone, within
    /// [`TOL`] (or [`F16_TOL`]) in chunks or together.
    #[test]
    fn random_join_and_leave_schedules_equal_each_request_alone(
        reqs in requests(),
        f16 in any::<bool>(),
        tensors in any::<bool>(),
        leaving in 0usize..3,
        prefilling in 0usize..4,
    ) {
        let kv = if f16 { KvPrecision::F16 } else { KvPrecision::F32 };
        let (leaving, prefilling) = (LEAVINGS[leaving], PREFILLINGS[prefilling]);
        let (worst, exact) = if tensors {
            let model = Model::<Autodiff<Flex>>::load(LoadOptions::path(llama_dir(), &Default::default())).unwrap();
            compare(&runner(model, true, kv), &reqs, leaving, prefilling)
        } else {
            compare(&runner(tiny_llama(), true, kv), &reqs, leaving, prefilling)
        };
        if tensors {
            let tol = if f16 { F16_TOL } else { TOL };
            prop_assert!(worst <= tol, "tensor path: {}", worst);
        } else {
            match host_expect(prefilling, kv) {
                Expect::Exact => prop_assert!(exact, "host path: rows differ by up to {}", worst),
                Expect::Within(tol) => prop_assert!(worst <= tol, "host path, chunks: {}", worst),
            }
        }
    }
}

#[test]
fn empty_batches_join_and_drain() {
    let r = runner(tiny_llama(), true, KvPrecision::F32);
    let mut batch = r.empty_decoder();
    assert_eq!((batch.len(), batch.cache_slots()), (0, 0));
    assert!(matches!(
        batch.next_log_probs_rows(&[]),
        Err(EnsembleError::BadInput(_))
    ));
    assert!(matches!(
        batch.prefill(&[1, 2]),
        Err(EnsembleError::BadInput(_))
    ));
    assert!(matches!(
        batch.next_log_probs(3),
        Err(EnsembleError::BadInput(_))
    ));
    // An empty decoder joined to an empty one, and to a prefilled one.
    batch.append(r.empty_decoder()).unwrap();
    let mut one = r.decoder(RowLayout::public_and_members(1)).unwrap();
    let first = one.prefill(&[4, 5, 6]).unwrap();
    let mut copy = one.clone();
    batch.append(one).unwrap();
    assert_eq!((batch.len(), batch.cache_slots()), (2, 3));
    assert_eq!(batch.context_len(1), Some(3));
    assert_eq!(batch.context_len(2), None);
    let got = batch.next_log_probs_rows(&[7, 8]).unwrap();
    assert_eq!(got, copy.next_log_probs_rows(&[7, 8]).unwrap());
    assert_ne!(got.row(0), first.row(0));
    // Drained, then refilled.
    batch.retain_rows(&[]).unwrap();
    assert_eq!((batch.len(), batch.cache_slots()), (0, 0));
    let mut again = r.decoder(RowLayout::members(&[2])).unwrap();
    again.prefill(&[1]).unwrap();
    let mut twin = again.clone();
    batch.append(again).unwrap();
    assert_eq!(
        batch.next_log_probs_rows(&[9]).unwrap(),
        twin.next_log_probs_rows(&[9]).unwrap()
    );
}

#[test]
fn rows_kept_in_any_order_keep_their_members_and_contexts() {
    let r = runner(tiny_llama(), true, KvPrecision::F32);
    let mut a = r.decoder(RowLayout::public_and_members(2)).unwrap();
    a.prefill(&[10, 11, 12, 13]).unwrap();
    let mut b = r.decoder(RowLayout::members(&[1])).unwrap();
    b.prefill(&[20, 21]).unwrap();
    let (mut a_alone, mut b_alone) = (a.clone(), b.clone());
    a.append(b).unwrap();
    assert_eq!(a.layout().rows(), &[None, Some(0), Some(1), Some(1)]);
    // Row 3 (b's) first, then a's row 1; the others leave.
    a.retain_rows(&[3, 1]).unwrap();
    assert_eq!(a.layout().rows(), &[Some(1), Some(0)]);
    assert_eq!(
        (a.context_len(0), a.context_len(1), a.cache_slots()),
        (Some(2), Some(4), 4)
    );
    let got = a.next_log_probs_rows(&[30, 31]).unwrap();
    let want_b = b_alone.next_log_probs_rows(&[30]).unwrap();
    let want_a = a_alone.next_log_probs_rows(&[0, 31, 0]).unwrap();
    assert_eq!(got.row(0), want_b.row(0));
    assert_eq!(got.row(1), want_a.row(1));
    let (first, second) = (got.slice(0..1).unwrap(), got.slice(1..2).unwrap());
    assert_eq!(first.layout().rows(), &[Some(1)]);
    assert_eq!((first.row(0), second.row(0)), (got.row(0), got.row(1)));
    assert!(got.slice(1..3).is_none());
    assert_eq!(got.slice(2..2).unwrap().rows(), 0);
}

#[test]
fn bad_joins_and_row_indices_get_typed_errors() {
    let model = tiny_llama();
    let ms = members(&model, true);
    let r = EnsembleRunner::new(model.clone(), &ms).unwrap();
    let other = EnsembleRunner::new(model, &ms).unwrap();
    let mut d = r.decoder(RowLayout::public_and_members(3)).unwrap();
    d.prefill(&[1, 2, 3]).unwrap();
    let before = d.clone().next_log_probs(4).unwrap();
    let mut foreign = other.decoder(RowLayout::members(&[0])).unwrap();
    foreign.prefill(&[5]).unwrap();
    assert!(matches!(d.append(foreign), Err(EnsembleError::BadInput(_))));
    assert!(matches!(
        d.retain_rows(&[0, 4]),
        Err(EnsembleError::BadInput(_))
    ));
    assert_eq!(d.len(), 4);
    assert_eq!(d.next_log_probs(4).unwrap(), before);
    assert!(matches!(
        d.next_log_probs_rows(&[1, 2]),
        Err(EnsembleError::BadInput(_))
    ));
}
