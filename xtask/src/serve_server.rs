//! The processes of the serving step: a server started and waited on until it is
//! ready, killed when dropped; `privmix serve`'s arguments in every serving row; and
//! the load script's client levels against one or more servers. Used by the
//! single-server rows (`serve_load`) and the replica rows (`serve_replicas`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Members of the served ensemble.
pub(crate) const MEMBERS: usize = 8;

/// `privmix serve`'s arguments in every serving row: PMixED over `gguf` with the
/// bench's members, a budget no level spends, up to 32 requests per batch of up to 32
/// tokens, on a free loopback port, charging `ledger` (a folder or a PostgreSQL URL).
pub(crate) fn serve_args(gguf: &Path, ledger: &str, members: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        gguf.display().to_string(),
        "--ledger".into(),
        ledger.into(),
        "--epsilon".into(),
        "1000000".into(),
        "--no-auth".into(),
        "--max-batch".into(),
        "32".into(),
        "--max-tokens".into(),
        "32".into(),
        "--model-name".into(),
        "smollm2".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        // The members are random adapters, not private data: their step timings
        // may be printed.
        "--phase-timings".into(),
        "--unsafe-uncharged-timings".into(),
    ];
    for i in 0..MEMBERS {
        args.push("--adapter".into());
        args.push(members.join(format!("member-{i}")).display().to_string());
    }
    args
}

/// The load script's rows: `clients` (comma-separated levels) streaming clients in
/// turn, for `seconds` each, spread over `url` (comma-separated servers, client i on
/// the i-th modulo their number).
pub(crate) fn load(
    python: &str,
    script: &Path,
    url: &str,
    model: &str,
    label: &str,
    clients: &str,
    seconds: &str,
) -> Result<Vec<Value>, String> {
    let out = Command::new(python)
        .arg(script)
        .args([
            "--url",
            url,
            "--model",
            model,
            "--label",
            label,
            "--clients",
            clients,
        ])
        .args(["--seconds", seconds])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad load output {l}: {e}")))
        .collect()
}

/// A server process, killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    /// Every stderr line after the ready line.
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `cmd` and waits (up to 5 minutes) for a stderr line containing `ready`;
    /// a `http://…` address on that line is the URL.
    pub(crate) fn start(cmd: &mut Command, ready: &str) -> Result<Self, String> {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let ready = ready.to_string();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sent {
                    if let Ok(mut kept) = kept.lock() {
                        kept.push(line);
                    }
                    continue;
                }
                if line.contains(&ready) {
                    let url = line
                        .find("http://")
                        .map(|i| {
                            line[i..]
                                .split_whitespace()
                                .next()
                                .unwrap_or("")
                                .to_string()
                        })
                        .unwrap_or_default();
                    let _ = tx.send(url);
                    sent = true;
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(url) => Ok(Self { child, url, lines }),
            Err(_) => {
                let _ = child.kill();
                let status = child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                Err(format!("{cmd:?} did not become ready ({status})"))
            }
        }
    }
}

impl Server {
    /// How the process ended, if it has.
    pub(crate) fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|s| s.to_string())
    }

    /// The stderr lines so far (after the ready line) that contain `text`.
    pub(crate) fn lines_containing(&self, text: &str) -> Vec<String> {
        self.lines
            .lock()
            .map(|l| l.iter().filter(|l| l.contains(text)).cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(2));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_exits_before_ready_is_an_error_naming_its_exit() {
        let err = Server::start(Command::new("sh").args(["-c", "exit 3"]), "ready")
            .err()
            .unwrap();
        assert!(
            err.contains("did not become ready") && err.contains('3'),
            "{err}"
        );
    }
}
