//! Connecting to NATS and making sure the streams and buckets exist (feature `nats`).
//! Shared by the agent and the coordinator so that both accept the same `[nats]`
//! config section and agree on the stream layout.

use crate::nats_layout;
use async_nats::jetstream::{self, kv, stream};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

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

/// How often a client pings the server while it hears nothing from it. async-nats
/// drops a connection on the third ping that finds two still unanswered, so a
/// connection gone silent — a partition: no reset, no FIN, packets just lost — is
/// given up after about three times this, and the reconnect loop takes a new one as
/// soon as the network is back. At async-nats' default (60 s) the connection was never
/// given up during a partition shorter than 3 minutes, and traffic resumed only when
/// TCP's retransmission backoff next fired: 21–27 s after a 30 s partition healed, up
/// to 2 minutes after longer ones (`tests/tests/e2e/fleet/systemd.rs`).
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

impl NatsConfig {
    /// Connects. The client keeps reconnecting for ever (also when the server is down
    /// at start), so callers see outages as failed requests, never as a dead client;
    /// a silent connection is given up after about 3 × [`PING_INTERVAL`].
    pub async fn connect(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
    ) -> Result<async_nats::Client, NatsError> {
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .ping_interval(PING_INTERVAL)
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

/// Retention and replication of the layout's streams and buckets.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long a host's registry entry outlives its last heartbeat.
    pub hosts_max_age: Duration,
    /// How long the coordinators remember which host a command id went to.
    pub commands_max_age: Duration,
    /// Replicas of every stream and bucket (`[nats] replicas`).
    pub replicas: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            hosts_max_age: Duration::from_secs(60),
            commands_max_age: Duration::from_secs(7 * 24 * 3600),
            replicas: default_replicas(),
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
/// The most commands `CAPSTAN_CMD` keeps pending for one host; more for that host
/// are refused (discard new, per subject), other hosts' still go in.
pub const CMD_MAX_PER_HOST: i64 = 10_000;
/// The most consumers `CAPSTAN_CMD` takes: one a host (its agent's durable consumer),
/// so the most hosts one fleet has. Set on the stream because nats-server 2.12 and
/// later cap a stream that sets none at 1,000 consumers (`default_max_consumers`),
/// which stopped the 1,001st host of a fleet from taking commands
/// (`maximum consumers limit reached`, found by `capstan-bench --only fleet`).
pub const CMD_MAX_CONSUMERS: i32 = 100_000;
/// How long a command waits in `CAPSTAN_CMD` for its host at most: the coordinators'
/// `commands_max_age` (its binding and result are gone by then; the agent would
/// refuse it `expired` anyway, signatures are good for `max_age_secs`).
pub const CMD_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
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

/// Where a host's event stream and results bucket live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One stream and one bucket for every host, bounded as a whole
    /// ([`EVT_MAX_BYTES`], [`RESULTS_MAX_BYTES`]): one account for the whole fleet.
    Shared,
    /// The host's own, in its storage account (`[nats] host_accounts`), bounded by
    /// that account's JetStream quota instead: a stream's `max_bytes` is reserved
    /// from the server's store when the stream is made, which thousands of hosts'
    /// streams would exhaust; an account's quota is not.
    Host,
}

/// Gets the stream `config.name`, creating it with `config`, `replicas` and the
/// fields `harden` sets (limits; rollups, purges and deletes denied) when missing. An
/// existing stream is used as it is: [`migrate`] (the coordinator's) brings it up to
/// date, since agents may not update streams with the shipped permissions.
async fn ensure_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    harden: Harden,
    replicas: usize,
) -> Result<stream::Stream, NatsError> {
    harden(&mut config);
    config.num_replicas = replicas;
    config.allow_atomic_publish &= atomic_publish_supported(js);
    let name = config.name.clone();
    js.get_or_create_stream(config)
        .await
        .map_err(|e| setup_error(&name)(e.into()))
}

