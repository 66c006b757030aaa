//! PostgreSQL's server binaries and a private cluster's folder, for the code that
//! starts a throwaway cluster: the ledger store's tests (`test_cluster.rs`) and the
//! serving bench's replica rows (`xtask/src/serve_replicas.rs`, which includes this
//! file by path, so it uses the standard library only).
//!
//! As root, `initdb` refuses to run, so the cluster's folder is handed to the
//! `postgres` user and every server command runs as it (through `setpriv`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of PostgreSQL's server binaries: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian), else the folder of `initdb` on PATH.
pub fn bindir() -> Result<PathBuf, String> {
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
pub fn output(cmd: &str, args: &[&str]) -> Result<String, String> {
    stdout_of(
        Command::new(cmd).args(args),
        &format!("{cmd} {}", args.join(" ")),
    )
}

/// The standard output of `cmd` (called `what` in errors), trimmed; an error
/// naming `what` and giving its standard error when it cannot start or fails.
pub fn stdout_of(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A new, empty folder for a cluster, named after `tag`, this process and the clock,
/// owned by whoever will run the server; and the command prefix that runs a server
/// command as that owner (empty unless this process is root, then `setpriv` as
/// `postgres`).
pub fn cluster_folder(tag: &str) -> Result<(PathBuf, Vec<String>), String> {
    let root = output("id", &["-u"])? == "0";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if !root {
        return Ok((dir, Vec::new()));
    }
    let uid: u32 = output("id", &["-u", "postgres"])?
        .parse()
        .map_err(|_| "the postgres user's uid is not a number".to_string())?;
    let gid: u32 = output("id", &["-g", "postgres"])?
        .parse()
        .map_err(|_| "the postgres user's gid is not a number".to_string())?;
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
        .map_err(|e| format!("cannot hand {} to postgres: {e}", dir.display()))?;
    let prefix = [
        "setpriv",
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
    ];
    Ok((dir, prefix.iter().map(|s| s.to_string()).collect()))
}

/// `program` run as the cluster's owner: `prefix` from [`cluster_folder`] before it.
pub fn as_owner(prefix: &[String], program: &Path) -> Command {
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// `initdb` of a UTF-8 cluster in `data` whose only role is `privmix`, trusted on
/// its local socket.
pub fn initdb(bin: &Path, prefix: &[String], data: &Path) -> Result<(), String> {
    let mut cmd = as_owner(prefix, &bin.join("initdb"));
    cmd.args([
        "-A",
        "trust",
        "-U",
        "privmix",
        "-E",
        "UTF8",
        "--no-sync",
        "-D",
    ])
    .arg(data)
    .current_dir(data.parent().unwrap_or(Path::new("/")));
    stdout_of(&mut cmd, "initdb").map(drop)
}
