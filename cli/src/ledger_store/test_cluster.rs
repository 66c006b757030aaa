//! A PostgreSQL server for tests, and a fresh schema per test.
//!
//! The server is `PRIVMIX_TEST_POSTGRES` (a `postgres://…` URL) when that is set, as CI
//! does. Otherwise the first test to ask starts a private throwaway cluster: `initdb`
//! into a new temporary folder (as the `postgres` user when running as root, since
//! `initdb` refuses root), and `postgres` listening only on a Unix socket in that folder.
//! A shell watching the test process's pipe stops the server and deletes the folder when
//! the test process exits, however it exits. Without PostgreSQL's binaries the tests
//! fail, saying how to provide a server: they never pass without one.
//!
//! The server keeps `fsync` and `synchronous_commit` on, which the store requires.

use std::io::Read;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[path = "pg_binaries.rs"]
mod pg_binaries;
use pg_binaries::{bindir, cluster_folder, initdb};

/// The environment variable naming the server tests use.
pub const ENV: &str = "PRIVMIX_TEST_POSTGRES";

/// The server's URL (a private cluster is started on first use).
pub fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match std::env::var(ENV) {
        Ok(url) if !url.is_empty() => url,
        _ => match start_private_cluster() {
            Ok(url) => url,
            Err(e) => panic!(
                "no PostgreSQL server for the ledger store tests: {ENV} is not set and a private \
                 cluster could not be started: {e}. Set {ENV}=postgres://user@host/db, or install \
                 PostgreSQL (Debian: apt-get install postgresql)"
            ),
        },
    })
}

/// A schema of its own on the test server, dropped when this is dropped; `url` points
/// a store at it (through `search_path`).
pub struct TestSchema {
    /// The URL with `options=-c search_path=<schema>`.
    pub url: String,
    name: String,
}

impl TestSchema {
    /// A new, empty schema whose name starts with `tag`.
    pub fn new(tag: &str) -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tag: String = tag
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let name = format!("privmix_{tag}_{}_{n}_{nanos}", std::process::id());
        let base = server_url();
        let mut client = postgres::Client::connect(base, postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .unwrap_or_else(|e| panic!("cannot create schema {name}: {e}"));
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
        Self { url, name }
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(server_url(), postgres::NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

/// The watcher's stdin: held open for the test process's life; its end (the process
/// exiting) tells the watcher to stop the server and delete its folder.
static WATCHER: OnceLock<Mutex<(Child, ChildStdin)>> = OnceLock::new();

/// Starts a cluster in a new temporary folder; returns its URL.
fn start_private_cluster() -> Result<String, String> {
    let bin = bindir()?;
    let (dir, as_owner) = cluster_folder("privmix-pg")?;
    let data = dir.join("data");
    initdb(&bin, &as_owner, &data)?;
    // A fixed port is fine: the socket lives in this cluster's own folder.
    let port = 5432;
    let server = format!(
        "{} {} -D {} -k {} -p {port} -c listen_addresses= -c fsync=on -c synchronous_commit=on",
        as_owner.join(" "),
        bin.join("postgres").display(),
        data.display(),
        dir.display()
    );
    // The watcher: starts the server, waits for its stdin to close (the test process
    // has exited), then stops the server (fast shutdown) and deletes the folder.
    let script = format!(
        "{server} >{log} 2>&1 & pid=$!; read -r _; kill -INT $pid; wait $pid; rm -rf {dir}",
        log = dir.join("server.log").display(),
        dir = dir.display()
    );
    let mut watcher = Command::new("sh")
        .args(["-c", &script])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let stdin = watcher
        .stdin
        .take()
        .ok_or("the watcher has no stdin pipe")?;
    let url = format!(
        "postgresql://privmix@/postgres?host={}&port={port}",
        dir.display()
    );
    let _ = WATCHER.set(Mutex::new((watcher, stdin)));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match postgres::Client::connect(&url, postgres::NoTls) {
            Ok(_) => return Ok(url),
            Err(e) if Instant::now() > deadline => {
                let mut log = String::new();
                let _ = std::fs::File::open(dir.join("server.log"))
                    .and_then(|mut f| f.read_to_string(&mut log));
                return Err(format!(
                    "the server did not accept connections ({e}); its log:\n{log}"
                ));
            }
            Err(_) => {
                if let Some(w) = WATCHER.get()
                    && let Ok(mut guard) = w.lock()
                    && let Ok(Some(status)) = guard.0.try_wait()
                {
                    let mut log = String::new();
                    let _ = std::fs::File::open(dir.join("server.log"))
                        .and_then(|mut f| f.read_to_string(&mut log));
                    return Err(format!("the server exited ({status}); its log:\n{log}"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
