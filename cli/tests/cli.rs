//! End-to-end runs of the `privmix` binary on the tiny Llama fixture
//! (models/tests/fixtures/hf/llama, vocabulary 256) with the byte-level tokenizer of
//! tests/fixtures/tokenizer and random PEFT adapters written by privmix-ensemble.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use burn::backend::Flex;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_models::Model;
use serde_json::Value;

type B = Flex;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn llama() -> PathBuf {
    fixture("../models/tests/fixtures/hf/llama")
}

fn tokenizer() -> PathBuf {
    fixture("tests/fixtures/tokenizer/tokenizer.json")
}

/// A fresh empty folder under the system temp dir (removed at drop).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("privmix-cli-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `n` random rank-2 adapters (fixed seeds) for the model at `model` into `dir`.
fn write_adapters(model: &Path, dir: &TempDir, n: usize) -> Vec<PathBuf> {
    let device = Default::default();
    let m = Model::<B>::load(model, &device).unwrap();
    let base = m.base_shapes().unwrap();
    (0..n)
        .map(|i| {
            let config = LoraConfig::new(2, 4.0, &["q_proj", "v_proj", "down_proj"]).unwrap();
            let a = LoraAdapter::<B>::random(config, &base, 0.3, 100 + i as u64, &device).unwrap();
            let path = dir.join(&format!("adapter{i}"));
            a.save_peft(&path).unwrap();
            path
        })
        .collect()
}

