//! Connecting to NATS and making sure the streams and buckets exist (feature `nats`).
//! Shared by the agent and the coordinator so that both accept the same `[nats]`
//! config section and agree on the stream layout.

use crate::nats_layout;
use async_nats::jetstream;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

mod delivery;
mod legacy;
mod streams;
pub use delivery::{commands_after, Queued, SyncAnswer, SyncRequest, SYNC_BATCH, SYNC_MAX_BYTES};
pub use legacy::migrate_commands;
pub use streams::{
    atomic_publish_supported, bucket, cmd_stream, empty_subject_trusted, evt_stream, migrate,
    migrate_host, results_bucket, results_stream, Retention, Scope, CMD_MAX_AGE, CMD_MAX_BYTES,
    CMD_MAX_PER_HOST, EVT_MAX_BYTES, EVT_MAX_PER_HOST, MAX_MESSAGE_BYTES, MAX_VALUE_BYTES,
    RESULTS_MAX_BYTES, RESULT_MAX_BYTES,
};

/// The `[nats]` section of agent and coordinator configs (and `[hooks.nats]` of a
/// `nats` hook owner in the agent's).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s): `nats://127.0.0.1:4222`, `tls://…`; several (a cluster)
    /// comma-separated, or in the config as an array of strings (kept here joined
    /// with `,`). [`NatsConfig::servers`] parses them.
    #[serde(default = "default_url", deserialize_with = "one_or_many")]
    pub url: String,
    /// Replicas of every stream and bucket the layout creates, and what
    /// [`migrate`] brings existing ones to: 1 for one server, 3 for a cluster
    /// (1..=[`MAX_REPLICAS`]).
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// User and password (or `password_file`).
    pub user: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
    /// A file holding an nkey seed (`SU…`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (JWT + nkey seed).
    pub creds_file: Option<PathBuf>,
    /// PEM CA bundle to trust for the server's certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Refuse to talk to the server without TLS.
    #[serde(default)]
    pub require_tls: bool,
    /// The fleet runs on per-host accounts (`capstan-coordinator nats-config`): an
    /// agent reaches the JetStream API under [`nats_layout::HOST_API_PREFIX`], a coordinator
    /// each host's storage under [`nats_layout::store_api_prefix`] (`docs/nats.md`).
    #[serde(default)]
    pub host_accounts: bool,
    /// Coordinators on per-host accounts only: the nkey seed of their second user
    /// (`credentials/coordinator-hosts.nk`, account `CAPSTAN_HOSTS`), through which
    /// they reach each host's RPC, result notices and storage. Without it a
    /// coordinator does all of that through its one connection (configs generated
    /// before this account existed).
    pub hosts_nkey_seed_file: Option<PathBuf>,
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}

fn default_replicas() -> usize {
    1
}

/// The most replicas a JetStream stream can have.
pub const MAX_REPLICAS: usize = 5;

/// `url` as one string or an array of strings, the array joined with `,`.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Urls {
        One(String),
        Many(Vec<String>),
    }
    match Urls::deserialize(d)? {
        Urls::One(url) => Ok(url),
        Urls::Many(urls) => {
            if let Some(both) = urls.iter().find(|u| u.contains(',')) {
                return Err(serde::de::Error::custom(format!(
                    "`url`: {:?} holds a comma: one URL per array entry",
                    redact(both)
                )));
            }
            Ok(urls.join(","))
        }
    }
}

/// `url` without the user and password it may carry (`nats://u:p@host` → `nats://…@host`),
/// for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…{}", &url[..scheme], &url[at..])
        }
        (None, Some(at)) => format!("…{}", &url[at..]),
        _ => url.to_string(),
    }
}

/// [`redact`] for each URL of a comma-separated list.
fn redact_all(urls: &str) -> String {
    urls.split(',').map(redact).collect::<Vec<_>>().join(",")
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: default_url(),
            replicas: default_replicas(),
            user: None,
            password: None,
            password_file: None,
            nkey_seed_file: None,
            creds_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            require_tls: false,
            host_accounts: false,
            hosts_nkey_seed_file: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid [nats] config: {0}")]
    Config(String),
    #[error("cannot connect to NATS at {url}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("JetStream: cannot set up {what}")]
    Setup {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn read(path: &PathBuf) -> Result<String, NatsError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| NatsError::Read {
            path: path.clone(),
            source,
        })
}

