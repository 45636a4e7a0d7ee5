//! The streams and buckets of the layout: their limits ([`Retention`], the `*_MAX_*`
//! constants, [`Scope`]), made when missing and brought up to date ([`migrate`]).

use super::{default_replicas, NatsError};
use crate::nats_layout;
use async_nats::jetstream::{self, kv, stream};
use std::time::Duration;

/// Retention and replication of the layout's streams and buckets.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long the coordinators remember which host a command id went to.
    pub commands_max_age: Duration,
    /// Replicas of every stream and bucket (`[nats] replicas`).
    pub replicas: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            commands_max_age: Duration::from_secs(7 * 24 * 3600),
            replicas: default_replicas(),
        }
    }
}

fn setup_error(what: &str) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> NatsError {
    let what = what.to_string();
    move |source| NatsError::Setup { what, source }
}

/// The largest message `CAPSTAN_COMMANDS` and `CAPSTAN_EVT` take: a command (at most
/// [`crate::MAX_COMMAND_BYTES`]) and the record that carries it, with room to spare.
pub const MAX_MESSAGE_BYTES: i32 = 2 * crate::MAX_COMMAND_BYTES as i32;
/// The most bytes `CAPSTAN_EVT` keeps; beyond it the oldest records (of any host) go.
/// Kept below the account's JetStream file limit (`packaging/nats-server.conf`), so a
/// full event stream never leaves the commands without room.
pub const EVT_MAX_BYTES: i64 = 4 << 30;
/// The most records `CAPSTAN_EVT` keeps per host; beyond it that host's oldest go.
/// One host flooding its subject rolls over its own history first.
pub const EVT_MAX_PER_HOST: i64 = 1_000_000;
/// The most bytes [`nats_layout::CMD_STREAM`] keeps; beyond it the oldest commands
/// (of any host) go: by then long carried out, or too old for their host to take
/// (its agent refuses a command older than `[signing] max_age_secs`, 1 h by default).
pub const CMD_MAX_BYTES: i64 = 1 << 30;
/// The most commands the stream keeps for one host; beyond it that host's oldest go.
pub const CMD_MAX_PER_HOST: i64 = 10_000;
/// How long a command stays in the stream: its host takes it when it comes back
/// within that time (the coordinators' `commands_max_age`; the agent would refuse
/// it `expired` before that unless its `max_age_secs` says otherwise).
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
/// `js` being the coordinator's view of that host's storage account, from the info
/// `evt` and `results` were opened with ([`evt_stream`], [`results_stream`]): no
/// request when they are current.
pub async fn migrate_host(
    js: &jetstream::Context,
    replicas: usize,
    evt: &stream::Stream,
    results: &stream::Stream,
) -> Result<(), NatsError> {
    let layout: [(&stream::Stream, Harden); 2] =
        [(evt, harden_host_evt), (results, harden_host_results)];
    for (stream, harden) in layout {
        bring_up_to_date(js, replicas, stream.cached_info().config.clone(), harden).await?;
    }
    Ok(())
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
        bring_up_to_date(js, replicas, current, harden).await?;
    }
    Ok(())
}

/// Updates the stream whose config is `current` when `harden` or `replicas` would
/// change it.
async fn bring_up_to_date(
    js: &jetstream::Context,
    replicas: usize,
    current: stream::Config,
    harden: Harden,
) -> Result<(), NatsError> {
    let name = current.name.clone();
    let mut wanted = current.clone();
    harden(&mut wanted);
    wanted.num_replicas = replicas;
    if !atomic_publish_supported(js) {
        // An older server does not know the field: asking again each time would
        // update the stream on every call.
        wanted.allow_atomic_publish = current.allow_atomic_publish;
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
    Ok(())
}

/// Commands are kept by limits (nothing acks them away: each host's position is in
/// its own log); past a limit the oldest go. Only the coordinators publish here.
fn harden_cmd(c: &mut stream::Config) {
    c.max_bytes = CMD_MAX_BYTES;
    c.discard = stream::DiscardPolicy::Old;
    c.max_messages_per_subject = CMD_MAX_PER_HOST;
    c.discard_new_per_subject = false;
    c.max_age = CMD_MAX_AGE;
    c.max_message_size = MAX_MESSAGE_BYTES;
    deny_removal(c);
}

/// No rollup (`Nats-Rollup: all` on any subject would purge every other one), no
/// purge, no delete: only limits remove messages.
fn deny_removal(c: &mut stream::Config) {
    c.allow_rollup = false;
    c.deny_purge = true;
    c.deny_delete = true;
}

/// Whether the server takes atomic batch publishes (nats-server 2.12 and later).
pub fn atomic_publish_supported(js: &jetstream::Context) -> bool {
    version_at_least(&js.client().server_info().version, (2, 12))
}

/// Whether the server's answer "no message on this subject" can be believed after it
/// refused a publish there. nats-server 2.9 (measured on 2.9.10) loses a subject's
/// last message, for lookups and for `Nats-Expected-Last-Subject-Sequence`, once it
/// refuses a publish on it for the account's quota; 2.15.2 does not (measured);
/// the versions between were not measured and are taken as fixed.
pub fn empty_subject_trusted(js: &jetstream::Context) -> bool {
    version_at_least(&js.client().server_info().version, (2, 10))
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

/// The command stream: limits retention, read by position (`delivery`).
pub async fn cmd_stream(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: nats_layout::CMD_STREAM.into(),
        subjects: vec!["capstan.v1.cmd.*".into()],
        retention: stream::RetentionPolicy::Limits,
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
    let harden = results_harden(scope);
    bucket_with(js, nats_layout::RESULTS_BUCKET, max_age, replicas, harden).await
}

/// The limits of the results bucket of `scope`.
fn results_harden(scope: Scope) -> Harden {
    match scope {
        Scope::Shared => harden_results,
        Scope::Host => harden_host_results,
    }
}

/// [`results_bucket`]'s stream (made when missing), with its info: one request when
/// it is there.
pub async fn results_stream(
    js: &jetstream::Context,
    max_age: Duration,
    replicas: usize,
    scope: Scope,
) -> Result<stream::Stream, NatsError> {
    let harden = results_harden(scope);
    bucket_stream(js, nats_layout::RESULTS_BUCKET, max_age, replicas, harden).await
}

async fn bucket_with(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    replicas: usize,
    harden: Harden,
) -> Result<kv::Store, NatsError> {
    bucket_stream(js, name, max_age, replicas, harden).await?;
    let mut store = js
        .get_key_value(name)
        .await
        .map_err(|e| setup_error(name)(e.into()))?;
    // Puts go to `$KV.<bucket>.<key>` whatever the API prefix: on per-host accounts
    // the API is imported under a prefix, the bucket's subjects as they are.
    store.use_jetstream_prefix = false;
    Ok(store)
}

/// The stream of bucket `name`, made when missing.
async fn bucket_stream(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    replicas: usize,
    harden: Harden,
) -> Result<stream::Stream, NatsError> {
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
    ensure_stream(js, config, harden, replicas).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