/// Brings the existing streams and buckets of the layout up to date: every field a
/// `harden_*` function sets (limits, denials) is set, and `replicas` (the server
/// scales the stream up or down; 2.9.10 and 2.15.2 both do, `nats::cluster` tests
/// it), everything else is kept (a bucket keeps its max age). Only what differs is
/// updated, so a second call does nothing. With [`Scope::Host`] the event stream and
/// the results bucket are not the fleet's (each host's is migrated by
/// [`migrate_host`]). Needs the permission to update streams (the coordinator's).
pub async fn migrate(
    js: &jetstream::Context,
    replicas: usize,
    scope: Scope,
) -> Result<(), NatsError> {
    let mut layout: Vec<(String, Harden)> = vec![
        (nats_layout::CMD_STREAM.into(), harden_cmd),
        (format!("KV_{}", nats_layout::HOSTS_BUCKET), harden_bucket),
        (
            format!("KV_{}", nats_layout::COMMANDS_BUCKET),
            harden_bucket,
        ),
        (
            format!("KV_{}", nats_layout::HOST_KEYS_BUCKET),
            harden_bucket,
        ),
    ];
    if scope == Scope::Shared {
        layout.push((nats_layout::EVT_STREAM.into(), harden_evt));
        layout.push((
            format!("KV_{}", nats_layout::RESULTS_BUCKET),
            harden_results,
        ));
    }
    migrate_streams(js, replicas, layout).await
}

/// [`migrate`] for one host's own event stream and results bucket ([`Scope::Host`]),
/// `js` being the coordinator's view of that host's storage account.
pub async fn migrate_host(js: &jetstream::Context, replicas: usize) -> Result<(), NatsError> {
    let layout: Vec<(String, Harden)> = vec![
        (nats_layout::EVT_STREAM.into(), harden_host_evt),
        (
            format!("KV_{}", nats_layout::RESULTS_BUCKET),
            harden_host_results,
        ),
    ];
    migrate_streams(js, replicas, layout).await
}

async fn migrate_streams(
    js: &jetstream::Context,
    replicas: usize,
    layout: Vec<(String, Harden)>,
) -> Result<(), NatsError> {
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
        wanted.num_replicas = replicas;
        if !atomic_publish_supported(js) {
            // An older server does not know the field: asking again each time would
            // update the stream on every call.
            wanted.allow_atomic_publish = current.allow_atomic_publish;
        }
        if !max_consumers_changeable(js) {
            // Before 2.12 a stream's consumer limit is fixed at its creation (and
            // those servers set no default limit of their own).
            wanted.max_consumers = current.max_consumers;
        }
        if wanted != current {
            js.update_stream(&wanted)
                .await
                .map_err(|e| setup_error(&name)(e.into()))?;
            tracing::info!(
                stream = %name,
                replicas,
                was = current.num_replicas,
                "stream updated to the current limits and replicas"
            );
        }
    }
    Ok(())
}

/// A full command stream refuses new commands (the coordinator answers 503) rather
/// than dropping pending ones.
fn harden_cmd(c: &mut stream::Config) {
    c.max_bytes = CMD_MAX_BYTES;
    c.discard = stream::DiscardPolicy::New;
    c.max_messages_per_subject = CMD_MAX_PER_HOST;
    c.discard_new_per_subject = true;
    c.max_age = CMD_MAX_AGE;
    c.max_message_size = MAX_MESSAGE_BYTES;
    c.allow_rollup = false;
    c.max_consumers = CMD_MAX_CONSUMERS;
}

