//! A tenant budget refusing one request's charge in the middle of a batched step
//! (issues #40/#42), at the engine: three requests of three tenants decoded together
//! on the tiny Llama fixture (models/tests/fixtures/hf/llama, vocabulary 256) with two
//! random PEFT members and PMixED, whose charge per token is data-independent, so a
//! budget can be sized to pay exactly `k` tokens.
//!
//! What is checked, as the step loop (`privmix_mechanisms::step_loop`) promises:
//! the refused request ends with the documented finish (`budget_exhausted` after a
//! token, `Event::Refused`, which the HTTP layer sends as a 429, before any) and no
//! token of the refused step; the other requests of that same step get their tokens
//! and decode to their full length; the ledger holds exactly the accepted charges,
//! step by step, and `ledger verify` passes. The engine's generators are seeded by the
//! OS, so the other requests' tokens cannot be compared with an unrefused run's: their
//! lengths and charges are.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use burn::backend::Flex;
use clap::Parser;
use privmix_accountant::PrivacyBudget;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_models::{LoadOptions, Model, Tokenizer};
use serde_json::Value;

use super::ServeArgs;
use super::engine::{self, EngineConfig, Event, Finish, Job, Note, Usage};
use crate::ledger_store::{LedgerStore, Tenant};
use crate::setup::{Runner, load_runner, load_tokenizer};

/// Tokens every request asks for.
const MAX_TOKENS: u64 = 8;
/// The tenants, in the order their requests are queued.
const TENANTS: [&str; 3] = ["alice", "bob", "carol"];

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// A folder removed at drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "privmix-engine-refusal-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The model, its tokenizer and the engine's configuration, as `privmix serve`
/// builds them from its arguments (no stop ids or strings: every request that is
/// not refused decodes `MAX_TOKENS` tokens).
struct Served {
    runner: Runner<Flex>,
    tokenizer: Tokenizer,
    args: ServeArgs,
    protected: privmix_accountant::ProtectedSet,
}

fn served(dir: &Path) -> Served {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let llama = root.join("../models/tests/fixtures/hf/llama");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(llama.join(f), model.join(f)).unwrap();
    }
    std::fs::copy(
        root.join("tests/fixtures/tokenizer/tokenizer.json"),
        model.join("tokenizer.json"),
    )
    .unwrap();
    let device = Default::default();
    let base = Model::<Flex>::load(LoadOptions::path(&model, &device))
        .unwrap()
        .base_shapes()
        .unwrap();
    let mut argv: Vec<String> = [
        "serve",
        "--model",
        model.to_str().unwrap(),
        "--ledger",
        "unused",
        "--no-auth",
        "--max-tokens",
        "8",
    ]
    .map(String::from)
    .to_vec();
    for i in 0..2u64 {
        let config = LoraConfig::new(2, 4.0, &["q_proj", "v_proj", "down_proj"]).unwrap();
        let adapter = LoraAdapter::<Flex>::random(config, &base, 0.3, 100 + i, &device).unwrap();
        let path = dir.join(format!("adapter{i}"));
        adapter.save_peft(&path).unwrap();
        argv.extend(["--adapter".to_string(), path.display().to_string()]);
    }
    let args = Cli::try_parse_from(argv).unwrap().serve;
    let model_args = args.model_args();
    let runner = load_runner::<Flex>(&model_args, &device).unwrap();
    let tokenizer = load_tokenizer(&model_args).unwrap().unwrap();
    let protected = crate::protected::protected_set(&model_args.adapters).unwrap();
    Served {
        runner,
        tokenizer,
        args,
        protected,
    }
}

/// One request's notes, in the order the engine sent them.
struct Notes(Vec<Note>);

impl Notes {
    /// The events of each step, and the usage after it.
    fn steps(&self) -> Vec<(&[Event], &Usage)> {
        self.0
            .iter()
            .filter_map(|n| match n {
                Note::Step {
                    events,
                    usage: Some(u),
                    ..
                } => Some((events.as_slice(), u)),
                Note::Step { usage: None, .. } => panic!("a paced engine sends usage"),
                _ => None,
            })
            .collect()
    }

    /// The event that ended the request.
    fn end(&self) -> &Event {
        let steps = self.steps();
        let (events, _) = steps.last().expect("at least one step");
        let last = events.last().expect("the last step ends the request");
        assert!(last.ends(), "{last:?}");
        last
    }
}