fn privmix(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(args)
        .output()
        .expect("privmix runs")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_lines(o: &Output) -> Vec<Value> {
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// `generate` with the tiny llama folder, the adapters and the tokenizer, plus `extra`.
fn generate(adapters: &[PathBuf], extra: &[&str]) -> Output {
    generate_with(&llama(), adapters, extra)
}

/// Arguments for 3 tokens from the prompt "xy", charged to a ledger of
/// budget ε = 8 at `ledger`, reported as JSON lines, with seed 3.
fn three_charged_tokens(ledger: &Path) -> [&str; 11] {
    [
        "--prompt",
        "xy",
        "--max-tokens",
        "3",
        "--ledger",
        s(ledger),
        "--epsilon",
        "8",
        "--json",
        "--seed",
        "3",
    ]
}

/// `generate` with `model`, the adapters and the tokenizer, plus `extra`.
fn generate_with(model: &Path, adapters: &[PathBuf], extra: &[&str]) -> Output {
    let tok = tokenizer();
    let mut args = vec!["generate", "--model", s(model), "--tokenizer", s(&tok)];
    for a in adapters {
        args.extend(["--adapter", s(a)]);
    }
    args.extend(extra);
    privmix(&args)
}

#[test]
fn json_lines_parse_and_every_token_is_charged() {
    let dir = TempDir::new("json");
    let adapters = write_adapters(&llama(), &dir, 3);
    let ledger = dir.join("ledger");
    let out = generate(
        &adapters,
        &[
            "--prompt",
            "Hello",
            "--max-tokens",
            "5",
            "--ledger",
            s(&ledger),
            "--epsilon",
            "4",
            "--delta",
            "1e-5",
            "--json",
            "--seed",
            "7",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 6, "5 tokens and a summary");
    let mut last = 0.0;
    for (i, line) in lines[..5].iter().enumerate() {
        assert_eq!(line["index"].as_u64(), Some(i as u64));
        assert!(line["token"].as_u64().unwrap() < 256);
        let eps = line["epsilon"].as_f64().unwrap();
        assert!(
            eps > last,
            "ε grows with every private token: {eps} after {last}"
        );
        last = eps;
    }
    let done = &lines[5];
    assert_eq!(done["done"], Value::Bool(true));
    assert_eq!(done["tokens"].as_u64(), Some(5));
    assert_eq!(done["stop"], "max_tokens");
    assert_eq!(done["epsilon"].as_f64(), Some(last));
    assert!(
        last <= 4.0,
        "calibrated PMixED stays within the budget: {last}"
    );

    // The ledger holds one charge per released token, and reports the same ε.
    let export = privmix(&["ledger", "export", s(&ledger)]);
    assert!(export.status.success(), "{}", stderr(&export));
    let records = json_lines(&export);
    let charges: Vec<&Value> = records.iter().filter(|r| r["kind"] == "charge").collect();
    assert_eq!(charges.len(), 5);
    assert!(charges.iter().all(|c| c["label"] == "pmixed"));
    let verify = privmix(&["ledger", "verify", s(&ledger)]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    assert!(String::from_utf8_lossy(&verify.stdout).contains("5 charges"));
    let show = privmix(&["ledger", "show", s(&ledger)]);
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(
        text.contains(&format!("ε = {last} at δ = 0.00001")),
        "{text}"
    );
}

#[test]
fn ledger_refuses_to_overspend_across_invocations() {
    let dir = TempDir::new("overspend");
    let adapters = write_adapters(&llama(), &dir, 2);
    let ledger = dir.join("ledger");
    // PMixED calibrated so that exactly 3 queries fit ε = 1: the first run spends them all.
    let args = [
        "--prompt",
        "ab",
        "--max-tokens",
        "3",
        "--ledger",
        s(&ledger),
        "--epsilon",
        "1",
        "--seed",
        "1",
    ];
    let first = generate(&adapters, &args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("3 tokens with pmixed"),
        "{}",
        stderr(&first)
    );
    // The second run would need a fourth query: refused before releasing anything.
    let second = generate(&adapters, &args);
    assert!(!second.status.success());
    let msg = stderr(&second);
    assert!(msg.contains("privacy budget exhausted"), "{msg}");
    assert!(msg.contains(s(&ledger)), "{msg}");
    assert!(second.stdout.is_empty(), "nothing released");
    let verify = privmix(&["ledger", "verify", s(&ledger)]);
    assert!(String::from_utf8_lossy(&verify.stdout).contains("3 charges"));
}

#[test]
fn each_mechanism_generates() {
    let dir = TempDir::new("mechs");
    let adapters = write_adapters(&llama(), &dir, 4);
    for (i, mechanism) in ["pmixed", "adapmixed", "submix", "public"]
        .iter()
        .enumerate()
    {
        let ledger = dir.join(&format!("ledger{i}"));
        let mut args = vec!["--mechanism", mechanism];
        args.extend(three_charged_tokens(&ledger));
        let out = generate(&adapters, &args);
        assert!(out.status.success(), "{mechanism}: {}", stderr(&out));
        let lines = json_lines(&out);
        let done = lines.last().unwrap();
        assert_eq!(done["mechanism"], *mechanism);
        assert_eq!(done["tokens"].as_u64(), Some(3), "{mechanism}");
        let eps = done["epsilon"].as_f64().unwrap();
        if *mechanism == "public" {
            assert_eq!(eps, 0.0);
        } else {
            assert!(eps > 0.0 && eps <= 8.0, "{mechanism}: ε = {eps}");
        }
    }
    // The non-private ensemble needs --no-privacy and then touches no ledger.
    let refused = generate(
        &adapters,
        &["--mechanism", "ensemble", "--prompt-ids", "1,2"],
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("--no-privacy"),
        "{}",
        stderr(&refused)
    );
    let out = generate(
        &adapters,
        &[
            "--mechanism",
            "ensemble",
            "--no-privacy",
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "2",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_lines(&out).last().unwrap()["epsilon"], Value::Null);
}

#[test]
fn prompt_ids_without_a_tokenizer_print_ids() {
    let model = llama();
    let out = privmix(&[
        "generate",
        "--model",
        s(&model),
        "--mechanism",
        "public",
        "--no-privacy",
        "--prompt-ids",
        "5,6,7",
        "--max-tokens",
        "4",
        "--seed",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let ids: Vec<u32> = text
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.iter().all(|&t| t < 256));
    // Text without a tokenizer is refused with what to pass.
    let out = privmix(&[
        "generate",
        "--model",
        s(&model),
        "--mechanism",
        "public",
        "--no-privacy",
        "--prompt",
        "hi",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tokenizer"), "{}", stderr(&out));
}

#[test]
fn bad_inputs_fail_with_a_message_naming_the_problem() {
    let dir = TempDir::new("bad");
    let adapters = write_adapters(&llama(), &dir, 1);
    let ledger = dir.join("ledger");
    let common = ["--prompt", "a", "--ledger", s(&ledger), "--epsilon", "1"];

    let missing = dir.join("no-such-adapter");
    let out = generate(&[adapters[0].clone(), missing.clone()], &common);
    assert!(!out.status.success());
    let msg = stderr(&out);
    assert!(
        msg.contains("cannot use adapter") && msg.contains(s(&missing)),
        "{msg}"
    );

    // An adapter made for another base model (the tiny Gemma: other widths).
    let gemma = fixture("../models/tests/fixtures/hf/gemma");
    let foreign = write_adapters(&gemma, &TempDir::new("gemma-adapter"), 1);
    let out = generate(&foreign, &common);
    assert!(!out.status.success());
    let msg = stderr(&out);
    assert!(
        msg.contains("cannot use adapter") && msg.contains(s(&foreign[0])),
        "{msg}"
    );

    let out = generate(
        &adapters,
        &["--mechanism", "no-such-mechanism", "--prompt", "a"],
    );
    assert!(!out.status.success());
    let msg = stderr(&out);
    assert!(
        msg.contains("no-such-mechanism") && msg.contains("--mechanism"),
        "{msg}"
    );

    let out = privmix(&[
        "generate",
        "--model",
        "/no/such/model",
        "--prompt-ids",
        "1",
        "--mechanism",
        "public",
        "--no-privacy",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("/no/such/model"), "{}", stderr(&out));

    // A ledger that does not exist needs a budget to be created.
    let out = generate(
        &adapters,
        &["--prompt", "a", "--ledger", s(&dir.join("fresh"))],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--epsilon"), "{}", stderr(&out));

    let out = privmix(&["ledger", "verify", s(&dir.join("not-a-ledger-file"))]);
    assert!(!out.status.success());

    // 8-bit activations are for GGUF files' quantised weights, not a folder.
    let out = generate(
        &adapters,
        &[
            "--int8-activations",
            "--prompt",
            "a",
            "--no-privacy",
            "--mechanism",
            "public",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--int8-activations"),
        "{}",
        stderr(&out)
    );
}

/// `--int8-activations` on a Q8_0 GGUF (the tiny llama's own weights, so the
/// folder's adapters fit it): PMixED generates and charges its tokens.
#[test]
fn int8_activations_generate_from_a_gguf() {
    let dir = TempDir::new("int8");
    let adapters = write_adapters(&llama(), &dir, 2);
    let gguf = fixture("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    let ledger = dir.join("ledger");
    let mut args = vec!["--int8-activations"];
    args.extend(three_charged_tokens(&ledger));
    let out = generate_with(&gguf, &adapters, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = json_lines(&out).last().unwrap().clone();
    assert_eq!(done["tokens"].as_u64(), Some(3));
    assert!(done["epsilon"].as_f64().unwrap() > 0.0);

    // With the members' factors and the KV cache in f16 too (llama.cpp's
    // usual widths).
    let ledger = dir.join("ledger-f16");
    let mut args = vec!["--int8-activations", "--f16-factors", "--f16-kv"];
    args.extend(three_charged_tokens(&ledger));
    let out = generate_with(&gguf, &adapters, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = json_lines(&out).last().unwrap().clone();
    assert_eq!(done["tokens"].as_u64(), Some(3));
}

#[test]
fn score_reports_perplexity_and_epsilon() {
    let dir = TempDir::new("score");
    let adapters = write_adapters(&llama(), &dir, 2);
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(3),
    )
    .unwrap();
    let model = llama();
    let tok = tokenizer();
    let run = |mechanism: &str| {
        let out = privmix(&[
            "score",
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--adapter",
            s(&adapters[0]),
            "--adapter",
            s(&adapters[1]),
            "--mechanism",
            mechanism,
            "--text",
            s(&text),
            "--block",
            "32",
            "--epsilon",
            "2",
            "--seed",
            "5",
            "--json",
        ]);
        assert!(out.status.success(), "{mechanism}: {}", stderr(&out));
        json_lines(&out).remove(0)
    };
    let public = run("public");
    let pmixed = run("pmixed");
    assert_eq!(public["epsilon"].as_f64(), Some(0.0));
    let eps = pmixed["epsilon"].as_f64().unwrap();
    assert!(eps > 0.0 && eps <= 2.0, "{eps}");
    // 135 bytes in blocks of 32: 5 blocks (the last of 7 tokens), 130 queries.
    assert_eq!(pmixed["queries"].as_u64(), Some(130));
    let adapmixed = run("adapmixed");
    let submix = run("submix");
    let ensemble = run("ensemble");
    // AdaPMixED's data-dependent ε is finite; SubMix's stays within its part budget
    // (2 at its order 2, converted at δ); the non-private ensemble has none.
    assert!(adapmixed["epsilon"].as_f64().unwrap() > 0.0);
    assert!(submix["epsilon"].as_f64().is_some());
    assert!(ensemble["epsilon"].is_null(), "{ensemble}");
    assert_eq!(public["private_answers"].as_u64(), Some(0));
    assert_eq!(ensemble["private_answers"].as_u64(), Some(130));
    for r in [&public, &pmixed, &adapmixed, &submix, &ensemble] {
        let ppl = r["perplexity"].as_f64().unwrap();
        // A 256-way model's perplexity lies in (1, ∞); a random tiny model is near 256.
        assert!(ppl > 1.0 && ppl.is_finite(), "{r}");
        let answered =
            r["private_answers"].as_u64().unwrap() + r["public_answers"].as_u64().unwrap();
        assert!(answered <= 130, "{r}");
    }
}
