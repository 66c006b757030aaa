//! Helpers of the `privmix serve` tests: a running server on loopback, a model folder
//! with a chat template, members, keys and the ledger's charges.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_models::{LoadOptions, Model};
use serde_json::Value;

pub use crate::support::TempDir;
use crate::support::fixture;

/// The tiny Llama fixture with the byte-level tokenizer and a ChatML chat template
/// (`tokenizer_config.json`), copied into `dir/model`.
pub fn model_folder(dir: &TempDir) -> PathBuf {
    let out = dir.join("model");
    std::fs::create_dir_all(&out).unwrap();
    let llama = fixture("../models/tests/fixtures/hf/llama");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(llama.join(f), out.join(f)).unwrap();
    }
    std::fs::copy(
        fixture("tests/fixtures/tokenizer/tokenizer.json"),
        out.join("tokenizer.json"),
    )
    .unwrap();
    let template = "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    std::fs::write(
        out.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template}).to_string(),
    )
    .unwrap();
    out
}

/// `n` random rank-2 PEFT members (fixed seeds) for the model at `model`.
pub fn write_adapters(model: &Path, dir: &TempDir, n: usize) -> Vec<PathBuf> {
    write_adapters_with_std(model, &dir.join(""), "adapter", n, 0.3)
}

/// `n` rank-2 PEFT members written to `folder/{name}{i}`, whose factors are i.i.d.
/// `N(0, std²)` (fixed seeds): a small std gives members close to the public model.
pub fn write_adapters_with_std(
    model: &Path,
    folder: &Path,
    name: &str,
    n: usize,
    std: f32,
) -> Vec<PathBuf> {
    let device = Default::default();
    let m = Model::<Flex>::load(LoadOptions::path(model, &device)).unwrap();
    let base = m.base_shapes().unwrap();
    (0..n)
        .map(|i| {
            let config = LoraConfig::new(2, 4.0, &["q_proj", "v_proj", "down_proj"]).unwrap();
            let a =
                LoraAdapter::<Flex>::random(config, &base, std, 100 + i as u64, &device).unwrap();
            let path = folder.join(format!("{name}{i}"));
            a.save_peft(&path).unwrap();
            path
        })
        .collect()
}

/// A rank-2 PEFT member whose factors are drawn with standard deviation 10³⁰: finite
/// (it loads), but its products overflow f32, so its log-probabilities are not finite.
pub fn write_exploding_adapter(model: &Path, dir: &TempDir) -> PathBuf {
    let device = Default::default();
    let m = Model::<Flex>::load(LoadOptions::path(model, &device)).unwrap();
    let base = m.base_shapes().unwrap();
    let config = LoraConfig::new(2, 4.0, &["q_proj", "v_proj", "down_proj"]).unwrap();
    let a = LoraAdapter::<Flex>::random(config, &base, 1e30, 7, &device).unwrap();
    let path = dir.join("exploding");
    a.save_peft(&path).unwrap();
    path
}

/// `privmix serve --no-auth` over `adapters`, a file ledger of ε = 40 at `ledger`, plus
/// `extra`.
pub fn start_no_auth(model: &Path, adapters: &[PathBuf], ledger: &Path, extra: &[&str]) -> Server {
    let mut args: Vec<String> = [
        "serve",
        "--model",
        &model.display().to_string(),
        "--ledger",
        &ledger.display().to_string(),
        "--epsilon",
        "40",
        "--no-auth",
        "--max-tokens",
        "8",
        "--model-name",
        "tiny",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for a in adapters {
        args.push("--adapter".into());
        args.push(a.display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start(&args)
}

/// Writes an API keys file.
pub fn write_keys(dir: &TempDir, keys: &Value) -> PathBuf {
    let path = dir.join("keys.json");
    std::fs::write(&path, keys.to_string()).unwrap();
    path
}

/// Runs `privmix` with `args` to completion, which must succeed (its stderr is the
/// failure's message); its stdout.
pub fn privmix_ok(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_privmix"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "privmix {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every charge in a ledger (file path or PostgreSQL URL), read with `privmix ledger
/// export`, as `tenant=<name>;<label>` (or the bare label without a tenant): a charge
/// record as one, a step record's run as `count` of them.
pub fn ledger_charges(ledger: &Path) -> Vec<String> {
    let out = privmix_ok(&["ledger", "export", ledger.to_str().unwrap()]);
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| match v["kind"].as_str() {
            Some("charge") => vec![(v.clone(), 1)],
            Some("step") => v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r.clone(), r["count"].as_u64().unwrap()))
                .collect(),
            _ => Vec::new(),
        })
        .flat_map(|(v, count)| {
            let label = v["label"].as_str().unwrap_or_default();
            let charge = match v["tenant"].as_str() {
                Some(t) => format!("tenant={t};{label}"),
                None => label.to_string(),
            };
            std::iter::repeat_n(charge, count as usize)
        })
        .collect()
}

/// A `privmix serve` child process and its base URL.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    /// Starts `privmix <args> --listen 127.0.0.1:0` and waits for its address.
    pub fn start(args: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_privmix"))
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("privmix serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                if !sent && let Some(i) = line.find("http://") {
                    let url: String = line[i..].split_whitespace().next().unwrap().to_string();
                    let _ = tx.send(url);
                    sent = true;
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server prints its address");
        Self { child, base }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        signal(self.child.id(), "-TERM");
    }

    /// Sends SIGKILL.
    pub fn kill(&self) {
        signal(self.child.id(), "-KILL");
    }

    /// Waits for the child to exit (killing it after `timeout`).
    pub fn wait(mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits.
    pub fn stop(self, timeout: Duration) -> ExitStatus {
        self.terminate();
        self.wait(timeout)
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
