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
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// The folder of PostgreSQL's server binaries: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian), else the folder of `initdb` on PATH.
fn bindir() -> Result<PathBuf, String> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_initdb(&dir) {
            return Ok(dir);
        }
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, dir)| has_initdb(dir))
        .collect();
    debian.sort();
    if let Some((_, dir)) = debian.pop() {
        return Ok(dir);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_initdb(&dir) {
                return Ok(dir);
            }
        }
    }
    Err("no PostgreSQL server binaries (initdb, postgres) were found".into())
}

/// The output of `cmd args…`, trimmed, or why not.
fn output(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Starts a cluster in a new temporary folder; returns its URL.
fn start_private_cluster() -> Result<String, String> {
    let bin = bindir()?;
    let root = output("id", &["-u"])? == "0";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("privmix-pg-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // As root, the cluster belongs to `postgres`, and every server command runs as it.
    let as_owner: Vec<String> = if root {
        let uid: u32 = output("id", &["-u", "postgres"])?
            .parse()
            .map_err(|_| "the postgres user's uid is not a number".to_string())?;
        let gid: u32 = output("id", &["-g", "postgres"])?
            .parse()
            .map_err(|_| "the postgres user's gid is not a number".to_string())?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot hand {} to postgres: {e}", dir.display()))?;
        vec![
            "setpriv".into(),
            "--reuid=postgres".into(),
            "--regid=postgres".into(),
            "--init-groups".into(),
            "--".into(),
        ]
    } else {
        Vec::new()
    };
    let data = dir.join("data");
    let mut initdb = Command::new(as_owner.first().map_or(bin.join("initdb"), PathBuf::from));
    if !as_owner.is_empty() {
        initdb.args(&as_owner[1..]).arg(bin.join("initdb"));
    }
    let out = initdb
        .args([
            "-A",
            "trust",
            "-U",
            "privmix",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(&data)
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
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