/// Runs the engine over one request per tenant of `TENANTS` (each with the budget
/// `budgets` gives it), all queued before it starts, so that they are admitted
/// together and decoded in the same steps; a fresh file ledger of ε = 40 at `ledger`.
fn run_engine(
    s: &Served,
    ledger: &Path,
    budgets: [Option<PrivacyBudget>; 3],
) -> (Vec<Notes>, Box<dyn LedgerStore>) {
    let mut store =
        crate::ledger_store::open_store(ledger.to_str().unwrap(), &s.protected, Some(40.0), None)
            .unwrap();
    let config = EngineConfig {
        mechanism: s.args.model.mechanism,
        params: s.args.model.params.clone(),
        request_epsilon: s.args.request_epsilon,
        max_tokens: s.args.max_tokens,
        max_batch: 4,
        prefill_budget: s.args.prefill_budget,
        stop_ids: Vec::new(),
        delta: store.budget().unwrap().delta(),
        // Every step's note carries the usage so far.
        paced: true,
        phase_timings: false,
    };
    let (jobs, queue) = mpsc::channel();
    let mut receivers = Vec::new();
    for (name, budget) in TENANTS.into_iter().zip(budgets) {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        jobs.send(Job {
            prompt: b"Hello".iter().map(|&b| u32::from(b)).collect(),
            max_tokens: MAX_TOKENS,
            temperature: 1.0,
            stop: Vec::new(),
            tenant: Some(Tenant {
                name: name.into(),
                budget,
            }),
            events,
        })
        .unwrap();
        receivers.push(rx);
    }
    drop(jobs);
    engine::run(&s.runner, &s.tokenizer, store.as_mut(), &config, &queue).unwrap();
    let notes = receivers
        .into_iter()
        .map(|mut rx| {
            let mut notes = Vec::new();
            while let Ok(n) = rx.try_recv() {
                notes.push(n);
            }
            Notes(notes)
        })
        .collect();
    (notes, store)
}

