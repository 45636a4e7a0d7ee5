//! Connecting to NATS and making sure the streams and buckets exist (feature `nats`).
//! Shared by the agent and the coordinator so that both accept the same `[nats]`
//! config section and agree on the stream layout.

use crate::wire;
use async_nats::jetstream::{self, kv, stream};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The `[nats]` section of agent and coordinator configs (and `[hooks.nats]` of a
/// `nats` hook owner in the agent's).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated: `nats://127.0.0.1:4222`, `tls://…`.
    #[serde(default = "default_url")]
    pub url: String,
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
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: default_url(),
            user: None,
            password: None,
            password_file: None,
            nkey_seed_file: None,
            creds_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            require_tls: false,
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

impl NatsConfig {
    /// Connects. The client keeps reconnecting for ever (also when the server is down
    /// at start), so callers see outages as failed requests, never as a dead client.
    pub async fn connect(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
    ) -> Result<async_nats::Client, NatsError> {
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((100 * attempts as u64).min(1000))
            })
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("connected to NATS"),
                    async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS"),
                    other => tracing::debug!(event = %other, "NATS event"),
                }
            });
        if let Some(prefix) = inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        self.authenticate(options)
            .await?
            .connect(self.url.as_str())
            .await
            .map_err(|source| NatsError::Connect {
                url: self.url.clone(),
                source,
            })
    }

    /// Checks what can be checked without a server, for a config load to report:
    /// at most one of `user`, `nkey_seed_file` and `creds_file`; a `user` has exactly
    /// one of `password` and `password_file`; `tls_cert_file` and `tls_key_file` go
    /// together; every file named can be read.
    pub fn validate(&self) -> Result<(), NatsError> {
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
        let files = [
            &self.password_file,
            &self.nkey_seed_file,
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

/// Retention of the layout's streams and buckets.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long a host's registry entry outlives its last heartbeat.
    pub hosts_max_age: Duration,
    /// How long the coordinators remember which host a command id went to.
    pub commands_max_age: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            hosts_max_age: Duration::from_secs(60),
            commands_max_age: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

fn setup_error(what: &str) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> NatsError {
    let what = what.to_string();
    move |source| NatsError::Setup { what, source }
}

/// The largest message `CAPSTAN_CMD` and `CAPSTAN_EVT` take: a command (at most
/// [`crate::MAX_COMMAND_BYTES`]) and the record that carries it, with room to spare.
pub const MAX_MESSAGE_BYTES: i32 = 2 * crate::MAX_COMMAND_BYTES as i32;
/// The most bytes `CAPSTAN_EVT` keeps; beyond it the oldest records (of any host) go.
/// Kept below the account's JetStream file limit (`packaging/nats-server.conf`), so a
/// full event stream never leaves the commands without room.
pub const EVT_MAX_BYTES: i64 = 4 << 30;
/// The most records `CAPSTAN_EVT` keeps per host; beyond it that host's oldest go.
/// One host flooding its subject rolls over its own history first.
pub const EVT_MAX_PER_HOST: i64 = 1_000_000;
/// The most bytes `CAPSTAN_CMD` keeps (pending commands).
pub const CMD_MAX_BYTES: i64 = 1 << 30;
/// The largest value of a KV bucket entry (a heartbeat, a command binding).
pub const MAX_VALUE_BYTES: i32 = 64 * 1024;

/// The largest entry of the results bucket: a command's status with its events (at
/// most [`crate::status::MAX_EVENTS_BYTES`] of them), with room for the rest.
pub const RESULT_MAX_BYTES: i32 = 512 * 1024;
/// The most bytes the results bucket keeps; beyond it the oldest entries go (before
/// their max age, the coordinators' `commands_max_age`).
pub const RESULTS_MAX_BYTES: i64 = 1 << 30;

/// Sets the limits and denials of one stream of the layout on its config.
type Harden = fn(&mut stream::Config);

/// Gets the stream `config.name`, creating it with `config` and the fields `harden`
/// sets (limits; rollups, purges and deletes denied) when missing. An existing stream
/// is used as it is: [`migrate`] (the coordinator's) brings it up to date, since
/// agents may not update streams with the shipped permissions.
async fn ensure_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    harden: Harden,
) -> Result<stream::Stream, NatsError> {
    harden(&mut config);
    let name = config.name.clone();
    js.get_or_create_stream(config)
        .await
        .map_err(|e| setup_error(&name)(e.into()))
}

/// Brings the existing streams and buckets of the layout up to date: every field a
/// `harden_*` function sets (limits, denials) is set, everything else is kept (a
/// bucket keeps its max age). Only what differs is updated, so a second call does
/// nothing. Needs the permission to update streams (the coordinator's).
pub async fn migrate(js: &jetstream::Context) -> Result<(), NatsError> {
    let layout: [(String, Harden); 5] = [
        (wire::CMD_STREAM.into(), harden_cmd),
        (wire::EVT_STREAM.into(), harden_evt),
        (format!("KV_{}", wire::HOSTS_BUCKET), harden_bucket),
        (format!("KV_{}", wire::COMMANDS_BUCKET), harden_bucket),
        (format!("KV_{}", wire::RESULTS_BUCKET), harden_results),
    ];
    for (name, harden) in layout {
        let current = js
            .get_stream(&name)
            .await
            .map_err(|e| setup_error(&name)(e.into()))?
            .cached_info()
            .config
            .clone();
        let mut wanted = current.clone();
        harden(&mut wanted);
        if wanted != current {
            js.update_stream(&wanted)
                .await
                .map_err(|e| setup_error(&name)(e.into()))?;
            tracing::info!(stream = %name, "stream updated to the current limits");
        }
    }
    Ok(())
}

/// A full command stream refuses new commands (the coordinator answers 503) rather
/// than dropping pending ones.
fn harden_cmd(c: &mut stream::Config) {
    c.max_bytes = CMD_MAX_BYTES;
    c.discard = stream::DiscardPolicy::New;
    c.max_message_size = MAX_MESSAGE_BYTES;
    c.allow_rollup = false;
}

/// No rollup (`Nats-Rollup: all` on any subject would purge every other one), no
/// purge, no delete: only limits remove messages.
fn deny_removal(c: &mut stream::Config) {
    c.allow_rollup = false;
    c.deny_purge = true;
    c.deny_delete = true;
}

fn harden_evt(c: &mut stream::Config) {
    c.max_bytes = EVT_MAX_BYTES;
    c.max_messages_per_subject = EVT_MAX_PER_HOST;
    c.max_message_size = MAX_MESSAGE_BYTES;
    c.discard = stream::DiscardPolicy::Old;
    deny_removal(c);
}

fn harden_bucket(c: &mut stream::Config) {
    c.max_message_size = MAX_VALUE_BYTES;
    deny_removal(c);
}

fn harden_results(c: &mut stream::Config) {
    c.max_message_size = RESULT_MAX_BYTES;
    c.max_bytes = RESULTS_MAX_BYTES;
    deny_removal(c);
}

/// The command stream: work-queue retention, so a command stays until its host acks it.
pub async fn cmd_stream(js: &jetstream::Context) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: wire::CMD_STREAM.into(),
        subjects: vec!["capstan.v1.cmd.*".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    ensure_stream(js, config, harden_cmd).await
}

/// The event stream: every host's log records, kept (limits retention, bounded by
/// [`EVT_MAX_BYTES`] and [`EVT_MAX_PER_HOST`]). No duplicate window is relied on: the
/// outbox publishes with `Nats-Expected-Last-Subject-Sequence` and no `Nats-Msg-Id`.
pub async fn evt_stream(js: &jetstream::Context) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: wire::EVT_STREAM.into(),
        subjects: vec!["capstan.v1.evt.*".into()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        allow_direct: true,
        ..Default::default()
    };
    ensure_stream(js, config, harden_evt).await
}

/// A KV bucket, created through its backing stream. (async-nats' `create_key_value`
/// first reads account info in a shape nats-server 2.9 does not send; the stream
/// config below is what a KV bucket is, except that rollups and purges are denied.)
/// An existing bucket keeps its max age.
pub async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
) -> Result<kv::Store, NatsError> {
    let harden = if name == wire::RESULTS_BUCKET {
        harden_results
    } else {
        harden_bucket
    };
    let config = stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_age,
        allow_direct: true,
        discard: stream::DiscardPolicy::Old,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    ensure_stream(js, config, harden).await?;
    js.get_key_value(name)
        .await
        .map_err(|e| setup_error(name)(e.into()))
}
