//! Two `privmix serve` replicas sharing one PostgreSQL ledger: concurrent clients on
//! both never get more acknowledged charges than the budget allows, the ledger holds
//! exactly the charges the clients were told about, and a replica killed with SIGKILL
//! mid-stream leaves the ledger consistent. One replica spends from budget leases
//! (`--lease-charges`), the other charges the ledger at every step; a replica killed
//! while holding a lease leaves its unspent part counted, never an under-count.

use crate::serve_support;
#[path = "../../src/ledger_store/test_cluster.rs"]
pub(crate) mod test_cluster;

use std::time::Duration;

use serde_json::{Value, json};
use serve_support::{Server, TempDir, model_folder, privmix_ok, write_adapters};

fn replica(
    model: &str,
    adapters: &[String],
    ledger: &str,
    create: bool,
    lease: Option<u64>,
) -> Server {
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
    if let Some(n) = lease {
        args.extend(["--lease-charges".to_string(), n.to_string()]);
    }
    for a in adapters {
        args.extend(["--adapter".to_string(), a.clone()]);
    }
    Server::start(&args)
}

fn ledger_json(url: &str) -> Value {
    serde_json::from_slice(&privmix_ok(&["ledger", "show", "--json", url])).unwrap()
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
    let a = replica(&model, &adapters, &schema.url, true, None);
    let b = replica(&model, &adapters, &schema.url, false, Some(3));
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
    // Every token told is a charge of the ledger or a charge spent from a lease (whose
    // reservations are the ledger's charges too).
    let (reservations, from_leases) = lease_totals(&ledger);
    assert!(reservations > 0, "{ledger}");
    assert_eq!(
        ledger["charges"].as_u64().unwrap() - reservations + from_leases,
        told,
        "{ledger}"
    );
    assert!(told > 0);
    a.stop(Duration::from_secs(30));
    b.stop(Duration::from_secs(30));
    // A clean stop closed the leases, giving back their unspent part: the spending
    // dropped and still covers every charge, and the ledger verifies.
    let stopped = ledger_json(&schema.url);
    let closed = stopped["leases"].as_array().unwrap();
    assert!(
        !closed.is_empty() && closed.iter().all(|l| l["closed"] == json!(true)),
        "{stopped}"
    );
    assert!(
        stopped["spent"]["epsilon"].as_f64().unwrap() <= spent,
        "{stopped}"
    );
    privmix_ok(&["ledger", "verify", &schema.url]);

    // A fresh budget, a stream, and a SIGKILL after its first token.
    privmix_ok(&["ledger", "raise", &schema.url, "--epsilon", "30"]);
    let before = ledger_json(&schema.url);
    let c = replica(&model, &adapters, &schema.url, false, Some(8));
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
    privmix_ok(&["ledger", "verify", &schema.url]);
    let after = ledger_json(&schema.url);
    let leases = after["leases"].as_array().unwrap();
    let held = &leases[leases.len() - 1];
    let spent_from_lease = held["charges"].as_u64().unwrap();
    println!("kill: the killed replica's lease spent {spent_from_lease} charges: {held}");
    // The released token was spent from the lease; at most the request's own tokens
    // were; all of them within what the lease reserved, which the ledger counts as
    // spent, within the budget.
    assert!((1..=4).contains(&spent_from_lease), "{after}");
    assert!(
        held["used"]["epsilon"].as_f64().unwrap() <= held["reserved"]["epsilon"].as_f64().unwrap()
    );
    let (r0, _) = lease_totals(&before);
    let (r1, _) = lease_totals(&after);
    assert_eq!(
        after["charges"].as_u64().unwrap() - before["charges"].as_u64().unwrap(),
        r1 - r0,
        "the leased replica charged the ledger only by reserving: {after}"
    );
    assert!(after["spent"]["epsilon"].as_f64().unwrap() <= 30.0);
    // A replica starts again on the same ledger and charges on.
    let d = replica(&model, &adapters, &schema.url, false, None);
    let r = http
        .post(format!("{}/v1/completions", d.base))
        .json(&json!({"model": "tiny", "prompt": "ab", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    d.stop(Duration::from_secs(30));
}

/// The reservations the ledger's leases made and the charges spent from them.
fn lease_totals(ledger: &Value) -> (u64, u64) {
    let leases = ledger["leases"].as_array().expect("a list of leases");
    let sum = |key: &str| leases.iter().map(|l| l[key].as_u64().unwrap()).sum::<u64>();
    (sum("reservations"), sum("charges"))
}

#[test]
fn a_postgresql_ledger_takes_no_tenant_budgets_from_a_keys_file() {
    let schema = test_cluster::TestSchema::new("keys_budgets");
    let dir = TempDir::new("keys-budgets");
    let model = model_folder(&dir);
    let adapters = write_adapters(&model, &dir, 1);
    let keys = dir.join("keys.json");
    std::fs::write(
        &keys,
        r#"{"keys": [{"key": "sk-aaaaaaaaaaaaaaaa", "tenant": "a", "epsilon": 1}]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--ledger", &schema.url, "--epsilon", "3", "--api-keys"])
        .arg(&keys)
        .arg("--adapter")
        .arg(&adapters[0])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("privmix ledger tenant-budget"), "{stderr}");
}
