//! The replica rows of the serving step: `privmix serve` charging one PostgreSQL
//! ledger through budget leases (`--lease-charges`), as one replica with the machine's
//! threads and as two replicas sharing them, under the same clients (spread over the
//! replicas by the load script). What it shows is whether the shared ledger caps a
//! fleet: with leases, two replicas on one database should together serve about what
//! one does on the same cores, not less.
//!
//! The database is a throwaway cluster started here from PostgreSQL's own binaries
//! (`initdb`, `pg_ctl`; Debian's `postgresql` package), listening on a Unix socket in
//! its folder only, with `fsync` and `synchronous_commit` on as the store requires,
//! and stopped and deleted when the rows are measured.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::serve_server::{Server, load, serve_args};

#[path = "../../cli/src/ledger_store/pg_binaries.rs"]
mod pg_binaries;

/// Client levels of the replica rows (one client cannot use two replicas).
const CLIENTS: &str = "8,32";
/// Charges a replica reserves at a time.
const LEASE_CHARGES: &str = "4096";

/// A PostgreSQL cluster in a temporary folder, stopped and deleted when dropped.
struct PgCluster {
    bin: PathBuf,
    owner: Vec<String>,
    dir: PathBuf,
    url: String,
}

impl PgCluster {
    fn start() -> Result<Self, String> {
        let bin = pg_binaries::bindir()?;
        let (dir, owner) = pg_binaries::cluster_folder("privmix-bench-pg")?;
        let cluster = Self {
            url: format!(
                "postgresql://privmix@/postgres?host={}&port=5432",
                dir.display()
            ),
            bin,
            owner,
            dir,
        };
        pg_binaries::initdb(&cluster.bin, &cluster.owner, &cluster.data())?;
        let options = format!(
            "-k {} -p 5432 -c listen_addresses= -c fsync=on -c synchronous_commit=on",
            cluster.dir.display()
        );
        let log = cluster.dir.join("server.log");
        pg_binaries::stdout_of(
            cluster
                .pg_ctl()
                .args(["start", "-w", "-t", "60", "-o", &options, "-l"])
                .arg(&log),
            "pg_ctl start",
        )
        .map_err(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            format!("PostgreSQL did not start: {e}; its log: {}", log.trim())
        })?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `pg_ctl -D <data>` as the cluster's owner, its subcommand to follow.
    fn pg_ctl(&self) -> Command {
        let mut cmd = pg_binaries::as_owner(&self.owner, &self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(self.data());
        cmd
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl().args(["stop", "-m", "fast", "-w"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The rows: one replica with 2 rayon threads, then two with 1 each, on one fresh
/// database each time; their throughput side by side. An error says why none could
/// be measured.
pub(crate) fn section(
    privmix: &Path,
    gguf: &Path,
    members: &Path,
    python: &str,
    script: &Path,
    seconds: &str,
) -> Result<String, String> {
    let mut rows = Vec::new();
    for (replicas, threads) in [(1, "2"), (2, "1")] {
        let db = PgCluster::start()?;
        let mut servers = Vec::new();
        // One after another: the first creates the ledger, the next finds it.
        for _ in 0..replicas {
            let mut cmd = Command::new(privmix);
            cmd.args(serve_args(gguf, &db.url, members))
                .args(["--lease-charges", LEASE_CHARGES])
                .env("RAYON_NUM_THREADS", threads);
            servers.push(Server::start(&mut cmd, "http://")?);
        }
        let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
        let label = format!("{replicas} × {threads} thread(s)");
        let measured = load(
            python,
            script,
            &urls.join(","),
            "smollm2",
            &label,
            CLIENTS,
            seconds,
        )?;
        for s in &mut servers {
            if let Some(exit) = s.exited() {
                return Err(format!("a replica exited during the load ({exit})"));
            }
        }
        drop(servers);
        pg_binaries::stdout_of(
            Command::new(privmix).args(["ledger", "verify", &db.url]),
            &format!("privmix ledger verify after {replicas} replica(s)"),
        )?;
        rows.push((replicas, threads, measured));
    }
    Ok(table(&rows))
}

/// The Markdown of the replica rows, and two replicas' tokens/s over one's at each
/// client level.
fn table(rows: &[(usize, &str, Vec<Value>)]) -> String {
    let mut s = String::from(
        "Replicas on one PostgreSQL ledger (`--lease-charges 4096`): the same clients on one \
         replica with 2 threads, then spread over two replicas with 1 thread each; the ledger \
         verified (`privmix ledger verify`) after each.\n\n\
         | replicas × threads | clients | tokens/s | p50 ms/token | p50 ms to first token | requests |\n\
         |---|---|---|---|---|---|\n",
    );
    for (_, _, measured) in rows {
        for r in measured {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                r["label"].as_str().unwrap_or("?"),
                r["clients"],
                r["tokens_per_s"],
                r["p50_ms_per_token"],
                r["p50_ms_first_token"],
                r["requests"]
            );
        }
    }
    let rate = |replicas: usize, clients: &Value| {
        rows.iter()
            .filter(|(n, _, _)| *n == replicas)
            .flat_map(|(_, _, m)| m)
            .find(|r| &r["clients"] == clients)
            .and_then(|r| r["tokens_per_s"].as_f64())
    };
    let mut ratios = Vec::new();
    for r in rows
        .iter()
        .filter(|(n, _, _)| *n == 1)
        .flat_map(|(_, _, m)| m)
    {
        if let (Some(one), Some(two)) = (rate(1, &r["clients"]), rate(2, &r["clients"]))
            && one > 0.0
        {
            ratios.push(format!("{:.2}× at {} clients", two / one, r["clients"]));
        }
    }
    if !ratios.is_empty() {
        let _ = writeln!(s, "\nTwo replicas over one: {}.", ratios.join(", "));
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_divides_two_replicas_by_one_at_each_client_level() {
        let level = |label: &str, clients: u64, tps: f64| {
            json!({"label": label, "clients": clients, "tokens_per_s": tps,
                   "p50_ms_per_token": 1.0, "p50_ms_first_token": 2.0, "requests": {"200": 3}})
        };
        let rows = vec![
            (
                1,
                "2",
                vec![level("one", 8, 100.0), level("one", 32, 120.0)],
            ),
            (2, "1", vec![level("two", 8, 90.0), level("two", 32, 150.0)]),
        ];
        let t = table(&rows);
        assert!(t.contains("0.90× at 8 clients"), "{t}");
        assert!(t.contains("1.25× at 32 clients"), "{t}");
        assert_eq!(
            t.matches("\n| one |").count() + t.matches("\n| two |").count(),
            4
        );
    }

    #[test]
    fn a_cluster_starts_and_is_deleted_when_dropped() {
        // CI installs Debian's postgresql; without it the bench says so in its section.
        let db = PgCluster::start().expect("a PostgreSQL cluster (apt-get install postgresql)");
        let dir = db.dir.clone();
        assert!(dir.join("data").join("PG_VERSION").is_file());
        let status = db.pg_ctl().arg("status").output().unwrap();
        assert!(status.status.success(), "{status:?}");
        drop(db);
        assert!(!dir.exists());
    }
}