/// The diagnostics directive that leaves async-nats' own line per connection event
/// out (`event: client error: nats: IO error`, at every reconnect attempt, naming no
/// server): [`NatsConfig::connect`] says each event itself, naming the servers. The
/// binaries add it to their filter unless `RUST_LOG` names `async_nats`.
pub const QUIET_CLIENT: &str = "async_nats=warn";

/// How often a client pings the server while it hears nothing from it. async-nats
/// drops a connection on the third ping that finds two still unanswered, so a
/// connection gone silent — a partition: no reset, no FIN, packets just lost — is
/// given up after about three times this, and the reconnect loop takes a new one as
/// soon as the network is back. At async-nats' default (60 s) the connection was never
/// given up during a partition shorter than 3 minutes, and traffic resumed only when
/// TCP's retransmission backoff next fired: 21–27 s after a 30 s partition healed, up
/// to 2 minutes after longer ones (`tests/tests/e2e/fleet/systemd.rs`).
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// The pause before connection attempt `attempts` (counted from 1, the first
/// attempt at start or after a disconnect): none before the first, then 100 ms more
/// each time up to a second. (A pause before the first made every start and every
/// reconnect 100 ms late.)
fn reconnect_delay(attempts: usize) -> Duration {
    let before = attempts.saturating_sub(1) as u64;
    Duration::from_millis((100 * before).min(1000))
}

impl NatsConfig {
    /// Connects. The client keeps reconnecting for ever (also when the server is down
    /// at start), so callers see outages as failed requests, never as a dead client;
    /// a silent connection is given up after about 3 × [`PING_INTERVAL`].
    pub async fn connect(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
    ) -> Result<async_nats::Client, NatsError> {
        self.connect_pinging(name, inbox_prefix, PING_INTERVAL)
            .await
    }

    /// [`NatsConfig::connect`], the client pinging the server every `ping` while it
    /// hears nothing from it (an agent on per-host accounts checks its connection at
    /// its beat's pace instead, and pings only as a backstop).
    pub async fn connect_pinging(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
        ping: Duration,
    ) -> Result<async_nats::Client, NatsError> {
        // A failed attempt is said once per outage, naming the servers (async-nats
        // says only "nats: IO error", at every attempt); the next after a connect.
        let url = redact_all(&self.url);
        let said = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .ping_interval(ping)
            .reconnect_delay_callback(reconnect_delay)
            .event_callback(move |event| {
                let (url, said) = (url.clone(), said.clone());
                async move {
                    use std::sync::atomic::Ordering;
                    match event {
                        async_nats::Event::Connected => {
                            said.store(false, Ordering::Relaxed);
                            tracing::info!(url, "connected to NATS");
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!(url, "disconnected from NATS")
                        }
                        async_nats::Event::ClientError(e)
                            if !said.swap(true, Ordering::Relaxed) =>
                        {
                            tracing::warn!(
                                url,
                                "cannot connect to NATS ({e}); retrying until it answers"
                            )
                        }
                        async_nats::Event::ClientError(e) => {
                            tracing::debug!(url, "cannot connect to NATS ({e}); retrying")
                        }
                        async_nats::Event::ServerError(e) => {
                            tracing::warn!(url, "the NATS server says: {e}")
                        }
                        other => tracing::info!(url, event = %other, "NATS event"),
                    }
                }
            });
        if let Some(prefix) = inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let servers = self.servers()?;
        self.authenticate(options)
            .await?
            .connect(servers)
            .await
            .map_err(|source| NatsError::Connect {
                url: self.url.clone(),
                source,
            })
    }

