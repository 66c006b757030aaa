//! Two `privmix serve` replicas sharing one PostgreSQL ledger: concurrent clients on
//! both never get more acknowledged charges than the budget allows, the ledger holds
//! exactly the charges the clients were told about, and a replica killed with SIGKILL
//! mid-stream leaves the ledger consistent.

use crate::serve_support;
#[path = "../../src/ledger_store/test_cluster.rs"]
pub(crate) mod test_cluster;

use std::time::Duration;

use serde_json::{Value, json};
use serve_support::{Server, TempDir, model_folder, write_adapters};

fn replica(model: &str, adapters: &[String], ledger: &str, create: bool) -> Server {
    let mut args: Vec<String> = [
        "serve",
        "--model",
        model,
        "--ledger",
        ledger,
        "--no-auth",
        "--max-tokens",
        "4",
        "--model-name",
        "tiny",
        "--request-epsilon",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if create {
        args.extend(["--epsilon".to_string(), "3".to_string()]);
    }
    for a in adapters {
        args.extend(["--adapter".to_string(), a.clone()]);
    }
    Server::start(&args)
}

fn ledger_json(url: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(["ledger", "show", "--json", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn replicas_share_one_budget_and_survive_a_kill() {
    // The schema is made (with blocking PostgreSQL calls) before the async runtime starts.
    let schema = test_cluster::TestSchema::new("replicas");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(replicas(&schema));
}

async fn replicas(schema: &test_cluster::TestSchema) {
    let dir = TempDir::new("replicas");
    let model = model_folder(&dir);
    let adapters: Vec<String> = write_adapters(&model, &dir, 2)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let model = model.display().to_string();
    let a = replica(&model, &adapters, &schema.url, true);
    let b = replica(&model, &adapters, &schema.url, false);
    let bases = [a.base.clone(), b.base.clone()];

    // Six clients, alternating replicas, until each is refused.
    let http = reqwest::Client::new();
    let mut clients = Vec::new();
    for c in 0..6 {
        let http = http.clone();
        let bases = bases.clone();
        clients.push(tokio::spawn(async move {
            let mut told = 0u64;
            for i in 0.. {
                let base = &bases[(c + i) % 2];
                let r = http
                    .post(format!("{base}/v1/completions"))
                    .json(&json!({"model": "tiny", "prompt": "ab", "max_tokens": 4}))
                    .send()
                    .await
                    .unwrap();
                if r.status() == 429 {
                    break;
                }
                assert_eq!(r.status(), 200);
                let body: Value = r.json().await.unwrap();
                told += body["usage"]["completion_tokens"].as_u64().unwrap();
            }
            told
        }));
    }
    let mut told = 0;
    for c in clients {
        told += c.await.unwrap();
    }
    let ledger = ledger_json(&schema.url);
    let spent = ledger["spent"]["epsilon"].as_f64().unwrap();
    let budget = ledger["budget"]["epsilon"].as_f64().unwrap();
    println!(
        "replicas: clients were told {told} tokens; the ledger holds {} charges, ε spent {spent} of {budget}",
        ledger["charges"]
    );
    assert!(spent <= budget, "spent {spent} > budget {budget}: {ledger}");
    assert_eq!(ledger["charges"].as_u64().unwrap(), told, "{ledger}");
    assert!(told > 0);
    a.stop(Duration::from_secs(30));
    b.stop(Duration::from_secs(30));

    // A fresh budget, a stream, and a SIGKILL after its first token.
    let raise = std::process::Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(["ledger", "raise", &schema.url, "--epsilon", "30"])
        .output()
        .unwrap();
    assert!(
        raise.status.success(),
        "{}",
        String::from_utf8_lossy(&raise.stderr)
    );
    let before = ledger_json(&schema.url)["charges"].as_u64().unwrap();
    let c = replica(&model, &adapters, &schema.url, false);
    let mut r = http
        .post(format!("{}/v1/completions", c.base))
        .json(&json!({"model": "tiny", "prompt": "ab", "max_tokens": 4, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().expect("a first event");
    assert!(String::from_utf8_lossy(&first).contains("data: "));
    c.kill();
    let _ = c.wait(Duration::from_secs(30));
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(["ledger", "verify", &schema.url])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let after = ledger_json(&schema.url);
    let charged = after["charges"].as_u64().unwrap() - before;
    println!("kill: {charged} charges recorded for the killed stream, ledger verifies");
    // The released token was charged; at most the request's own tokens were.
    assert!((1..=4).contains(&charged), "{after}");
    assert!(after["spent"]["epsilon"].as_f64().unwrap() <= 30.0);
    // A replica starts again on the same ledger and charges on.
    let d = replica(&model, &adapters, &schema.url, false);
    let r = http
        .post(format!("{}/v1/completions", d.base))
        .json(&json!({"model": "tiny", "prompt": "ab", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    d.stop(Duration::from_secs(30));
}