/// No rollup (`Nats-Rollup: all` on any subject would purge every other one), no
/// purge, no delete: only limits remove messages.
fn deny_removal(c: &mut stream::Config) {
    c.allow_rollup = false;
    c.deny_purge = true;
    c.deny_delete = true;
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

/// Whether the server takes atomic batch publishes (nats-server 2.12 and later).
pub fn atomic_publish_supported(js: &jetstream::Context) -> bool {
    version_at_least(&js.client().server_info().version, (2, 12))
}

/// Whether the server lets an existing stream's `max_consumers` change (nats-server
/// 2.12 and later; before, "stream configuration update can not change
/// MaxConsumers").
fn max_consumers_changeable(js: &jetstream::Context) -> bool {
    version_at_least(&js.client().server_info().version, (2, 12))
}

/// `version` (`2.15.2`, `2.12.0-beta.1`) is `major.minor` or later.
fn version_at_least(version: &str, wanted: (u64, u64)) -> bool {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= wanted
}

/// The event stream also takes atomic batches (where the server can): the outbox
/// publishes a burst of records in one round trip, stored all or none.
fn harden_evt(c: &mut stream::Config) {
    c.allow_atomic_publish = true;
    c.max_bytes = EVT_MAX_BYTES;
    c.max_messages_per_subject = EVT_MAX_PER_HOST;
    c.max_message_size = MAX_MESSAGE_BYTES;
    c.discard = stream::DiscardPolicy::Old;
    deny_removal(c);
}

/// [`harden_evt`] for a host's own stream ([`Scope::Host`]).
fn harden_host_evt(c: &mut stream::Config) {
    harden_evt(c);
    c.max_bytes = -1;
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

/// [`harden_results`] for a host's own bucket ([`Scope::Host`]).
fn harden_host_results(c: &mut stream::Config) {
    harden_results(c);
    c.max_bytes = -1;
}

/// The command stream: work-queue retention, so a command stays until its host acks it.
pub async fn cmd_stream(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: nats_layout::CMD_STREAM.into(),
        subjects: vec!["capstan.v1.cmd.*".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    ensure_stream(js, config, harden_cmd, replicas).await
}

/// The event stream: every host's log records, kept (limits retention, bounded by
/// [`EVT_MAX_BYTES`] and [`EVT_MAX_PER_HOST`], or with [`Scope::Host`] by the host's
/// storage quota). No duplicate window is relied on: the outbox publishes with
/// `Nats-Expected-Last-Subject-Sequence` and no `Nats-Msg-Id`.
pub async fn evt_stream(
    js: &jetstream::Context,
    replicas: usize,
    scope: Scope,
) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: nats_layout::EVT_STREAM.into(),
        subjects: vec!["capstan.v1.evt.*".into()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        allow_direct: true,
        ..Default::default()
    };
    let harden = match scope {
        Scope::Shared => harden_evt,
        Scope::Host => harden_host_evt,
    };
    ensure_stream(js, config, harden, replicas).await
}

/// A KV bucket, created through its backing stream: the stream config below is what
/// a KV bucket is, except that rollups and purges are denied. (async-nats'
/// `create_key_value` first reads account info in a shape nats-server 2.9 does not
/// send: against 2.9.10 it fails with "data did not match any variant of untagged
/// enum Response", against 2.15.2 it works; tried. So this stays while 2.9 is
/// supported, and would stay anyway: `create_key_value` makes buckets that allow
/// rollups and purges, and takes no `deny_purge`, so the bucket would exist
/// unhardened until [`migrate`] ran.) An existing bucket keeps its max age.
pub async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, NatsError> {
    let harden = if name == nats_layout::RESULTS_BUCKET {
        harden_results
    } else {
        harden_bucket
    };
    bucket_with(js, name, max_age, replicas, harden).await
}

/// The results bucket; with [`Scope::Host`] a host's own, bounded by its storage
/// quota rather than [`RESULTS_MAX_BYTES`].
pub async fn results_bucket(
    js: &jetstream::Context,
    max_age: Duration,
    replicas: usize,
    scope: Scope,
) -> Result<kv::Store, NatsError> {
    let harden = match scope {
        Scope::Shared => harden_results,
        Scope::Host => harden_host_results,
    };
    bucket_with(js, nats_layout::RESULTS_BUCKET, max_age, replicas, harden).await
}

async fn bucket_with(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    replicas: usize,
    harden: Harden,
) -> Result<kv::Store, NatsError> {
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
    ensure_stream(js, config, harden, replicas).await?;
    let mut store = js
        .get_key_value(name)
        .await
        .map_err(|e| setup_error(name)(e.into()))?;
    // Puts go to `$KV.<bucket>.<key>` whatever the API prefix: on per-host accounts
    // the API is imported under a prefix, the bucket's subjects as they are.
    store.use_jetstream_prefix = false;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<NatsConfig, String> {
        toml::from_str(toml_text).map_err(|e| e.to_string())
    }

    fn hosts(config: &NatsConfig) -> Vec<String> {
        config
            .servers()
            .expect("servers")
            .into_iter()
            .map(|s| {
                let url = s.into_inner();
                format!(
                    "{}://{}:{}",
                    url.scheme(),
                    url.host_str().unwrap(),
                    url.port().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn one_url_is_one_server() {
        let config = parse(r#"url = "nats://10.0.0.5:4222""#).unwrap();
        assert_eq!(config.url, "nats://10.0.0.5:4222");
        assert_eq!(hosts(&config), ["nats://10.0.0.5:4222"]);
        config.validate().unwrap();
    }

    #[test]
    fn without_url_the_local_default_is_used() {
        let config = parse("").unwrap();
        assert_eq!(hosts(&config), ["nats://127.0.0.1:4222"]);
        assert_eq!(config.replicas, 1);
    }

    #[test]
    fn a_comma_separated_url_is_a_list_of_servers() {
        let config = parse(r#"url = "nats://a:4301,nats://b:4302, tls://c:4303""#).unwrap();
        assert_eq!(
            hosts(&config),
            ["nats://a:4301", "nats://b:4302", "tls://c:4303"]
        );
        config.validate().unwrap();
    }

    #[test]
    fn an_array_of_urls_is_a_list_of_servers() {
        let config = parse(r#"url = ["nats://a:4301", "nats://b:4302"]"#).unwrap();
        assert_eq!(config.url, "nats://a:4301,nats://b:4302");
        assert_eq!(hosts(&config), ["nats://a:4301", "nats://b:4302"]);
    }

    #[test]
    fn an_array_entry_with_a_comma_is_refused() {
        let e = parse(r#"url = ["nats://a:4301,nats://b:4302"]"#).unwrap_err();
        assert!(e.contains("one URL per array entry"), "{e}");
    }

    #[test]
    fn a_url_that_is_neither_string_nor_array_is_refused() {
        assert!(parse("url = 4222").is_err());
        assert!(parse("url = [4222]").is_err());
    }

    #[test]
    fn the_bad_server_is_named() {
        let config = parse(r#"url = "nats://a:4301,nats://b:port""#).unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(
            e.contains(r#""nats://b:port" is not a NATS server URL"#),
            "{e}"
        );
        assert!(!e.contains("a:4301"), "{e}");

        let config = parse(r#"url = ["nats://a:4301", "http://b:4302"]"#).unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(
            e.contains(r#""http://b:4302""#) && e.contains("scheme"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_entry_is_refused() {
        for url in [r#""nats://a:4301,,nats://b:4302""#, r#""""#, r#"[]"#] {
            let config = parse(&format!("url = {url}")).unwrap();
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains("is empty"), "{url}: {e}");
        }
    }

    #[test]
    fn a_password_in_a_bad_url_is_not_shown() {
        let config = parse(r#"url = "nats://u:secret@a:99999""#).unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(
            e.contains("nats://…@a:99999") && !e.contains("secret"),
            "{e}"
        );
    }

    #[test]
    fn atomic_batches_need_nats_server_2_12() {
        for (version, yes) in [
            ("2.9.10", false),
            ("2.11.9", false),
            ("2.12.0", true),
            ("2.12.0-beta.1", true),
            ("2.15.2", true),
            ("3.0.0", true),
            ("", false),
        ] {
            assert_eq!(version_at_least(version, (2, 12)), yes, "{version}");
        }
    }

    #[test]
    fn replicas_are_one_to_five() {
        for n in 1..=5 {
            let config = parse(&format!("replicas = {n}")).unwrap();
            assert_eq!(config.replicas, n);
            config.validate().unwrap();
        }
        for n in [0, 6] {
            let config = parse(&format!("replicas = {n}")).unwrap();
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("`replicas` is {n}")), "{e}");
        }
        assert!(parse("replicas = -1").is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = parse("urls = []").unwrap_err();
        assert!(e.contains("urls"), "{e}");
    }
}
