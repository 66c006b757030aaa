//! `privmix serve` end to end on loopback: the tiny Llama fixture
//! (models/tests/fixtures/hf/llama, vocabulary 256) with a byte-level tokenizer, a
//! ChatML template and random PEFT members; a file ledger. Every check talks HTTP to
//! the real binary.

use crate::serve_support;

use std::time::Duration;

use serde_json::{Value, json};
use serve_support::{Server, TempDir, ledger_charges, model_folder, write_adapters, write_keys};

const BOB: &str = "sk-bob-0123456789abcdef";
const ALICE: &str = "sk-alice-0123456789abcdef";

fn start(dir: &TempDir, extra: &[&str]) -> Server {
    let model = model_folder(dir);
    let adapters = write_adapters(&model, dir, 2);
    let keys = write_keys(
        dir,
        &json!({"keys": [
            {"key": BOB, "tenant": "bob"},
            {"key": ALICE, "tenant": "alice", "epsilon": 0.05}
        ]}),
    );
    let ledger = dir.join("ledger");
    let mut args = vec![
        "serve".to_string(),
        "--model".into(),
        model.display().to_string(),
        "--ledger".into(),
        ledger.display().to_string(),
        "--epsilon".into(),
        "40".into(),
        "--api-keys".into(),
        keys.display().to_string(),
        "--max-tokens".into(),
        "8".into(),
        "--max-prompt-tokens".into(),
        "64".into(),
        "--model-name".into(),
        "tiny".into(),
    ];
    for a in adapters {
        args.push("--adapter".into());
        args.push(a.display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_completions_and_charges_every_token() {
    let dir = TempDir::new("serve-e2e");
    let server = start(&dir, &[]);
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", server.base);

    let health = http.get(url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);

    // Keys.
    let r = http.get(url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(url("/v1/models"))
        .bearer_auth("sk-wrong-0123456789abcdef")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let models: Value = http
        .get(url("/v1/models"))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");

    // A completion, not streamed.
    let r = http
        .post(url("/v1/completions"))
        .bearer_auth(BOB)
        .json(&json!({"model": "tiny", "prompt": "Hello", "max_tokens": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "text_completion");
    let usage = &body["usage"];
    let completed = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=5).contains(&completed), "{body}");
    assert!(
        usage["privacy"]["epsilon_spent"].as_f64().unwrap() > 0.0,
        "{body}"
    );
    let left = usage["privacy"]["total_epsilon_left"].as_f64().unwrap();
    assert!(left < 40.0 && left > 0.0, "{body}");

    // A chat completion, streamed, with the usage chunk.
    let r = http
        .post(url("/v1/chat/completions"))
        .bearer_auth(BOB)
        .json(
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*data.last().unwrap(), "[DONE]", "{text}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage_chunk = chunks.last().unwrap();
    let streamed = usage_chunk["usage"]["completion_tokens"].as_u64().unwrap();
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert!(finish == "length" || finish == "stop", "{text}");

    // The ledger holds one charge per released token, each under its tenant.
    let charges = ledger_charges(&dir.join("ledger"));
    assert_eq!(
        charges.iter().filter(|l| l.contains("tenant=bob")).count() as u64,
        completed + streamed
    );

    // Bad input: 400 naming the field.
    for (body, field) in [
        (json!({"model": "other", "prompt": "x"}), "model"),
        (json!({"model": "tiny", "prompt": "x", "n": 2}), "n"),
        (
            json!({"model": "tiny", "prompt": "x", "logprobs": 2}),
            "logprobs",
        ),
        (
            json!({"model": "tiny", "prompt": "x", "max_tokens": 9}),
            "max_tokens",
        ),
        (
            json!({"model": "tiny", "prompt": "x".repeat(500)}),
            "prompt",
        ),
        (json!({"model": "tiny", "prompt": 3}), "prompt"),
    ] {
        let r = http
            .post(url("/v1/completions"))
            .bearer_auth(BOB)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        let named = e["error"]["param"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_default()
            + e["error"]["message"].as_str().unwrap();
        assert!(named.contains(field), "{body}: {e}");
    }
    let r = http
        .post(url("/v1/completions"))
        .bearer_auth(BOB)
        .header("content-type", "application/json")
        .body("{\"model\": \"tiny\", \"prompt\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_json");

    // Alice's own budget runs out: 429 naming it, and nothing more is charged to her.
    let mut refused = None;
    for _ in 0..200 {
        let r = http
            .post(url("/v1/completions"))
            .bearer_auth(ALICE)
            .json(&json!({"model": "tiny", "prompt": "Hello", "max_tokens": 8}))
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            refused = Some(r.json::<Value>().await.unwrap());
            break;
        }
        assert_eq!(r.status(), 200);
    }
    let refused = refused.expect("alice's budget of 0.05 runs out");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alice"),
        "{refused}"
    );
    let before = ledger_charges(&dir.join("ledger")).len();
    let r = http
        .post(url("/v1/completions"))
        .bearer_auth(ALICE)
        .json(&json!({"model": "tiny", "prompt": "Hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(ledger_charges(&dir.join("ledger")).len(), before);
    // Bob still has the members' total.
    let r = http
        .post(url("/v1/completions"))
        .bearer_auth(BOB)
        .json(&json!({"model": "tiny", "prompt": "Hello", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let status = server.stop(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
}

/// Six requests of prompts of 2 to 12 bytes (each fed to 3 rows), at most 4
/// decoded together, and a prefill budget of 16 row-tokens per step: arrivals are
/// prefilled together when they fit, in chunks over several steps when they do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_batched_and_shutdown_drains_them() {
    let dir = TempDir::new("serve-batch");
    let server = start(&dir, &["--max-batch", "4", "--prefill-budget", "16"]);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", server.base);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let http = http.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(&url)
                .bearer_auth(BOB)
                .json(&json!({"model": "tiny", "prompt": "ab".repeat(i + 1), "max_tokens": 8, "stream": true}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let text = r.text().await.unwrap();
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            text.lines().filter(|l| l.starts_with("data: {")).count()
        }));
        if i == 3 {
            // Shut down while requests are in flight: they finish with their charges.
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.terminate();
        }
    }
    let mut answered = 0;
    for t in tasks {
        if let Ok(n) = t.await {
            answered += usize::from(n > 0);
        }
    }
    assert!(answered >= 4, "in-flight requests were drained: {answered}");
    let status = server.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(["ledger", "verify", dir.join("ledger").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ε `serve` publishes for an AdaPMixED request is the same for every member set
/// (issue 39 §2): members within 1e-4 of the public model (screening finds nothing
/// private) and members far from it (screening finds them private), same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapmixed_publishes_the_same_epsilon_for_every_member_set() {
    let dir = TempDir::new("serve-ada-eps");
    let model = model_folder(&dir);
    let near = serve_support::write_adapters_with_std(&model, &dir.join(""), "near", 2, 1e-4);
    let far = serve_support::write_adapters_with_std(&model, &dir.join(""), "far", 2, 2.0);
    let http = reqwest::Client::new();
    let mut published = Vec::new();
    for (name, adapters) in [("near", &near), ("far", &far)] {
        let ledger = dir.join(&format!("ledger-{name}"));
        let server =
            serve_support::start_no_auth(&model, adapters, &ledger, &["--mechanism", "adapmixed"]);
        let body: Value = http
            .post(format!("{}/v1/completions", server.base))
            .json(&json!({"model": "tiny", "prompt": "xy", "max_tokens": 6}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let usage = &body["usage"];
        published.push((
            usage["completion_tokens"].clone(),
            usage["privacy"]["epsilon_spent"].clone(),
            usage["privacy"]["total_epsilon_left"].clone(),
            body["choices"][0]["finish_reason"].clone(),
        ));
        server.stop(Duration::from_secs(20));
    }
    assert!(
        published[0].1.as_f64().is_some_and(|e| e > 0.0),
        "{published:?}"
    );
    assert_eq!(
        published[0], published[1],
        "the published ε depends on the members"
    );
}
