//! End-to-end runs of `privmix train` on the tiny Llama fixture
//! (models/tests/fixtures/hf/llama, vocabulary 256) with the byte-level
//! tokenizer of tests/fixtures/tokenizer and the six users of
//! tests/fixtures/train/users.jsonl (two records each, interleaved).
//!
//! Under `--seed 3` the users split 3/3 between two members; under
//! `--seed 5` every user hashes to member 1 (so member 0 would be empty).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use burn::backend::Flex;
use privmix_ensemble::lora::{LoraAdapter, LoraBase};
use privmix_models::runtime::to_vec;
use privmix_models::{LoadOptions, Model};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::{TempDir, fixture, llama, privmix, s};

type B = Flex;

fn tokenizer() -> PathBuf {
    fixture("tests/fixtures/tokenizer/tokenizer.json")
}

fn users_jsonl() -> PathBuf {
    fixture("tests/fixtures/train/users.jsonl")
}

/// The PEFT folder `peft` 0.21.2 loaded (ensemble's check_ours.py).
fn peft_checked() -> PathBuf {
    fixture("../ensemble/tests/fixtures/peft/ours")
}

const USERS: [&str; 6] = ["alice", "bob", "carol", "dave", "erin", "frank"];

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `privmix train` of two members on `data` into `out`: rank 2, 6 steps of
/// batch 4 over 16-token blocks, a fifth held out, evaluated every 2 steps;
/// `changes` are `--flag value` pairs (or a bare `--flag`) that replace the
/// default's value or are added.
fn train(data: &Path, out: &Path, changes: &[&str]) -> Output {
    let (model, tok) = (llama(), tokenizer());
    let mut args: Vec<(String, Option<String>)> = [
        ("--data", s(data)),
        ("--model", s(&model)),
        ("--tokenizer", s(&tok)),
        ("--out", s(out)),
        ("--members", "2"),
        ("--seed", "3"),
        ("--rank", "2"),
        ("--alpha", "4"),
        ("--steps", "6"),
        ("--batch", "4"),
        ("--block-size", "16"),
        ("--holdout", "0.2"),
        ("--eval-every", "2"),
        ("--lr", "1e-2"),
    ]
    .iter()
    .map(|(f, v)| (f.to_string(), Some(v.to_string())))
    .collect();
    let mut i = 0;
    while i < changes.len() {
        let flag = changes[i].to_string();
        let value = changes
            .get(i + 1)
            .filter(|v| !v.starts_with("--"))
            .map(|v| v.to_string());
        i += 1 + usize::from(value.is_some());
        match args.iter_mut().find(|(f, _)| *f == flag) {
            Some(slot) => slot.1 = value,
            None => args.push((flag, value)),
        }
    }
    let mut line = vec!["train".to_string()];
    for (f, v) in args {
        line.push(f);
        line.extend(v);
    }
    let refs: Vec<&str> = line.iter().map(String::as_str).collect();
    privmix(&refs)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sha256_file(path: &Path) -> String {
    format!("sha256:{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// The partition rule, computed here independently of privmix.
fn member_of(seed: u64, user: &str, members: u64) -> usize {
    let d = Sha256::digest([&seed.to_le_bytes()[..], user.as_bytes()].concat());
    (u64::from_be_bytes(d[..8].try_into().unwrap()) % members) as usize
}

/// The safetensors header: tensor name → (dtype, shape), and the metadata.
fn safetensors_header(path: &Path) -> (BTreeMap<String, (String, Vec<u64>)>, Value) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut tensors = BTreeMap::new();
    let mut meta = Value::Null;
    for (name, v) in header.as_object().unwrap() {
        if name == "__metadata__" {
            meta = v.clone();
            continue;
        }
        let shape = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        tensors.insert(
            name.clone(),
            (v["dtype"].as_str().unwrap().to_string(), shape),
        );
    }
    (tensors, meta)
}

fn base() -> (Model<B>, privmix_ensemble::lora::BaseShapes) {
    let m = Model::<B>::load(LoadOptions::path(llama(), &Default::default())).unwrap();
    let b = m.base_shapes().unwrap();
    (m, b)
}

/// PEFT compatibility of a trained member, by the mechanism of
/// ensemble/tests/integration/peft.rs: `save_peft`'s output is what `peft` 0.21.2 was
/// shown to load (check_ours.py on the committed `ours/` folder), so a member
/// must be that format (same config keys and fixed fields, tensor names
/// `base_model.model.<module>.lora_{A,B}.weight` in F32 with PEFT's `[r, in]`
/// / `[out, r]` shapes, `format: pt` metadata), and load → save must give
/// back its bytes exactly.
fn assert_peft_format(member: &Path, rank: u64) {
    let ours = read_json(&member.join("adapter_config.json"));
    let checked = read_json(&peft_checked().join("adapter_config.json"));
    let keys = |v: &Value| -> BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&ours), keys(&checked), "adapter_config.json keys");
    for field in [
        "peft_type",
        "task_type",
        "bias",
        "use_dora",
        "use_rslora",
        "init_lora_weights",
        "inference_mode",
        "fan_in_fan_out",
    ] {
        assert_eq!(ours[field], checked[field], "{field}");
    }
    assert_eq!(ours["r"].as_u64(), Some(rank));
    assert_eq!(
        ours["base_model_name_or_path"].as_str(),
        Some(s(&llama())),
        "base_model_name_or_path is --model as given"
    );

    let (tensors, meta) = safetensors_header(&member.join("adapter_model.safetensors"));
    assert_eq!(meta["format"], "pt");
    // Tiny Llama: 2 layers, hidden 64, 4 heads of 16 (q: 64 → 64), 2 KV heads (v: 64 → 32).
    let mut expected = BTreeMap::new();
    for layer in 0..2 {
        for (proj, out) in [("q_proj", 64), ("v_proj", 32)] {
            let stem = format!("base_model.model.model.layers.{layer}.self_attn.{proj}");
            expected.insert(
                format!("{stem}.lora_A.weight"),
                ("F32".to_string(), vec![rank, 64]),
            );
            expected.insert(
                format!("{stem}.lora_B.weight"),
                ("F32".to_string(), vec![out, rank]),
            );
        }
    }
    assert_eq!(tensors, expected);

    let (_, shapes) = base();
    let adapter = LoraAdapter::<B>::load_peft(member, &shapes, &Default::default()).unwrap();
    let again = TempDir::new("resave");
    adapter.save_peft(again.path()).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        assert_eq!(
            std::fs::read(member.join(f)).unwrap(),
            std::fs::read(again.join(f)).unwrap(),
            "{f}: load_peft → save_peft changed it"
        );
    }
}