    /// The server addresses in `url`: split at `,`, each trimmed and parsed. An empty
    /// entry or one that is not a NATS URL is an error naming it (without its password).
    pub fn servers(&self) -> Result<Vec<async_nats::ServerAddr>, NatsError> {
        self.url
            .split(',')
            .map(str::trim)
            .enumerate()
            .map(|(i, url)| {
                if url.is_empty() {
                    return Err(NatsError::Config(format!(
                        "`url`: server {} of {:?} is empty",
                        i + 1,
                        redact_all(&self.url)
                    )));
                }
                url.parse::<async_nats::ServerAddr>().map_err(|e| {
                    NatsError::Config(format!(
                        "`url`: {:?} is not a NATS server URL: {e}",
                        redact(url)
                    ))
                })
            })
            .collect()
    }

    /// Checks what can be checked without a server, for a config load to report:
    /// every server in `url` parses; `replicas` is 1..=[`MAX_REPLICAS`]; at most one
    /// of `user`, `nkey_seed_file` and `creds_file`; a `user` has exactly one of
    /// `password` and `password_file`; `tls_cert_file` and `tls_key_file` go
    /// together; every file named can be read.
    pub fn validate(&self) -> Result<(), NatsError> {
        self.servers()?;
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(NatsError::Config(format!(
                "`replicas` is {}: it must be 1 to {MAX_REPLICAS} (1 for one server, 3 for a cluster)",
                self.replicas
            )));
        }
        let methods = [
            self.user.is_some(),
            self.nkey_seed_file.is_some(),
            self.creds_file.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err(NatsError::Config(
                "choose one of `user`, `nkey_seed_file` and `creds_file`".into(),
            ));
        }
        let passwords = [self.password.is_some(), self.password_file.is_some()];
        if self.user.is_some() != (passwords.iter().filter(|p| **p).count() == 1) {
            return Err(NatsError::Config(
                "`user` needs exactly one of `password` and `password_file`".into(),
            ));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(NatsError::Config(
                "`tls_cert_file` and `tls_key_file` go together".into(),
            ));
        }
        if self.hosts_nkey_seed_file.is_some() && !self.host_accounts {
            return Err(NatsError::Config(
                "`hosts_nkey_seed_file` is for coordinators on per-host accounts: set `host_accounts = true` too".into(),
            ));
        }
        let files = [
            &self.password_file,
            &self.nkey_seed_file,
            &self.hosts_nkey_seed_file,
            &self.creds_file,
            &self.tls_ca_file,
            &self.tls_cert_file,
            &self.tls_key_file,
        ];
        for f in files.into_iter().flatten() {
            read(f)?;
        }
        Ok(())
    }

    /// The config of a coordinator's second connection, the one that reaches the hosts
    /// (`hosts_nkey_seed_file` as its nkey), if it has one.
    pub fn reach(&self) -> Option<NatsConfig> {
        let seed = self.hosts_nkey_seed_file.clone()?;
        Some(NatsConfig {
            nkey_seed_file: Some(seed),
            hosts_nkey_seed_file: None,
            ..self.clone()
        })
    }

    /// `options` with this config's credentials and TLS settings, after
    /// [`NatsConfig::validate`]: what [`NatsConfig::connect`] uses, for a caller that
    /// needs other connection behaviour (hook owners: no retry on the first connect).
    pub async fn authenticate(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, NatsError> {
        self.validate()?;
        if let Some(user) = &self.user {
            let password = match (&self.password, &self.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => read(f)?,
                (None, None) => String::new(),
            };
            options = options.user_and_password(user.clone(), password);
        }
        if let Some(f) = &self.nkey_seed_file {
            options = options.nkey(read(f)?);
        }
        if let Some(f) = &self.creds_file {
            options = options
                .credentials_file(f)
                .await
                .map_err(|source| NatsError::Read {
                    path: f.clone(),
                    source,
                })?;
        }
        if let Some(ca) = &self.tls_ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options.require_tls(self.require_tls))
    }
}

/// The JetStream context an agent of `config` uses: on per-host accounts the API
/// under [`nats_layout::HOST_API_PREFIX`], else the account's own.
pub fn agent_context(client: async_nats::Client, config: &NatsConfig) -> jetstream::Context {
    if config.host_accounts {
        jetstream::with_prefix(client, nats_layout::HOST_API_PREFIX)
    } else {
        jetstream::new(client)
    }
}

#[cfg(test)]
mod tests;
