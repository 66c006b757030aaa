//! End-to-end runs of the `privmix` binary on the tiny Llama fixture
//! (models/tests/fixtures/hf/llama, vocabulary 256) with the byte-level tokenizer of
//! tests/fixtures/tokenizer and random PEFT adapters written by privmix-ensemble.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::backend::Flex;
use privmix_models::{LoadOptions, Model};
use serde_json::Value;

use crate::serve_support::write_adapters_with_std;
use crate::support::{TempDir, fixture, llama, privmix, s};

type B = Flex;

fn tokenizer() -> PathBuf {
    fixture("tests/fixtures/tokenizer/tokenizer.json")
}

/// Writes `n` random rank-2 adapters (fixed seeds) for the model at `model` into `dir`.
fn write_adapters(model: &Path, dir: &TempDir, n: usize) -> Vec<PathBuf> {
    write_adapters_with_std(model, dir.path(), "adapter", n, 0.3)
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
/// budget ε = 8 at `ledger`, reported as JSON lines (OS-seeded: a charged
/// run takes no seed).
fn three_charged_tokens(ledger: &Path) -> [&str; 9] {
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
    assert!(records.iter().any(|r| r["kind"] == "step"));
    // Charges as the export lists them: charge records, and step records' runs.
    let charges = crate::serve_support::ledger_charges(&ledger);
    assert_eq!(charges.len(), 5);
    assert!(charges.iter().all(|c| c == "pmixed"));
    let verify = privmix(&["ledger", "verify", s(&ledger)]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    assert!(String::from_utf8_lossy(&verify.stdout).contains("5 charges"));
    // serde_json's default parser may be an ulp off: read the printed ε exactly.
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let printed = stdout.lines().nth(4).unwrap();
    let exact: f64 = printed
        .split("\"epsilon\":")
        .nth(1)
        .unwrap()
        .split([',', '}'])
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((exact - last).abs() <= 2.0 * f64::EPSILON * last);
    let show = privmix(&["ledger", "show", s(&ledger)]);
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(
        text.contains(&format!("ε = {exact} at δ = 0.00001")),
        "ε = {exact} is not in {text}"
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
    ];
    let first = generate(&adapters, &args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("3 tokens with pmixed"),
        "{}",
        stderr(&first)
    );
    // The second run would need a fourth query: refused before releasing anything,
    // with the exit status of a budget exhausted before the first token.
    let second = generate(&adapters, &args);
    assert_eq!(second.status.code(), Some(3), "{}", stderr(&second));
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
    assert!(stderr(&out).contains("NOT private"), "{}", stderr(&out));
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
    let run = |mechanism: &str| {
        let out = score(
            &adapters,
            &text,
            &["--mechanism", mechanism, "--no-privacy", "--seed", "5"],
        );
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
    // AdaPMixED's member filter and SubMix's radius are calibrated to ε = 2: both
    // stay within it; the non-private ensemble has none.
    let ada = adapmixed["epsilon"].as_f64().unwrap();
    assert!(ada > 0.0 && ada <= 2.0, "{ada}");
    let sub = submix["epsilon"].as_f64().unwrap();
    assert!(sub > 0.0 && sub <= 2.0, "{sub}");
    assert!(ensemble["epsilon"].is_null(), "{ensemble}");
    for r in [&public, &pmixed, &adapmixed, &submix, &ensemble] {
        let ppl = r["perplexity"].as_f64().unwrap();
        // A 256-way model's perplexity lies in (1, ∞); a random tiny model is near 256.
        assert!(ppl > 1.0 && ppl.is_finite(), "{r}");
        assert_eq!(r["private"], Value::Bool(false), "{r}");
        assert_eq!(keys(r), SCORE_KEYS, "{r}");
    }
}

/// `score` with the tiny llama, the tokenizer, the adapters and `text` in blocks
/// of 32, calibrated to ε = 2, as JSON, plus `extra`.
fn score(adapters: &[PathBuf], text: &Path, extra: &[&str]) -> Output {
    let model = llama();
    let tok = tokenizer();
    let mut args = vec![
        "score",
        "--model",
        s(&model),
        "--tokenizer",
        s(&tok),
        "--text",
        s(text),
        "--block",
        "32",
        "--epsilon",
        "2",
        "--json",
    ];
    for a in adapters {
        args.extend(["--adapter", s(a)]);
    }
    args.extend(extra);
    privmix(&args)
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// Everything `generate --json` may print per token, and in its summary; and
/// what `score --json` prints: tokens, the ε the ledger recorded, δ, the stop
/// reason and whether the output is private — never a λ, a loss or any other
/// step diagnostic (functions of the private data nobody charged for).
const TOKEN_KEYS: [&str; 7] = [
    "delta", "epsilon", "index", "private", "prompt", "text", "token",
];
const SUMMARY_KEYS: [&str; 12] = [
    "budget_epsilon",
    "delta",
    "done",
    "epsilon",
    "mechanism",
    "private",
    "prompt",
    "prompt_tokens",
    "stop",
    "text",
    "token_ids",
    "tokens",
];
const SCORE_KEYS: [&str; 9] = [
    "blocks",
    "delta",
    "epsilon",
    "mechanism",
    "order",
    "perplexity",
    "private",
    "prompt",
    "queries",
];

/// A perplexity over private adapters is a membership-inference oracle no
/// charge covers: refused without --no-privacy (and never touching a ledger);
/// the public model alone needs no flag and is private.
#[test]
fn score_over_private_adapters_needs_no_privacy() {
    let dir = TempDir::new("score-private");
    let adapters = write_adapters(&llama(), &dir, 2);
    let text = dir.join("text.txt");
    std::fs::write(&text, "To be, or not to be, that is the question.").unwrap();
    for mechanism in ["pmixed", "adapmixed", "submix", "ensemble"] {
        let out = score(&adapters, &text, &["--mechanism", mechanism]);
        assert!(
            !out.status.success(),
            "{mechanism} scored without --no-privacy"
        );
        assert!(out.stdout.is_empty(), "{mechanism}: printed a result");
        let msg = stderr(&out);
        assert!(
            msg.contains("--no-privacy") && msg.contains("membership-inference"),
            "{msg}"
        );
    }
    // A seed is an experiment too.
    let out = score(&adapters, &text, &["--mechanism", "public", "--seed", "1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--seed"), "{}", stderr(&out));
    // The public model reads no private data.
    let out = score(&adapters, &text, &["--mechanism", "public"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = json_lines(&out).remove(0);
    assert_eq!(line["private"], Value::Bool(true));
    assert_eq!(line["epsilon"].as_f64(), Some(0.0));
    assert_eq!(keys(&line), SCORE_KEYS);
    // With --no-privacy the text output says so.
    let model = llama();
    let tok = tokenizer();
    let out = privmix(&[
        "score",
        "--model",
        s(&model),
        "--tokenizer",
        s(&tok),
        "--adapter",
        s(&adapters[0]),
        "--text",
        s(&text),
        "--no-privacy",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        printed.contains("perplexity") && printed.contains("NOT private"),
        "{printed}"
    );
}

/// The JSON output holds only the allowed keys, for every mechanism, AdaPMixED
/// and SubMix (whose steps have λs, losses and fallbacks) included.
#[test]
fn json_output_holds_only_the_allowed_keys() {
    let dir = TempDir::new("keys");
    let adapters = write_adapters(&llama(), &dir, 2);
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
        let (summary, tokens) = lines.split_last().unwrap();
        assert!(!tokens.is_empty());
        for t in tokens {
            assert_eq!(keys(t), TOKEN_KEYS, "{mechanism}: {t}");
            assert_eq!(t["private"], Value::Bool(true));
        }
        assert_eq!(keys(summary), SUMMARY_KEYS, "{mechanism}: {summary}");
        assert_eq!(summary["private"], Value::Bool(true));
        // Text mode: the tokens on stdout, the ledger's ε on stderr, nothing else.
        let text_ledger = dir.join(&format!("text-ledger{i}"));
        let out = generate(
            &adapters,
            &[
                "--mechanism",
                mechanism,
                "--prompt",
                "xy",
                "--max-tokens",
                "2",
                "--ledger",
                s(&text_ledger),
                "--epsilon",
                "8",
            ],
        );
        assert!(out.status.success(), "{mechanism}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            !err.contains('λ') && !err.contains("lambda") && !err.contains("loss"),
            "{err}"
        );
    }
}

/// A known seed makes every draw predictable: a seeded run cannot charge a
/// ledger, needs --no-privacy, and says it is not private; it is then an
/// experiment that reproduces.
#[test]
fn seeded_runs_are_experiments_never_charged() {
    let dir = TempDir::new("seed");
    let adapters = write_adapters(&llama(), &dir, 2);
    let ledger = dir.join("ledger");
    let mut args = vec!["--seed", "3"];
    args.extend(three_charged_tokens(&ledger));
    let out = generate(&adapters, &args);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let msg = stderr(&out);
    assert!(
        msg.contains("invalid argument --seed") && msg.contains("predictable"),
        "{msg}"
    );
    assert!(!ledger.exists(), "a refused run created a ledger");

    let out = generate(&adapters, &["--seed", "3", "--prompt", "xy"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--no-privacy"), "{}", stderr(&out));

    let experiment = [
        "--seed",
        "3",
        "--no-privacy",
        "--prompt",
        "xy",
        "--max-tokens",
        "4",
        "--epsilon",
        "2",
        "--json",
    ];
    let first = generate(&adapters, &experiment);
    assert!(first.status.success(), "{}", stderr(&first));
    let lines = json_lines(&first);
    assert!(lines.iter().all(|l| l["private"] == Value::Bool(false)));
    let (summary, tokens) = lines.split_last().unwrap();
    assert!(tokens.iter().all(|t| keys(t) == TOKEN_KEYS));
    assert_eq!(keys(summary), SUMMARY_KEYS);
    assert!(summary["budget_epsilon"].is_null());
    assert!(stderr(&first).contains("NOT private"), "{}", stderr(&first));
    let again = generate(&adapters, &experiment);
    assert_eq!(
        json_lines(&again).last().unwrap()["token_ids"],
        summary["token_ids"],
        "a seeded experiment reproduces"
    );
}

/// A larger --epsilon no longer raises a ledger's budget: it is refused with
/// how to raise it; `ledger raise` records the new budget (refusing one below
/// what was spent) and `show`/`export` list the budget's history.
#[test]
fn raising_a_budget_is_explicit_and_recorded() {
    let dir = TempDir::new("raise");
    let adapters = write_adapters(&llama(), &dir, 2);
    let ledger = dir.join("ledger");
    let run = |epsilon: Option<&str>| {
        let mut args = vec![
            "--prompt",
            "ab",
            "--max-tokens",
            "3",
            "--ledger",
            s(&ledger),
        ];
        if let Some(e) = epsilon {
            args.extend(["--epsilon", e]);
        }
        generate(&adapters, &args)
    };
    let first = run(Some("1"));
    assert!(first.status.success(), "{}", stderr(&first));
    let bytes = std::fs::read(&ledger).unwrap();

    let more = run(Some("2"));
    assert!(!more.status.success());
    assert!(more.stdout.is_empty());
    let msg = stderr(&more);
    assert!(
        msg.contains(&format!("privmix ledger raise {} --epsilon 2", s(&ledger))),
        "{msg}"
    );
    let less = run(Some("0.5"));
    assert!(!less.status.success());
    assert!(stderr(&less).contains("only repeat"), "{}", stderr(&less));
    assert_eq!(
        std::fs::read(&ledger).unwrap(),
        bytes,
        "a refused run wrote"
    );
    // Spent: the same budget (or none given) is refused as exhausted.
    let spent = run(None);
    assert!(
        stderr(&spent).contains("privacy budget exhausted"),
        "{}",
        stderr(&spent)
    );

    // Below what was spent: a typed error, nothing written.
    let below = privmix(&["ledger", "raise", s(&ledger), "--epsilon", "0.5"]);
    assert!(!below.status.success());
    assert!(stderr(&below).contains("below"), "{}", stderr(&below));
    assert_eq!(std::fs::read(&ledger).unwrap(), bytes);

    let raised = privmix(&["ledger", "raise", s(&ledger), "--epsilon", "2"]);
    assert!(raised.status.success(), "{}", stderr(&raised));
    assert!(String::from_utf8_lossy(&raised.stdout).contains("ε = 1, δ = 0.00001 -> ε = 2"));
    let after = run(Some("2"));
    assert!(after.status.success(), "{}", stderr(&after));
    assert!(
        stderr(&after).contains("of the budget ε = 2"),
        "{}",
        stderr(&after)
    );

    let show = privmix(&["ledger", "show", s(&ledger)]);
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(
        text.contains("history  ε = 1, δ = 0.00001 (at creation"),
        "{text}"
    );
    assert!(text.contains("ε = 2, δ = 0.00001 (record 3,"), "{text}");
    assert!(text.contains("after 3 charges)"), "{text}");
    let export = json_lines(&privmix(&["ledger", "export", s(&ledger)]));
    assert_eq!(export[0]["budget"]["epsilon"].as_f64(), Some(1.0));
    let budgets: Vec<f64> = export
        .iter()
        .filter(|r| r["kind"] == "budget")
        .map(|r| r["epsilon"].as_f64().unwrap())
        .collect();
    assert_eq!(budgets, [2.0]);
}

fn sha256_of(adapter: &Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(adapter.join("adapter_model.safetensors")).unwrap();
    format!("sha256:{:x}", Sha256::digest(&bytes))
}

/// A ledger records the sha256 of its adapters' weights when created (printed
/// once) and refuses another set, a version 1 ledger (no set) and a member
/// given twice.
#[test]
fn a_ledger_charges_only_for_its_adapter_set() {
    let dir = TempDir::new("set");
    let adapters = write_adapters(&llama(), &dir, 3);
    let ledger = dir.join("ledger");
    // The public mechanism charges nothing, so the ledger never runs out here;
    // the set is checked for every mechanism.
    let args = [
        "--mechanism",
        "public",
        "--prompt",
        "ab",
        "--max-tokens",
        "2",
        "--ledger",
        s(&ledger),
        "--epsilon",
        "4",
    ];
    let first = generate(&adapters[..2], &args);
    assert!(first.status.success(), "{}", stderr(&first));
    let err = stderr(&first);
    let ids = [
        sha256_of(&adapters[0]),
        sha256_of(&adapters[1]),
        sha256_of(&adapters[2]),
    ];
    assert!(
        err.contains("created ledger") && err.contains(&ids[0]),
        "{err}"
    );
    let export = json_lines(&privmix(&["ledger", "export", s(&ledger)]));
    let mut expected = vec![ids[0].clone(), ids[1].clone()];
    expected.sort();
    assert_eq!(export[0]["protected_set"], serde_json::json!(expected));
    assert_eq!(export[0]["version"].as_u64(), Some(4));
    assert!(export[0]["created_ms"].as_u64().unwrap() > 1_600_000_000_000);

    // The same adapters in another order: the same set; not announced again.
    let swapped = [adapters[1].clone(), adapters[0].clone()];
    let again = generate(&swapped, &args);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        !stderr(&again).contains("created ledger"),
        "{}",
        stderr(&again)
    );

    // Another set: refused before anything is released, naming both.
    let bytes = std::fs::read(&ledger).unwrap();
    let other = [adapters[0].clone(), adapters[2].clone()];
    let out = generate(&other, &args);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let msg = stderr(&out);
    assert!(msg.contains("protects a different set"), "{msg}");
    assert!(
        msg.contains(&format!("only in the ledger: [{}]", ids[1]))
            && msg.contains(&format!("only in this run: [{}]", ids[2])),
        "{msg}"
    );
    assert_eq!(std::fs::read(&ledger).unwrap(), bytes);

    // The show view lists the set.
    let show =
        String::from_utf8_lossy(&privmix(&["ledger", "show", s(&ledger)]).stdout).into_owned();
    assert!(
        show.contains("protects 2 member adapters") && show.contains(&ids[1]),
        "{show}"
    );

    // A member given twice is refused, with or without a ledger.
    let twice = [adapters[0].clone(), adapters[0].clone()];
    let out = generate(
        &twice,
        &["--prompt", "ab", "--no-privacy", "--mechanism", "ensemble"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("identical weights"),
        "{}",
        stderr(&out)
    );

    // A version 1 ledger (written before sets were recorded) is refused, and
    // `ledger show` still reads it.
    let old = dir.join("old.ledger");
    std::fs::copy(fixture("../accountant/tests/golden/ledger_v1.ledger"), &old).unwrap();
    let out = generate(
        &adapters[..2],
        &["--prompt", "ab", "--max-tokens", "1", "--ledger", s(&old)],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("does not record which private members it protects"),
        "{}",
        stderr(&out)
    );
    let show = privmix(&["ledger", "show", s(&old)]);
    assert!(show.status.success(), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(
        text.contains("format   version 1") && text.contains("no adapter set"),
        "{text}"
    );
}

/// --step-time-ms releases token k at k·N ms after the first step: the lines
/// arrive at least N apart (the tiny model's steps take about a millisecond).
#[test]
fn step_time_pads_every_release_to_its_deadline() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let dir = TempDir::new("pace");
    let adapters = write_adapters(&llama(), &dir, 2);
    let ledger = dir.join("ledger");
    let model = llama();
    let tok = tokenizer();
    let mut args = vec!["generate", "--model", s(&model), "--tokenizer", s(&tok)];
    for a in &adapters {
        args.extend(["--adapter", s(a)]);
    }
    args.extend(three_charged_tokens(&ledger));
    args.extend(["--step-time-ms", "150", "--no-stop"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut arrivals = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        arrivals.push((Instant::now(), line));
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(arrivals.len(), 4, "3 tokens and a summary");
    for pair in arrivals[..3].windows(2) {
        let gap = pair[1].0 - pair[0].0;
        // The deadlines are 150 ms apart; reading adds jitter to both ends.
        assert!(gap >= Duration::from_millis(120), "tokens {gap:?} apart");
    }

    // A zero period is a typed argument error.
    let out = generate(
        &adapters,
        &[
            "--step-time-ms",
            "0",
            "--no-privacy",
            "--mechanism",
            "public",
            "--prompt",
            "a",
        ],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--step-time-ms"), "{}", stderr(&out));
}

/// The chat fixture of privmix-models: a byte-level tokenizer whose ids 1, 2, 3
/// are <|im_start|>, <|im_end|>, <|endoftext|> (vocabulary 256, the tiny Llama's),
/// with a chat template and generation_config.json stopping at [2, 3];
/// `expected.json` holds transformers' renders of its conversations.
fn chat_tokenizer() -> PathBuf {
    fixture("../models/tests/fixtures/chat/hf/tokenizer.json")
}

fn chat_expected() -> Vec<Value> {
    let text =
        std::fs::read_to_string(fixture("../models/tests/fixtures/chat/expected.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all["hf"].as_array().unwrap().clone()
}

/// Token count of a render under the chat fixture's tokenizer: one id per byte,
/// one per special token.
fn chat_token_count(text: &str) -> usize {
    let specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"];
    let mut rest = text.to_string();
    let mut count = 0;
    for s in specials {
        count += rest.matches(s).count();
        rest = rest.replace(s, "");
    }
    count + rest.len()
}

/// `privmix` with `stdin` written to its standard input.
fn privmix_with_stdin(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("privmix runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Prompts from standard input and from JSON lines: each answered in turn by the
/// model loaded once, every line carrying its prompt's index; a prompt read from
/// stdin is the same prompt as --prompt (same seed, same tokens).
#[test]
fn prompts_from_stdin_and_json_lines() {
    let dir = TempDir::new("prompts");
    let adapters = write_adapters(&llama(), &dir, 2);
    let model = llama();
    let tok = tokenizer();
    let mut base = vec!["generate", "--model", s(&model), "--tokenizer", s(&tok)];
    for a in &adapters {
        base.extend(["--adapter", s(a)]);
    }
    base.extend([
        "--no-privacy",
        "--seed",
        "9",
        "--max-tokens",
        "4",
        "--no-stop",
        "--json",
    ]);
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|a| a.to_string()).collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        privmix(&args)
    };
    let direct = run(with(&["--prompt", "xy"]));
    assert!(direct.status.success(), "{}", stderr(&direct));
    let direct_ids = json_lines(&direct).last().unwrap()["token_ids"].clone();

    let piped_args = with(&["--prompt-file", "-"]);
    let piped_args: Vec<&str> = piped_args.iter().map(String::as_str).collect();
    let piped = privmix_with_stdin(&piped_args, "xy");
    assert!(piped.status.success(), "{}", stderr(&piped));
    let summary = json_lines(&piped).last().unwrap().clone();
    assert_eq!(summary["token_ids"], direct_ids, "stdin is the same prompt");
    assert_eq!(summary["prompt_tokens"].as_u64(), Some(2));
    assert_eq!(summary["prompt"].as_u64(), Some(0));

    let jsonl = dir.join("prompts.jsonl");
    std::fs::write(
        &jsonl,
        "{\"prompt\": \"xy\"}\n\n{\"prompt\": \"hello\"}\n{\"prompt\": \"a\"}\n",
    )
    .unwrap();
    let out = run(with(&["--prompt-file", s(&jsonl), "--jsonl"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = json_lines(&out);
    let summaries: Vec<&Value> = lines.iter().filter(|l| l["done"] == true).collect();
    assert_eq!(summaries.len(), 3);
    assert_eq!(lines.len(), 3 * 4 + 3, "4 tokens and a summary per prompt");
    for (i, summary) in summaries.iter().enumerate() {
        assert_eq!(summary["prompt"].as_u64(), Some(i as u64));
        assert_eq!(keys(summary), SUMMARY_KEYS);
    }
    let prompt_tokens: Vec<u64> = summaries
        .iter()
        .map(|l| l["prompt_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(prompt_tokens, [2, 5, 1]);
    // The lines come in order: prompt 0's tokens and summary, then prompt 1's, …
    let order: Vec<u64> = lines
        .iter()
        .map(|l| l["prompt"].as_u64().unwrap())
        .collect();
    assert_eq!(order, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
    for t in lines.iter().filter(|l| l["done"] != true) {
        assert_eq!(keys(t), TOKEN_KEYS);
    }
    // One line is the same prompt as --prompt (a run of several prompts is calibrated
    // for all their tokens, so only a run of one compares).
    std::fs::write(&jsonl, "{\"prompt\": \"xy\"}\n").unwrap();
    let out = run(with(&["--prompt-file", s(&jsonl), "--jsonl"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_lines(&out).last().unwrap()["token_ids"], direct_ids);

    // A malformed line is a usage error naming the file and line.
    std::fs::write(&jsonl, "{\"prompt\": \"xy\"}\n{\"prompt\": 3}\n").unwrap();
    let out = run(with(&["--prompt-file", s(&jsonl), "--jsonl"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());

    // score reads texts the same ways; the public mechanism is deterministic, so a
    // text scored among others has the perplexity it has alone.
    let text = dir.join("text.txt");
    std::fs::write(&text, "To be, or not to be").unwrap();
    let alone = score(&[], &text, &["--mechanism", "public"]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    let alone = json_lines(&alone).remove(0);
    let mut args = vec![
        "score",
        "--model",
        s(&model),
        "--tokenizer",
        s(&tok),
        "--mechanism",
        "public",
        "--block",
        "32",
        "--json",
        "--text",
        "-",
        "--jsonl",
    ];
    let many = privmix_with_stdin(
        &args,
        "{\"prompt\": \"That is the question\"}\n{\"prompt\": \"To be, or not to be\"}\n",
    );
    assert!(many.status.success(), "{}", stderr(&many));
    let results = json_lines(&many);
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["prompt"].as_u64(), Some(1));
    assert_eq!(results[1]["perplexity"], alone["perplexity"]);
    assert_ne!(results[0]["perplexity"], alone["perplexity"]);
    for r in &results {
        assert_eq!(keys(r), SCORE_KEYS);
    }
    // Plain stdin: one text.
    args.pop();
    let one = privmix_with_stdin(&args, "To be, or not to be");
    assert!(one.status.success(), "{}", stderr(&one));
    assert_eq!(json_lines(&one)[0]["perplexity"], alone["perplexity"]);
}

/// Exit statuses: 2 for bad arguments (clap's and ours), 3 for a budget exhausted
/// before the first token, 4 for one exhausted during the run (what was released
/// and the summary printed), 1 for other errors.
#[test]
fn exit_statuses_tell_failures_apart() {
    let dir = TempDir::new("exit");
    let adapters = write_adapters(&llama(), &dir, 2);
    let public = ["--mechanism", "public", "--no-privacy", "--prompt", "a"];
    for (extra, flag) in [
        (&["--no-such-flag"][..], "--no-such-flag"),
        (&["--max-tokens", "0"][..], "--max-tokens"),
        (&["--temperature", "0"][..], "--temperature"),
        (&["--temperature=-1"][..], "--temperature"),
        (&["--backend", "metal"][..], "--backend"),
    ] {
        let mut args = public.to_vec();
        args.extend(extra);
        let out = generate(&adapters, &args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(flag), "{extra:?}: {}", stderr(&out));
    }
    // A backend this binary was built without names the cargo feature.
    #[cfg(not(feature = "wgpu"))]
    {
        let mut args = public.to_vec();
        args.extend(["--backend", "wgpu"]);
        let out = generate(&adapters, &args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("--features wgpu"), "{}", stderr(&out));
    }
    // Other errors: 1.
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
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // A fixed radius whose queries a budget of 1 pays for only a few: the run stops
    // during the text (4), printing what was released and the summary.
    let ledger = dir.join("ledger");
    let args = [
        "--prompt",
        "ab",
        "--max-tokens",
        "200",
        "--radius",
        "0.05",
        "--ledger",
        s(&ledger),
        "--epsilon",
        "1",
        "--json",
    ];
    let out = generate(&adapters, &args);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let lines = json_lines(&out);
    let (summary, tokens) = lines.split_last().unwrap();
    assert!(!tokens.is_empty() && tokens.len() < 200, "{}", tokens.len());
    assert_eq!(summary["stop"], "budget_exhausted");
    assert_eq!(summary["tokens"].as_u64(), Some(tokens.len() as u64));
    assert!(summary["epsilon"].as_f64().unwrap() <= 1.0);
    assert!(stderr(&out).contains("stopped early"), "{}", stderr(&out));
    // The next run cannot pay for its first token: 3, nothing released.
    let out = generate(&adapters, &args);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("privacy budget exhausted"),
        "{}",
        stderr(&out)
    );
}

/// The scenario: ε 2.5 of a budget of 8 already spent, a run of
/// --max-tokens 3 is calibrated to what is left (the spent curve composed with
/// the run's), so it releases all 3 tokens and stays within the budget, using
/// most of what was left.
#[test]
fn a_calibrated_run_uses_what_is_left_of_the_budget() {
    let dir = TempDir::new("left");
    let adapters = write_adapters(&llama(), &dir, 2);
    let ledger = dir.join("ledger");
    let run = |epsilon: &str| {
        let out = generate(
            &adapters,
            &[
                "--prompt",
                "ab",
                "--max-tokens",
                "3",
                "--no-stop",
                "--ledger",
                s(&ledger),
                "--epsilon",
                epsilon,
                "--json",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        json_lines(&out).last().unwrap().clone()
    };
    let first = run("2.5");
    let spent = first["epsilon"].as_f64().unwrap();
    assert!(spent > 2.4 && spent <= 2.5, "{spent}");
    let raised = privmix(&["ledger", "raise", s(&ledger), "--epsilon", "8"]);
    assert!(raised.status.success(), "{}", stderr(&raised));
    let second = run("8");
    assert_eq!(second["tokens"].as_u64(), Some(3), "{second}");
    assert_eq!(second["stop"], "max_tokens");
    let total = second["epsilon"].as_f64().unwrap();
    assert!(total <= 8.0, "{total}");
    assert!(total > 7.9, "the run used what was left: {total}");
}

/// --temperature tempers each model's distribution before the mechanism: the
/// public mechanism's perplexity at T is the one of the public model's
/// log-probabilities divided by T and renormalised (computed here from the model).
#[test]
fn temperature_tempers_each_model_before_the_mechanism() {
    use privmix_models::LanguageModel;

    let dir = TempDir::new("temperature");
    let text = dir.join("text.txt");
    let body = "The quick brown fox";
    std::fs::write(&text, body).unwrap();
    let model = Model::<B>::load(LoadOptions::path(llama(), &Default::default())).unwrap();
    let tokens: Vec<u32> = body.bytes().map(u32::from).collect();
    let expected = |t: f64| {
        let mut nll = 0.0;
        for i in 0..tokens.len() - 1 {
            let lp = model.log_probs_last(&tokens[..=i]).unwrap();
            let scaled: Vec<f64> = lp.iter().map(|&l| f64::from(l) / t).collect();
            let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + scaled.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            nll -= scaled[tokens[i + 1] as usize] - log_z;
        }
        (nll / (tokens.len() - 1) as f64).exp()
    };
    let perplexity = |t: &str| {
        let out = score(&[], &text, &["--mechanism", "public", "--temperature", t]);
        assert!(out.status.success(), "{}", stderr(&out));
        json_lines(&out)[0]["perplexity"].as_f64().unwrap()
    };
    let mut seen = Vec::new();
    for (arg, t) in [("1", 1.0), ("0.5", 0.5), ("2.5", 2.5)] {
        let got = perplexity(arg);
        let want = expected(t);
        assert!(
            (got - want).abs() <= 1e-4 * want,
            "T = {t}: {got} vs {want}"
        );
        seen.push(got);
    }
    assert!(seen[0] != seen[1] && seen[0] != seen[2], "{seen:?}");
}

/// --chat renders the prompt with the tokenizer folder's template (transformers'
/// render, from expected.json), encodes it without adding special tokens, and stops
/// at the end-of-turn ids of generation_config.json (2 and 3).
#[test]
fn chat_renders_the_template_and_stops_at_the_end_of_turn() {
    let dir = TempDir::new("chat");
    let model = llama();
    let tok = chat_tokenizer();
    let expected = chat_expected();
    let chat = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--mechanism",
            "public",
            "--no-privacy",
            "--chat",
            "--json",
        ];
        args.extend(extra);
        privmix(&args)
    };
    // A text is one user turn: transformers' render of [user "Hello"], generation
    // prompt on, is the prompt.
    assert_eq!(expected[0]["messages"][0]["content"], "Hello");
    assert_eq!(expected[0]["add_generation_prompt"], true);
    let rendered = expected[0]["text"].as_str().unwrap();
    let out = chat(&["--prompt", "Hello", "--max-tokens", "1", "--seed", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = json_lines(&out).last().unwrap().clone();
    assert_eq!(
        summary["prompt_tokens"].as_u64(),
        Some(chat_token_count(rendered) as u64)
    );

    // A conversation from JSON lines, and one the template refuses.
    let jsonl = dir.join("chat.jsonl");
    let conversation = &expected[2];
    assert_eq!(conversation["add_generation_prompt"], true);
    let line = serde_json::json!({ "messages": conversation["messages"] });
    std::fs::write(&jsonl, format!("{line}\n")).unwrap();
    let out = chat(&[
        "--prompt-file",
        s(&jsonl),
        "--jsonl",
        "--max-tokens",
        "1",
        "--seed",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = json_lines(&out).last().unwrap().clone();
    let rendered = conversation["text"].as_str().unwrap();
    assert_eq!(
        summary["prompt_tokens"].as_u64(),
        Some(chat_token_count(rendered) as u64)
    );
    let refused = &expected[5];
    let line = serde_json::json!({ "messages": refused["messages"] });
    std::fs::write(&jsonl, format!("{line}\n")).unwrap();
    let out = chat(&["--prompt-file", s(&jsonl), "--jsonl", "--seed", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error = refused["error"].as_str().unwrap();
    assert!(stderr(&out).contains(error), "{}", stderr(&out));
    // Messages without --chat: a usage error.
    let out = generate_with(
        &model,
        &[],
        &[
            "--mechanism",
            "public",
            "--no-privacy",
            "--prompt-file",
            s(&jsonl),
            "--jsonl",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Stops: a run ends at its first end-of-turn id, or runs to --max-tokens
    // without one; over these seeds at least one ends at the end of turn.
    let mut ended = 0;
    for seed in 0..12 {
        let seed = seed.to_string();
        let out = chat(&["--prompt", "Hi", "--max-tokens", "300", "--seed", &seed]);
        assert!(out.status.success(), "{}", stderr(&out));
        let summary = json_lines(&out).last().unwrap().clone();
        let ids: Vec<u64> = summary["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let is_stop = |t: &u64| *t == 2 || *t == 3;
        let (last, before) = ids.split_last().unwrap();
        assert!(!before.iter().any(is_stop), "seed {seed}: {ids:?}");
        if summary["stop"] == "end_of_sequence" {
            assert!(is_stop(last), "seed {seed}: {ids:?}");
            ended += 1;
            // --no-stop goes on past it (the same coins).
            let out = chat(&[
                "--prompt",
                "Hi",
                "--max-tokens",
                "300",
                "--seed",
                &seed,
                "--no-stop",
            ]);
            let more = json_lines(&out).last().unwrap().clone();
            assert_eq!(more["tokens"].as_u64(), Some(300), "seed {seed}");
        } else {
            assert_eq!(summary["stop"], "max_tokens");
            assert!(!is_stop(last), "seed {seed}: {ids:?}");
        }
    }
    assert!(ended > 0, "no run reached an end-of-turn id");
}

/// AdaPMixED's published ε is the same for every member set (issue 39 §2): the
/// members of one set are within 1e-4 of the public model (screening finds nothing
/// private), those
/// of the other are far from it (screening finds them private). Each token's ε, the
/// summary's ε and the stop reason must agree; before the fixed charge schedule the
/// last token's ε told which way the screening went.
#[test]
fn adapmixed_publishes_the_same_epsilon_for_every_member_set() {
    let dir = TempDir::new("ada-eps");
    let public_like = write_adapters_with_std(&llama(), dir.path(), "near", 2, 1e-4);
    let far = write_adapters_with_std(&llama(), dir.path(), "far", 2, 2.0);
    let run = |adapters: &[PathBuf], ledger: &str| -> (Vec<f64>, Value) {
        let ledger = dir.join(ledger);
        let out = generate(
            adapters,
            &[
                "--mechanism",
                "adapmixed",
                "--prompt",
                "xy",
                "--max-tokens",
                "6",
                "--ledger",
                s(&ledger),
                "--epsilon",
                "4",
                "--json",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let lines = json_lines(&out);
        let done = lines.last().unwrap().clone();
        let eps = lines[..lines.len() - 1]
            .iter()
            .map(|l| l["epsilon"].as_f64().unwrap())
            .collect();
        (eps, done)
    };
    let (a, done_a) = run(&public_like, "ledger-a");
    let (b, done_b) = run(&far, "ledger-b");
    assert_eq!(a.len(), 6, "{a:?}");
    assert_eq!(a, b, "the published ε depends on the members");
    assert_eq!(done_a["epsilon"], done_b["epsilon"]);
    assert_eq!(done_a["stop"], done_b["stop"]);
    assert!(a.windows(2).all(|w| w[0] <= w[1]) && a[5] <= 4.0, "{a:?}");
}

#[test]
fn generate_charges_a_postgresql_ledger_and_ledger_reads_it_back() {
    let schema = crate::serve_replicas::test_cluster::TestSchema::new("generate");
    let dir = TempDir::new("generate-pg");
    let adapters = write_adapters(&llama(), &dir, 2);
    let run = || {
        generate(
            &adapters,
            &[
                "--prompt",
                "xy",
                "--max-tokens",
                "3",
                "--ledger",
                &schema.url,
                "--epsilon",
                "8",
                "--json",
            ],
        )
    };
    // Created by the run (as a file ledger is) and charged for its three tokens.
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("created ledger"), "{}", stderr(&out));
    let summary = json_lines(&out).last().unwrap().clone();
    assert_eq!(summary["tokens"].as_u64(), Some(3));
    assert_eq!(summary["private"].as_bool(), Some(true));
    let spent = summary["epsilon"].as_f64().unwrap();
    assert!(spent > 0.0 && spent <= 8.0, "{spent}");
    // The run was calibrated to the whole budget: a second is refused before its
    // first token, charging nothing.
    let again = run();
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    // `ledger show` and `verify` read the three charges and the ε the run reported.
    let show = privmix(&["ledger", "show", "--json", &schema.url]);
    assert!(show.status.success(), "{}", stderr(&show));
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["charges"].as_u64(), Some(3), "{shown}");
    assert_eq!(shown["spent"]["epsilon"].as_f64(), Some(spent), "{shown}");
    let verify = privmix(&["ledger", "verify", &schema.url]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let text = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert!(text.contains("(3 charges"), "{text}");
    // Other adapters: refused before anything is loaded or charged.
    let other_dir = TempDir::new("generate-pg-other");
    let others = write_adapters(&llama(), &other_dir, 1);
    let out = generate(
        &others,
        &[
            "--prompt",
            "xy",
            "--ledger",
            &schema.url,
            "--max-tokens",
            "1",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("protects a different set"),
        "{}",
        stderr(&out)
    );
}
