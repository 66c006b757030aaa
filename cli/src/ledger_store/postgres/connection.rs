//! Connections: each checks that a commit the server acknowledges is on disk.

use std::time::Duration;

use postgres::{Client, Config, NoTls};

use super::error::postgres_error;
use super::url::{describe_config, parse_url};
use crate::ledger_store::StoreError;

/// A session stuck inside a transaction (a hung replica) is ended by the server after
/// this long, releasing the lock every charge takes.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

/// A connection to the ledger's server, made again when lost.
pub(super) struct Connection {
    config: Config,
    /// The URL without its password, for messages.
    pub(super) describe: String,
    client: Option<Client>,
}

impl Connection {
    /// Connects to the server `url` names.
    pub(super) fn open(url: &str) -> Result<Self, StoreError> {
        let config = parse_url(url)?;
        let describe = describe_config(&config);
        let client = connect(&config, &describe)?;
        Ok(Self {
            config,
            describe,
            client: Some(client),
        })
    }

    /// A second connection to the same server, made on first use.
    pub(super) fn another(&self) -> Self {
        Self {
            config: self.config.clone(),
            describe: self.describe.clone(),
            client: None,
        }
    }

    /// The connection, made again if it was lost (checking the server again).
    pub(super) fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.client = Some(connect(&self.config, &self.describe)?);
        }
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Backend(format!("ledger {}: no connection", self.describe)))
    }
}

/// Connects and checks that a commit the server acknowledges is on disk.
pub(super) fn connect(config: &Config, describe: &str) -> Result<Client, StoreError> {
    let mut config = config.clone();
    if config.get_application_name().is_none() {
        config.application_name("privmix");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(30));
    }
    let mut client = config
        .connect(NoTls)
        .map_err(|e| postgres_error(describe, "connecting", e))?;
    for setting in ["fsync", "synchronous_commit"] {
        let value: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .map_err(|e| postgres_error(describe, "reading the server's settings", e))?
            .get(0);
        // `synchronous_commit` = local, remote_write or remote_apply also wait for the
        // local flush; only `off` does not.
        if value == "off" {
            return Err(StoreError::UnsafeServer {
                store: describe.to_owned(),
                setting,
                value,
            });
        }
    }
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'"
        ))
        .map_err(|e| postgres_error(describe, "setting the session", e))?;
    Ok(client)
}