#[test]
fn trains_members_that_generate_loads() {
    let dir = TempDir::new("members");
    let out = dir.join("out");
    let o = train(&users_jsonl(), &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));

    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["format"], "privmix-train/1");
    assert_eq!(m["kind"], "members");
    assert_eq!(m["data"]["users"], 6);
    let p = &m["partition"];
    assert_eq!(p["seed"], 3);
    assert_eq!(p["members"], 2);
    // Every user in exactly one member, the one the seeded hash names.
    let assigned: BTreeMap<String, usize> = p["users"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(u, k)| (u.clone(), k.as_u64().unwrap() as usize))
        .collect();
    assert_eq!(
        assigned.keys().map(String::as_str).collect::<Vec<_>>(),
        USERS.to_vec()
    );
    for (u, &k) in &assigned {
        assert_eq!(k, member_of(3, u, 2), "{u}");
    }
    assert_eq!(
        m["base_model"]["sha256"].as_str().unwrap().len(),
        "sha256:".len() + 64
    );
    assert_eq!(
        m["tokenizer"]["sha256"].as_str().unwrap(),
        sha256_file(&tokenizer())
    );
    assert!(
        !out.join("checkpoints").exists(),
        "checkpoints are removed once the manifest is written"
    );

    let (model, shapes) = base();
    let members = m["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    let mut hashes = BTreeSet::new();
    for (k, rec) in members.iter().enumerate() {
        let folder = out.join(rec["path"].as_str().unwrap());
        assert_eq!(folder, out.join(format!("member-{k:03}")));
        assert_eq!(
            rec["users"].as_u64().unwrap() as usize,
            assigned.values().filter(|&&j| j == k).count()
        );
        assert_eq!(
            rec["adapter_sha256"].as_str().unwrap(),
            sha256_file(&folder.join("adapter_model.safetensors"))
        );
        assert!(hashes.insert(rec["data_sha256"].as_str().unwrap().to_string()));
        assert_eq!(rec["steps"], 6);
        assert!(rec["held_out_blocks"].as_u64().unwrap() > 0);
        assert!(rec["held_out_loss"].as_f64().unwrap().is_finite());
        let adapter = LoraAdapter::<B>::load_peft(&folder, &shapes, &Default::default()).unwrap();
        assert_eq!(adapter.config().r, 2);
        assert_eq!(adapter.config().target_modules, ["q_proj", "v_proj"]);
        // PEFT initialises B to 0: a trained member has moved it.
        let moved = adapter.sites().iter().any(|&site| {
            to_vec(adapter.factors(site).unwrap().b.clone())
                .unwrap()
                .iter()
                .any(|&x| x != 0.0)
        });
        assert!(moved, "member {k} was not trained");
        let card = std::fs::read_to_string(folder.join("README.md")).unwrap();
        assert!(card.contains("Contains private data — release only through privmix"));
        assert!(card.contains(rec["data_sha256"].as_str().unwrap()));
        assert!(card.contains("seed 3"));
    }
    drop(model);
    assert_peft_format(&out.join("member-000"), 2);

    let g = privmix(&[
        "generate",
        "--model",
        s(&llama()),
        "--tokenizer",
        s(&tokenizer()),
        "--adapter",
        s(&out.join("member-000")),
        "--adapter",
        s(&out.join("member-001")),
        "--mechanism",
        "pmixed",
        "--no-privacy",
        "--seed",
        "1",
        "--prompt",
        "the cat",
        "--max-tokens",
        "4",
        "--json",
    ]);
    assert!(g.status.success(), "{}", stderr(&g));

    // The same command again finds the run finished and changes nothing.
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    let again = train(&users_jsonl(), &out, &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("nothing to do"),
        "{}",
        stderr(&again)
    );
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    // Other flags on a finished run are refused, naming the difference.
    let other = train(&users_jsonl(), &out, &["--lr", "5e-3"]);
    assert_eq!(other.status.code(), Some(2));
    assert!(
        stderr(&other).contains("config.learning_rate: 0.01 → 0.005"),
        "{}",
        stderr(&other)
    );
}

