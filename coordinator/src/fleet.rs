//! The coordinator's view of the fleet, read from NATS on every request: commands go
//! out on `CAPSTAN_COMMANDS`; what happened to each comes back as its entry in the
//! `capstan_results` bucket (written by its host's agent, read in one get) and as the
//! host's records in `CAPSTAN_EVT` (both shared, or each host's own on per-host
//! accounts: [`storage`]); hosts from their beats, heard and kept in memory
//! ([`liveness`]). Everything a host
//! wrote is taken only with its signature checked against the host's registered
//! keys ([`keys`]). The only other state is `capstan_commands` (id → host and a hash
//! of the content the id is bound to) and `capstan_host_keys`, also in NATS, so any
//! number of coordinators can serve the same fleet.

use async_nats::jetstream::{self, kv, stream};
use async_nats::HeaderMap;
use capstan_common::nats::{self as cnats, NatsError, Retention, Scope};
use capstan_common::nats_layout;
use capstan_common::published::{Publication, Unverified};
use capstan_common::signing::Signer;
pub use capstan_common::status::CommandStatus;
use capstan_common::{validate, Rejection};
use serde_json::Value;
use std::time::Duration;
use tokio::sync::OnceCell;

mod beats;
mod commands;
mod delivery;
mod hosts;
pub mod keys;
pub mod liveness;
mod position;
mod read;
mod storage;
pub use commands::{cancel_id, MAX_TRUNCATED_READ_BYTES};
pub use hosts::UnknownHost;
use read::read_subject;

/// What can go wrong serving a request; each maps to one HTTP status and code.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{0}")]
    BadCommand(Rejection),
    #[error("{0}")]
    BadRequest(String),
    #[error("no command with id {0:?} was submitted (or it has aged out)")]
    CommandNotFound(String),
    #[error("id {id:?} was already submitted with other content (for host {host}); send new content under a new id")]
    IdConflict { id: String, host: String },
    #[error("NATS is not reachable from this coordinator")]
    NatsUnavailable,
    #[error("host {0} did not answer")]
    HostUnreachable(String),
    #[error("host {0} did not answer in time")]
    HostTimeout(String),
    #[error("host {0} has no account on the NATS server (capstan-coordinator nats-config)")]
    NoHostAccount(String),
    #[error("host {0} is unknown: no key is registered for it (`capstan register`); a command for a host not installed yet is queued only when asked to (`?unknown_host=queue`)")]
    UnknownHost(String),
    #[error("host {0} has no such key registered")]
    KeyNotFound(String),
    #[error("the key {key} is registered for host {host}: a key is one host's; unregister it there first")]
    KeyConflict { key: String, host: String },
    #[error("{what} of host {host} is refused: {why}")]
    Unverified {
        host: String,
        what: String,
        why: Unverified,
    },
    #[error("{0}")]
    Unreadable(String),
    #[error("NATS request failed: {0}")]
    Nats(String),
    #[error(transparent)]
    Setup(#[from] NatsError),
}

impl FleetError {
    fn nats(e: impl std::fmt::Display) -> FleetError {
        FleetError::Nats(e.to_string())
    }
}

pub use crate::answers::{HostState, HostStatus};

/// How a coordinator trusts hosts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trust {
    /// `[nats] host_accounts`: each host's records and results in its own storage
    /// account.
    pub host_accounts: bool,
    /// `allow_unregistered_hosts`: take what a host without a registered key
    /// publishes unchecked (development; a host with a key is always checked).
    pub allow_unregistered: bool,
}

pub struct Fleet {
    /// In the fleet's account: its JetStream, the hosts' bells and sync requests.
    client: async_nats::Client,
    /// What reaches the hosts — their RPC, result notices and storage: on per-host
    /// accounts the coordinators' second connection (`CAPSTAN_HOSTS`), else `client`.
    reach: async_nats::Client,
    js: jetstream::Context,
    signer: Signer,
    liveness: beats::Liveness,
    retention: Retention,
    trust: Trust,
    stores: storage::Stores,
    layout: OnceCell<Layout>,
}

struct Layout {
    /// The command stream (`CAPSTAN_COMMANDS`), read for hosts' sync requests.
    commands_stream: stream::Stream,
    commands: kv::Store,
    keys: keys::Registry,
}

/// `alive` for a beat at most `stale_after` old and at most
/// [`nats_layout::BEAT_SKEW_SECS`] in the future (clock skew); otherwise `stale`: a beat
/// from further in the future says nothing about now.
pub fn beat_status(age: chrono::Duration, stale_after: Duration) -> HostState {
    let skew = chrono::Duration::seconds(nats_layout::BEAT_SKEW_SECS as i64);
    match age.to_std() {
        Ok(age) if age <= stale_after => HostState::Alive,
        Err(_) if -age <= skew => HostState::Alive,
        _ => HostState::Stale,
    }
}

