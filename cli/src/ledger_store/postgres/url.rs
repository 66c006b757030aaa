//! A ledger's PostgreSQL URL: recognised, parsed, and described without its password.

use postgres::Config;

use crate::ledger_store::StoreError;

/// Whether `spec` names a PostgreSQL ledger.
pub fn is_postgres_url(spec: &str) -> bool {
    let lower = spec.get(..13).unwrap_or(spec).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// Parses a `postgres://…` URL. The error never repeats the URL (it may hold a
/// password).
pub fn parse_url(url: &str) -> Result<Config, StoreError> {
    url.parse::<Config>().map_err(|e| StoreError::BadSpec {
        reason: format!("not a valid PostgreSQL URL ({e})"),
    })
}

/// The URL of `config` without its password: `postgresql://user@host:port/db`, with a
/// Unix socket directory as `?host=` and the session options when set.
pub fn describe_config(config: &Config) -> String {
    use postgres::config::Host;
    let ports = config.get_ports();
    let port_of = |i: usize| ports.get(i).or_else(|| ports.first()).copied();
    let mut tcp = Vec::new();
    let mut sockets = Vec::new();
    for (i, host) in config.get_hosts().iter().enumerate() {
        match host {
            Host::Tcp(name) => {
                let name = if name.contains(':') {
                    format!("[{name}]")
                } else {
                    name.clone()
                };
                tcp.push(match port_of(i) {
                    Some(p) => format!("{name}:{p}"),
                    None => name,
                });
            }
            Host::Unix(dir) => sockets.push(match port_of(i) {
                Some(p) => format!("{} (port {p})", dir.display()),
                None => dir.display().to_string(),
            }),
        }
    }
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or("");
    let mut out = format!("postgresql://{user}{}/{db}", tcp.join(","));
    let mut params = Vec::new();
    for socket in sockets {
        params.push(format!("host={socket}"));
    }
    if let Some(options) = config.get_options() {
        params.push(format!("options={options}"));
    }
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}