/// The ledger's step records, each as the (tenant, count) of its runs, sorted (a
/// step commits in request order, which changes as requests leave the batch).
fn ledger_steps(ledger: &Path) -> Vec<Vec<(String, u64)>> {
    let mut out = Vec::new();
    crate::ledger_cmd::export(&mut out, ledger.to_str().unwrap()).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "step")
        .map(|v| {
            v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["tenant"].as_str().unwrap().to_string(),
                        r["count"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .map(|mut runs| {
            runs.sort();
            runs
        })
        .collect()
}

/// `privmix ledger verify` on `ledger`: its report.
fn verify(ledger: &Path) -> String {
    let mut out = Vec::new();
    crate::ledger_cmd::verify_cmd(&mut out, ledger.to_str().unwrap()).unwrap();
    String::from_utf8(out).unwrap()
}

/// Checks a run where alice's budget pays exactly `k` tokens and bob's and carol's
/// requests have no budget of their own, against `reference`: the ε alice's usage
/// reported after each step of a run where nobody was refused.
fn check_refusal_after(s: &Served, dir: &Path, reference: &[f64], k: usize) {
    // Midway between what k and k + 1 charges compose to: pays k, refuses the next.
    let paid = if k == 0 { 0.0 } else { reference[k - 1] };
    let epsilon = (paid + reference[k]) / 2.0;
    let delta = crate::ledger_common::DEFAULT_DELTA;
    let budget = PrivacyBudget::new(epsilon, delta).unwrap();
    let ledger = dir.join(format!("ledger-refused-after-{k}"));
    let (notes, mut store) = run_engine(s, &ledger, [Some(budget), None, None]);

    // (a) alice: k steps of tokens, then, at step k, the refusal, after only the text
    // her k charged tokens still held back (an incomplete character at the end).
    let alice = notes[0].steps();
    assert_eq!(alice.len(), k + 1, "alice's steps");
    for (events, _) in &alice[..k] {
        assert!(events.iter().all(|e| !e.ends()), "{events:?}");
    }
    let (refused_step, _) = alice[k];
    let held_back = &refused_step[..refused_step.len() - 1];
    assert!(
        held_back.len() <= usize::from(k > 0)
            && held_back.iter().all(|e| matches!(e, Event::Text(_))),
        "only held-back text, then the refusal: {refused_step:?}"
    );
    let text: String = alice
        .iter()
        .flat_map(|(events, _)| events.iter())
        .filter_map(|e| match e {
            Event::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    // k > 0 charged byte-level tokens decode to at least one character (a byte that
    // is no whole character becomes U+FFFD at the end); a refusal that kept back the
    // detokeniser's tail would send none when all k bytes start one character.
    assert!(text.chars().count() >= k.min(1), "alice's text {text:?}");
    if k == 0 {
        // Before any token: Refused, which the HTTP layer answers with a 429.
        let Event::Refused { message } = notes[0].end() else {
            panic!("{:?}", notes[0].end());
        };
        assert!(message.contains("alice"), "{message}");
    } else {
        let Event::Done { finish, usage } = notes[0].end() else {
            panic!("{:?}", notes[0].end());
        };
        assert_eq!(*finish, Finish::BudgetExhausted);
        assert_eq!(finish.reason(), "budget_exhausted");
        assert_eq!(usage.completion_tokens, k, "no token of the refused step");
        assert_eq!(usage.privacy.epsilon_spent, reference[k - 1]);
        let left = usage.privacy.tenant_epsilon_left.unwrap();
        assert!((0.0..epsilon).contains(&left), "{left}");
    }

    // (b) bob and carol decoded in the refused step and on, to their full length.
    for other in &notes[1..] {
        let steps = other.steps();
        assert_eq!(steps.len() as u64, MAX_TOKENS);
        assert!(steps[k].0.iter().all(|e| !e.ends()), "{:?}", steps[k].0);
        let Event::Done { finish, usage } = other.end() else {
            panic!("{:?}", other.end());
        };
        assert_eq!(*finish, Finish::Length);
        assert_eq!(usage.completion_tokens as u64, MAX_TOKENS);
        assert_eq!(usage.privacy.epsilon_spent, *reference.last().unwrap());
    }

    // (c) the ledger: one step record per step, alice's charge in the first k only.
    let steps = ledger_steps(&ledger);
    assert_eq!(steps.len() as u64, MAX_TOKENS, "{steps:?}");
    for (i, runs) in steps.iter().enumerate() {
        let mut expected: Vec<(String, u64)> = Vec::new();
        for t in TENANTS {
            if t != "alice" || i < k {
                expected.push((t.to_string(), 1));
            }
        }
        assert_eq!(*runs, expected, "step {i}");
    }
    let alice_spent = store.spent(Some("alice")).unwrap().epsilon(delta).unwrap();
    // Exactly the k accepted charges: no fewer (an under-count), none refused.
    assert!(
        alice_spent.epsilon >= paid * (1.0 - 1e-12) && alice_spent.epsilon <= epsilon,
        "alice spent {} for {k} tokens, {paid} reported",
        alice_spent.epsilon
    );
    let charges = k as u64 + 2 * MAX_TOKENS;
    let report = verify(&ledger);
    assert!(
        report.starts_with("ok:") && report.contains(&format!("({charges} charges)")),
        "{report}"
    );
}

#[test]
fn a_tenant_refused_mid_step_loses_only_its_own_token() {
    let dir = Scratch::new("mid-step");
    let s = served(&dir.0);

    // Nobody refused: every request decodes its 8 tokens, one charge a step each.
    let ledger = dir.0.join("ledger-reference");
    let (notes, _) = run_engine(&s, &ledger, [None, None, None]);
    for n in &notes {
        let Event::Done { finish, usage } = n.end() else {
            panic!("{:?}", n.end());
        };
        assert_eq!(*finish, Finish::Length);
        assert_eq!(usage.completion_tokens as u64, MAX_TOKENS);
    }
    let reference: Vec<f64> = notes[0]
        .steps()
        .iter()
        .map(|(_, u)| u.privacy.epsilon_spent)
        .collect();
    assert!(
        reference.windows(2).all(|w| w[0] < w[1]) && reference[0] > 0.0,
        "each charge adds to alice's ε: {reference:?}"
    );
    assert_eq!(
        ledger_steps(&ledger),
        vec![TENANTS.map(|t| (t.to_string(), 1)).to_vec(); MAX_TOKENS as usize]
    );

    // Refused in the middle (after 3 tokens), and at the first token.
    check_refusal_after(&s, &dir.0, &reference, 3);
    check_refusal_after(&s, &dir.0, &reference, 0);
}