#[test]
fn an_interrupted_run_continues_from_its_checkpoint() {
    let dir = TempDir::new("resume");
    let out = dir.join("out");
    let first = train(&users_jsonl(), &out, &["--stop-at-step", "3"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("stopped at step 3 of 6"),
        "{}",
        stderr(&first)
    );
    assert!(!out.join("manifest.json").exists());
    assert!(out.join("checkpoints/member-000/latest").is_file());

    // Another configuration, or other data, is refused, naming what changed.
    let rank = train(&users_jsonl(), &out, &["--rank", "4"]);
    assert_eq!(rank.status.code(), Some(2));
    assert!(
        stderr(&rank).contains("config.rank: 2 → 4"),
        "{}",
        stderr(&rank)
    );
    let more = dir.join("more.jsonl");
    let mut text = std::fs::read_to_string(users_jsonl()).unwrap();
    text.push_str("{\"user\": \"grace\", \"text\": \"one more user joins the data set here.\"}\n");
    std::fs::write(&more, text).unwrap();
    let data = train(&more, &out, &[]);
    assert_eq!(data.status.code(), Some(2));
    assert!(stderr(&data).contains("data.sha256"), "{}", stderr(&data));

    let second = train(&users_jsonl(), &out, &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    let err = stderr(&second);
    for k in 0..2 {
        assert!(
            err.contains(&format!(
                "member-{k:03}: resuming from the checkpoint at step 3 of 6"
            )),
            "{err}"
        );
    }
    // The checkpoint holds the whole trajectory's state: the resumed members
    // are bit-for-bit those of an uninterrupted run.
    let whole = dir.join("whole");
    let w = train(&users_jsonl(), &whole, &[]);
    assert!(w.status.success(), "{}", stderr(&w));
    for k in 0..2 {
        let f = format!("member-{k:03}/adapter_model.safetensors");
        assert_eq!(
            std::fs::read(out.join(&f)).unwrap(),
            std::fs::read(whole.join(&f)).unwrap(),
            "{f}"
        );
    }
    let (a, b) = (
        read_json(&out.join("manifest.json")),
        read_json(&whole.join("manifest.json")),
    );
    assert_eq!(a["members"], b["members"]);
}

/// A learning rate far too high makes the held-out loss rise after the first
/// steps: `--patience 2` stops each member two evaluations after its best one
/// and writes that best adapter.
#[test]
fn early_stopping_keeps_the_best_adapter() {
    let dir = TempDir::new("patience");
    let out = dir.join("out");
    let o = train(
        &users_jsonl(),
        &out,
        &[
            "--lr",
            "0.5",
            "--steps",
            "40",
            "--eval-every",
            "1",
            "--patience",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["config"]["patience"], 2);
    for rec in m["members"].as_array().unwrap() {
        let steps = rec["steps"].as_u64().unwrap();
        assert_eq!(rec["stopped_early"], true, "{rec}");
        assert!(steps < 40, "{rec}");
        assert_eq!(rec["adapter_step"].as_u64().unwrap() + 2, steps, "{rec}");
        let card =
            std::fs::read_to_string(out.join(rec["path"].as_str().unwrap()).join("README.md"))
                .unwrap();
        assert!(card.contains("(early stopping)"), "{card}");
    }
}

#[test]
fn dp_sgd_reports_an_epsilon_within_the_target() {
    let dir = TempDir::new("dp");
    let out = dir.join("out");
    let (model, tok, data) = (llama(), tokenizer(), users_jsonl());
    let dp = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            s(&data),
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--out",
            s(&out),
            "--dp-sgd",
            "--epsilon",
            "8",
            "--delta",
            "1e-5",
            "--rank",
            "2",
            "--steps",
            "4",
            "--batch",
            "4",
            "--block-size",
            "16",
            "--holdout",
            "0.1",
        ];
        args.extend(extra);
        privmix(&args)
    };
    // Interrupted after 2 of 4 steps, then continued from the checkpoint.
    let first = dp(&["--stop-at-step", "2"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("stopped at step 2 of 4"),
        "{}",
        stderr(&first)
    );
    assert!(!out.join("manifest.json").exists());
    let o = dp(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("dp-sgd: resuming from the checkpoint at step 2 of 4"),
        "{}",
        stderr(&o)
    );
    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["kind"], "dp_sgd");
    assert!(m["members"].as_array().unwrap().is_empty());
    assert!(m["partition"].is_null());
    let dp = &m["dp_sgd"];
    let eps = dp["epsilon"].as_f64().unwrap();
    assert!(eps > 0.0 && eps <= 8.0, "ε = {eps}");
    assert_eq!(dp["target_epsilon"], 8.0);
    assert_eq!(dp["delta"], 1e-5);
    assert_eq!(dp["steps"], 4);
    assert!(dp["noise_multiplier"].as_f64().unwrap() > 0.0);
    assert!(
        stderr(&o).contains(&format!("ε = {eps} at δ = 0.00001")),
        "{}",
        stderr(&o)
    );
    let folder = out.join("dp-sgd");
    let (_, shapes) = base();
    LoraAdapter::<B>::load_peft(&folder, &shapes, &Default::default()).unwrap();
    let card = std::fs::read_to_string(folder.join("README.md")).unwrap();
    assert!(
        card.contains(&format!("(ε, δ) = ({eps}, 0.00001)")),
        "{card}"
    );
    // The card may be released with the adapter: no hash of the data in it.
    assert!(!card.contains(m["data"]["sha256"].as_str().unwrap()));
}

#[test]
fn a_folder_and_stdin_are_read_as_users() {
    let dir = TempDir::new("folder");
    let users = dir.join("users");
    std::fs::create_dir_all(&users).unwrap();
    for (name, text) in [
        (
            "ann",
            "the quick brown fox jumps over the lazy dog again and again.",
        ),
        (
            "ben",
            "pack my box with five dozen liquor jugs, then pack it once more.",
        ),
        (
            "cat",
            "how vexingly quick daft zebras jump over the sleeping dogs today.",
        ),
        (
            "dan",
            "sphinx of black quartz, judge my vow, and judge it fairly please.",
        ),
    ] {
        std::fs::write(users.join(name), text).unwrap();
    }
    std::fs::write(users.join(".hidden"), "skipped").unwrap();
    let out = dir.join("out");
    let o = train(&users, &out, &["--steps", "1", "--seed", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = read_json(&out.join("manifest.json"));
    let names: Vec<&String> = m["partition"]["users"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(names, ["ann", "ben", "cat", "dan"]);

    let from_stdin = dir.join("stdin");
    let (model, tok) = (llama(), tokenizer());
    let mut child = Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args([
            "train",
            "--data",
            "-",
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--out",
            s(&from_stdin),
            "--members",
            "2",
            "--seed",
            "3",
            "--rank",
            "2",
            "--steps",
            "1",
            "--batch",
            "4",
            "--block-size",
            "16",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        &std::fs::read(users_jsonl()).unwrap(),
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let m = read_json(&from_stdin.join("manifest.json"));
    assert_eq!(m["data"]["users"], 6);
}

#[test]
fn bad_data_and_arguments_fail_naming_the_problem() {
    let dir = TempDir::new("bad");
    let cases: [(&str, &str); 4] = [
        (
            "{\"user\": \"a\", \"text\": \"fine\"}\n{\"user\": \"b\", \"text\": \"fine\"}\n{\"user\": \"c\"}\n",
            "line 3: field \"text\": missing",
        ),
        (
            "{\"user\": \"a\", \"text\": \"fine\"}\n{\"user\": [1], \"text\": \"x\"}\n",
            "line 2: field \"user\": expected a string, found an array",
        ),
        (
            "{\"user\": \"a\", \"text\": \"x\"}\n{oops\n",
            "line 2: not JSON",
        ),
        ("\n\n", "empty corpus"),
    ];
    for (i, (text, message)) in cases.iter().enumerate() {
        let data = dir.join(&format!("bad{i}.jsonl"));
        std::fs::write(&data, text).unwrap();
        let out = dir.join(&format!("out{i}"));
        let o = train(&data, &out, &[]);
        assert_eq!(o.status.code(), Some(2), "{text:?}");
        assert!(stderr(&o).contains(message), "{text:?}: {}", stderr(&o));
        assert!(!out.exists(), "nothing is written for bad data");
    }
    let out = dir.join("out");
    let refused: [(&[&str], &str); 5] = [
        (&["--holdout", "1.5"], "--holdout"),
        (&["--members", "0"], "--members"),
        (&["--target-modules", "q_proj,lm_head"], "--target-modules"),
        (&["--holdout", "0", "--patience", "2"], "--patience"),
        // Seed 5 hashes all six users to member 1.
        (&["--seed", "5"], "part 0 has no user"),
    ];
    for (extra, message) in refused {
        let o = train(&users_jsonl(), &out, extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}");
        assert!(stderr(&o).contains(message), "{extra:?}: {}", stderr(&o));
    }
    // --dp-sgd needs --epsilon, and trains no members (clap's usage errors, status 2).
    let (model, data) = (llama(), users_jsonl());
    let o = privmix(&[
        "train",
        "--data",
        s(&data),
        "--model",
        s(&model),
        "--out",
        s(&out),
        "--dp-sgd",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--epsilon"), "{}", stderr(&o));
    let o = train(&users_jsonl(), &out, &["--dp-sgd", "--epsilon", "4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // Block size larger than every user's text: no block to train on.
    let o = train(&users_jsonl(), &out, &["--block-size", "4096"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no complete block of 4096 tokens"),
        "{}",
        stderr(&o)
    );
    // --out that holds something else is not overwritten.
    let busy = dir.join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let o = train(&users_jsonl(), &busy, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("holds no privmix train run"),
        "{}",
        stderr(&o)
    );
}