/// Runs `serve` (a subscription to `what`) for as long as the process runs: again
/// whenever it ends or fails (then `ended`, and a pause that doubles from 200 ms to
/// 5 s).
async fn forever<F, R>(what: &str, serve: impl Fn() -> F, ended: impl Fn())
where
    F: std::future::Future<Output = Result<R, FleetError>>,
{
    let mut retry = Duration::from_millis(200);
    loop {
        match serve().await {
            Ok(_) => tracing::warn!("the subscription to {what} ended; subscribing again"),
            Err(e) => {
                tracing::warn!(error = %capstan_common::report(&e), "cannot subscribe to {what} yet; retrying")
            }
        }
        ended();
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(5));
    }
}

/// Checks a host name taken from a URL before it goes into a subject.
pub fn check_host(host: &str) -> Result<(), FleetError> {
    validate::name("host", host).map_err(FleetError::BadCommand)
}

impl Fleet {
    /// `reach`: the connection to the hosts' RPC, notices and storage, where that is
    /// not `client` (`[nats] hosts_nkey_seed_file`). Beats are heard only while
    /// [`Fleet::serve_beats`] runs.
    pub fn new(
        client: async_nats::Client,
        reach: Option<async_nats::Client>,
        signer: Signer,
        pacing: liveness::Pacing,
        retention: Retention,
        trust: Trust,
    ) -> Fleet {
        let reach = reach.unwrap_or_else(|| client.clone());
        Fleet {
            js: jetstream::new(client.clone()),
            stores: storage::Stores::new(reach.clone(), retention, trust.host_accounts),
            client,
            reach,
            signer,
            liveness: beats::Liveness::new(pacing),
            retention,
            trust,
            layout: OnceCell::new(),
        }
    }

    pub fn connected(&self) -> bool {
        let up = |c: &async_nats::Client| {
            c.connection_state() == async_nats::connection::State::Connected
        };
        up(&self.client) && up(&self.reach)
    }

    async fn layout(&self) -> Result<&Layout, FleetError> {
        if !self.connected() {
            return Err(FleetError::NatsUnavailable);
        }
        self.layout
            .get_or_try_init(|| async {
                let replicas = self.retention.replicas;
                // An earlier release's work queue first: it holds the subjects.
                cnats::migrate_commands(&self.js, replicas).await?;
                let commands_stream = cnats::cmd_stream(&self.js, replicas).await?;
                let bucket = |name, max_age| cnats::bucket(&self.js, name, max_age, replicas);
                let commands = bucket(
                    nats_layout::COMMANDS_BUCKET,
                    self.retention.commands_max_age,
                )
                .await?;
                // Keys are kept until removed.
                let keys = bucket(nats_layout::HOST_KEYS_BUCKET, Duration::ZERO).await?;
                if self.stores.scope() == Scope::Shared {
                    self.stores.shared().await?;
                }
                // Streams and buckets an older version made get today's limits.
                cnats::migrate(&self.js, replicas, self.stores.scope()).await?;
                let keys = keys::Registry::open(keys, self.trust.allow_unregistered).await?;
                Ok::<_, FleetError>(Layout {
                    commands_stream,
                    commands,
                    keys,
                })
            })
            .await
    }

    /// Checks that `payload` (with its `headers`: signature, proof) is a publication
    /// `what` of `host`.
    async fn check(
        &self,
        host: &str,
        what: Publication<'_>,
        payload: &[u8],
        headers: Option<&HeaderMap>,
    ) -> Result<(), FleetError> {
        let layout = self.layout().await?;
        layout
            .keys
            .check(host, what, payload, headers)
            .map_err(|why| FleetError::Unverified {
                host: host.to_string(),
                what: match what {
                    Publication::Record => "a record",
                    Publication::Beat => "the heartbeat",
                    Publication::Result => "a command result",
                    Publication::Answer { .. } => "the answer",
                    Publication::Progress => "the results' progress",
                }
                .to_string(),
                why,
            })
    }

    /// The check every record of `host` read from its event stream must pass.
    async fn record_check(
        &self,
        host: &str,
    ) -> Result<impl Fn(&[u8], Option<&HeaderMap>) -> Result<(), FleetError> + '_, FleetError> {
        let keys = &self.layout().await?.keys;
        let host = host.to_string();
        Ok(move |payload: &[u8], headers: Option<&HeaderMap>| {
            keys.check(&host, Publication::Record, payload, headers)
                .map_err(|why| FleetError::Unverified {
                    host: host.clone(),
                    what: format!(
                        "record {}",
                        serde_json::from_slice::<Value>(payload)
                            .ok()
                            .and_then(|v| v["seq"].as_u64())
                            .map_or_else(|| "(without seq)".to_string(), |s| s.to_string())
                    ),
                    why,
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_from_beyond_the_skew_is_not_alive() {
        let stale_after = Duration::from_secs(15);
        let secs = chrono::Duration::seconds;
        assert_eq!(beat_status(secs(3), stale_after), HostState::Alive);
        assert_eq!(beat_status(secs(16), stale_after), HostState::Stale);
        let skew = nats_layout::BEAT_SKEW_SECS as i64;
        assert_eq!(beat_status(secs(-skew), stale_after), HostState::Alive);
        assert_eq!(beat_status(secs(-skew - 1), stale_after), HostState::Stale);
        assert_eq!(beat_status(secs(-3600), stale_after), HostState::Stale);
    }
}
