//! What leaves the process besides the charged tokens: `serve --step-time-ms` puts every
//! request's releases on a fixed schedule, and an error built from a member's values
//! (a non-finite log-probability) reaches the client, the stream and stderr as the kind
//! of problem only.

use crate::serve_support;

use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use serve_support::{
    TempDir, ledger_charges, model_folder, start_no_auth, write_adapters, write_exploding_adapter,
};

/// A streamed completion: each server-sent event's data with the moment it arrived.
async fn stream(http: &reqwest::Client, base: &str, prompt: &str) -> Vec<(Instant, String)> {
    let r = http
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": prompt, "max_tokens": 6, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let (mut buffer, mut events) = (String::new(), Vec::new());
    while let Some(bytes) = body.next().await {
        let now = Instant::now();
        buffer.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                events.push((now, data.to_string()));
            }
        }
    }
    events
}

/// Offsets of the events after the first, in periods of `period`: each must be a whole
/// number of periods (to the tolerance) and non-decreasing.
fn whole_periods(events: &[(Instant, String)], period: Duration, tolerance: Duration) -> Vec<u32> {
    let first = events[0].0;
    events
        .iter()
        .map(|(at, data)| {
            let offset = *at - first;
            let k = (offset.as_secs_f64() / period.as_secs_f64()).round();
            let due = period.mul_f64(k);
            let off = offset.abs_diff(due);
            assert!(
                off <= tolerance,
                "{data} arrived {offset:?} after the first event, {off:?} from {k} periods"
            );
            k as u32
        })
        .collect()
}

/// With `--step-time-ms 250` every event of a streamed request arrives a whole number
/// of periods after the request's first one, alone and while four other requests
/// are decoded in the same batch (each step then does five requests' mechanism work
/// and a five times larger forward): the release offsets do not depend on the work.
/// Consecutive text chunks of different steps are at least one period apart, and the
/// request's charges are all in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_releases_every_token_on_its_schedule() {
    let dir = TempDir::new("pace");
    let model = model_folder(&dir);
    let adapters = write_adapters(&model, &dir, 3);
    let server = start_no_auth(
        &model,
        &adapters,
        &dir.join("ledger"),
        &["--step-time-ms", "250"],
    );
    let http = reqwest::Client::new();
    // A step of the tiny model takes milliseconds; the margins are for a loaded
    // machine (the whole suite runs beside this test).
    let period = Duration::from_millis(250);
    let tolerance = Duration::from_millis(80);

    let alone = stream(&http, &server.base, "Hello").await;
    let mut busy_runs = Vec::new();
    for _ in 0..4 {
        let (http, base) = (http.clone(), server.base.clone());
        busy_runs.push(tokio::spawn(async move {
            stream(&http, &base, "The quick brown fox").await
        }));
    }
    let busy = stream(&http, &server.base, "Hello").await;
    for run in busy_runs {
        let other = run.await.unwrap();
        whole_periods(&other, period, tolerance);
    }
    for events in [&alone, &busy] {
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let ks = whole_periods(events, period, tolerance);
        assert!(ks.windows(2).all(|w| w[0] <= w[1]), "{ks:?}");
        let texts = events
            .iter()
            .filter(|(_, d)| {
                serde_json::from_str::<Value>(d)
                    .is_ok_and(|v| v["choices"][0]["finish_reason"].is_null())
            })
            .count();
        println!("{texts} text chunks at periods {ks:?}");
        // The final chunk carries the finish reason (an overrun, possible only on a
        // machine so loaded that a step takes 250 ms, ends on the schedule too).
        let last: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
        let finish = last["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(
            ["stop", "length", "step_overran"].contains(&finish),
            "{last}"
        );
    }
    assert!(!ledger_charges(&dir.join("ledger")).is_empty());
    drop(server);
}

/// True when `text` holds a digit, or spells a non-finite value.
fn leaks_a_value(text: &str) -> bool {
    text.chars().any(|c| c.is_ascii_digit())
        || text.contains('∞')
        || text
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| ["nan", "inf", "infinity"].contains(&w.to_ascii_lowercase().as_str()))
}

/// A member whose log-probabilities are not finite fails the request with a 500 whose
/// message names the kind of problem, with no digit (no row, index or value) and no
/// spelled-out NaN or ∞ — streamed or not — and the server goes on serving; `privmix
/// generate` over the same member fails with such a message on stderr, and with
/// `--json` prints no value either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_member_values_never_leave_the_process() {
    let dir = TempDir::new("nonfinite");
    let model = model_folder(&dir);
    let mut adapters = write_adapters(&model, &dir, 1);
    adapters.push(write_exploding_adapter(&model, &dir));
    let server = start_no_auth(&model, &adapters, &dir.join("ledger"), &[]);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", server.base);
    let r = http
        .post(&url)
        .json(&json!({"model": "tiny", "prompt": "Hello", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let body = r.text().await.unwrap();
    println!("{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("non-finite"), "{body}");
    assert!(!leaks_a_value(&body), "{body}");

    let r = http
        .post(&url)
        .json(&json!({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "stream": true}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(!leaks_a_value(&body), "{body}");
    // Still serving.
    let health = http
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    drop(server);

    let tokenizer = model.join("tokenizer.json");
    let ledger = dir.join("generate-ledger");
    for json_flag in [false, true] {
        let mut args = vec![
            "generate".to_string(),
            "--model".into(),
            model.display().to_string(),
            "--tokenizer".into(),
            tokenizer.display().to_string(),
            "--prompt".into(),
            "Hello".into(),
            "--max-tokens".into(),
            "3".into(),
            "--ledger".into(),
            ledger.display().to_string(),
            "--epsilon".into(),
            "8".into(),
        ];
        for a in &adapters {
            args.push("--adapter".into());
            args.push(a.display().to_string());
        }
        if json_flag {
            args.push("--json".into());
        }
        let out = Command::new(env!("CARGO_BIN_EXE_privmix"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let error: Vec<&str> = stderr
            .lines()
            .skip_while(|l| !l.starts_with("privmix: error:"))
            .collect();
        println!("{error:?}");
        assert!(!error.is_empty(), "{stderr}");
        assert!(error[0].contains("non-finite"), "{stderr}");
        for line in &error {
            assert!(!leaks_a_value(line), "{line}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!leaks_a_value(
            &stdout.replace(|c: char| c.is_ascii_digit(), "")
        ));
        assert!(
            !stdout.contains("NaN") && !stdout.contains("row"),
            "{stdout}"
        );
    }
}
