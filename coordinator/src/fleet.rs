//! The coordinator's view of the fleet, read from NATS on every request: commands go
//! out on `CAPSTAN_CMD`; what happened to each comes back as its entry in the
//! `capstan_results` bucket (written by its host's agent, read in one get) and as the
//! host's records in `CAPSTAN_EVT` (both shared, or each host's own on per-host
//! accounts: [`storage`]); hosts from the `capstan_hosts` bucket. Everything a host
//! wrote is taken only with its signature checked against the host's registered
//! keys ([`keys`]). The only other state is `capstan_commands` (id → host and a hash
//! of the content the id is bound to) and `capstan_host_keys`, also in NATS, so any
//! number of coordinators can serve the same fleet.

use async_nats::jetstream::{self, kv, stream};
use async_nats::HeaderMap;
use capstan_common::answers::{HostBeat, Verb};
use capstan_common::nats::{self as cnats, NatsError, Retention, Scope};
use capstan_common::nats_layout;
use capstan_common::published::{Publication, Unverified};
use capstan_common::signing::Signer;
pub use capstan_common::status::CommandStatus;
use capstan_common::{validate, Command, ErrorCode, Rejection};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::OnceCell;

mod beats;
pub mod keys;
mod position;
mod read;
mod storage;
use read::read_subject;

/// The most records the coordinator reads for one result whose host left its events
/// out (`events_truncated`): a host's `first_seq`/`last_seq` bound no read beyond it.
pub const MAX_TRUNCATED_RECORDS: u64 = 10_000;

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
    #[error("host {0} has no such key registered")]
    KeyNotFound(String),
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

/// Where a command went (`capstan_commands`, key = hex of the id).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Submission {
    id: String,
    host: String,
    submitted_at: chrono::DateTime<chrono::Utc>,
    /// Hex SHA-256 of [`Command::content`] (everything but `issued_at` and `sig`):
    /// what the id is bound to. Absent in entries written before ids were bound.
    #[serde(default)]
    content_sha256: Option<String>,
}

/// The hash an id is bound to.
fn content_hash(command: &Command) -> String {
    use sha2::Digest as _;
    capstan_common::signing::to_hex(&sha2::Sha256::digest(command.content().as_bytes()))
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
    client: async_nats::Client,
    js: jetstream::Context,
    signer: Signer,
    stale_after: Duration,
    retention: Retention,
    trust: Trust,
    stores: storage::Stores,
    layout: OnceCell<Layout>,
}

struct Layout {
    /// The hosts bucket's stream, read whole for its latest beats (with their
    /// signatures: [`beats::latest`]).
    hosts_stream: stream::Stream,
    commands: kv::Store,
    keys: keys::Registry,
}

fn key(id: &str) -> String {
    capstan_common::signing::to_hex(id.as_bytes())
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

/// Checks a host name taken from a URL before it goes into a subject.
pub fn check_host(host: &str) -> Result<(), FleetError> {
    validate::name("host", host).map_err(FleetError::BadCommand)
}

impl Fleet {
    pub fn new(
        client: async_nats::Client,
        signer: Signer,
        stale_after: Duration,
        retention: Retention,
        trust: Trust,
    ) -> Fleet {
        Fleet {
            js: jetstream::new(client.clone()),
            stores: storage::Stores::new(client.clone(), retention, trust.host_accounts),
            client,
            signer,
            stale_after,
            retention,
            trust,
            layout: OnceCell::new(),
        }
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    async fn layout(&self) -> Result<&Layout, FleetError> {
        if !self.connected() {
            return Err(FleetError::NatsUnavailable);
        }
        self.layout
            .get_or_try_init(|| async {
                let replicas = self.retention.replicas;
                cnats::cmd_stream(&self.js, replicas).await?;
                let bucket = |name, max_age| cnats::bucket(&self.js, name, max_age, replicas);
                // The hosts bucket: its stream is read below.
                bucket(nats_layout::HOSTS_BUCKET, self.retention.hosts_max_age).await?;
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
                let hosts_stream = self
                    .js
                    .get_stream(format!("KV_{}", nats_layout::HOSTS_BUCKET))
                    .await
                    .map_err(FleetError::nats)?;
                let keys = keys::Registry::open(keys, self.trust.allow_unregistered).await?;
                Ok::<_, FleetError>(Layout {
                    hosts_stream,
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
                }
                .to_string(),
                why,
            })
    }

    /// Registers `public_key` (64 hex digits) for `host` and, on per-host accounts,
    /// makes the host's stream and bucket if they are not there yet.
    pub async fn register(&self, host: &str, public_key: &str) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        if self.trust.host_accounts {
            self.stores.of(host).await?;
        }
        layout.keys.add(host, public_key).await
    }

    /// The keys registered for `host`.
    pub async fn host_keys(&self, host: &str) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        layout
            .keys
            .entry(host)
            .await?
            .filter(|e| !e.public_keys.is_empty())
            .ok_or_else(|| FleetError::KeyNotFound(host.to_string()))
    }

    /// Removes one of `host`'s keys.
    pub async fn unregister(
        &self,
        host: &str,
        public_key: &str,
    ) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        layout.keys.remove(host, public_key).await
    }

    /// Fills `v`, `id` and `issued_at` when absent, validates, signs and publishes.
    /// Idempotent by id: re-posting the same command (any `issued_at`) re-publishes it,
    /// and the agent answers it from its log; re-posting the id with other content is
    /// [`FleetError::IdConflict`] and publishes nothing.
    pub async fn submit(&self, mut body: Value) -> Result<(String, String), FleetError> {
        let object = body
            .as_object_mut()
            .ok_or_else(|| FleetError::BadRequest("a command is a JSON object".into()))?;
        object.remove("sig");
        object
            .entry("v")
            .or_insert(json!(capstan_common::PROTOCOL_VERSION));
        if !object.contains_key("id") {
            object.insert("id".into(), new_id()?.into());
        }
        object
            .entry("issued_at")
            .or_insert_with(|| json!(chrono::Utc::now()));
        let command = Command::parse(&body.to_string()).map_err(FleetError::BadCommand)?;
        if let Some(target) = command.op.cancels() {
            // A cancel is for a command submitted here, to the host it names.
            let bound = self.submission(target).await?;
            if bound.host != command.host {
                return Err(FleetError::BadCommand(Rejection::new(
                    ErrorCode::InvalidCommand,
                    format!(
                        "command {target} is for host {}; this cancel is for {}",
                        bound.host, command.host
                    ),
                )));
            }
        }
        let layout = self.layout().await?;
        if self.trust.host_accounts {
            // The host needs its stream and bucket to report; a host the server has
            // no account for could never take the command.
            self.stores.of(&command.host).await?;
        }
        let submission = Submission {
            id: command.id.clone(),
            host: command.host.clone(),
            submitted_at: chrono::Utc::now(),
            content_sha256: Some(content_hash(&command)),
        };
        let value = serde_json::to_vec(&submission).expect("submissions serialise");
        // The first submission of an id wins: its content is what the id means from
        // then on (create is atomic, so two coordinators cannot both win). An entry that ages out between the create
        // and the read is created again, once.
        for attempt in 0..2 {
            let Err(e) = layout
                .commands
                .create(key(&command.id), value.clone().into())
                .await
            else {
                break;
            };
            if e.kind() != kv::CreateErrorKind::AlreadyExists {
                return Err(FleetError::nats(e));
            }
            let first = match self.submission(&command.id).await {
                Err(FleetError::CommandNotFound(_)) if attempt == 0 => continue,
                other => other?,
            };
            if first
                .content_sha256
                .is_some_and(|h| Some(h) != submission.content_sha256)
            {
                return Err(FleetError::IdConflict {
                    id: command.id,
                    host: first.host,
                });
            }
            break;
        }
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", command.id.as_str());
        self.js
            .publish_with_headers(
                nats_layout::cmd_subject(&command.host),
                headers,
                self.signer.signed_json(&command).into(),
            )
            .await
            .map_err(FleetError::nats)?
            .await
            .map_err(FleetError::nats)?;
        Ok((command.id, command.host))
    }

    /// Asks the host of command `id` to cut it short: submits a `cancel_command` for
    /// it under [`cancel_id`] (so asking again is the same cancel). Nothing is sent
    /// for a command that is done; the answer is the cancel's id (`None` then) and
    /// `id`'s status as it was read.
    pub async fn cancel(&self, id: &str) -> Result<(Option<String>, CommandStatus), FleetError> {
        let submission = self.submission(id).await?;
        let status = self.status_of(&submission).await?;
        if status.done {
            return Ok((None, status));
        }
        let cancel = json!({
            "id": cancel_id(id),
            "host": submission.host,
            "op": "cancel_command",
            "target": id,
        });
        let (cancel, _) = self.submit(cancel).await?;
        Ok((Some(cancel), status))
    }

    async fn submission(&self, id: &str) -> Result<Submission, FleetError> {
        validate::command_id(id).map_err(FleetError::BadCommand)?;
        let layout = self.layout().await?;
        let entry = layout
            .commands
            .get(key(id))
            .await
            .map_err(FleetError::nats)?
            .ok_or_else(|| FleetError::CommandNotFound(id.to_string()))?;
        serde_json::from_slice(&entry).map_err(FleetError::nats)
    }

    /// The command's status and every event that carries its id: its host's entry in
    /// `capstan_results` (one get), `pending` while there is none.
    pub async fn command(&self, id: &str) -> Result<CommandStatus, FleetError> {
        let submission = self.submission(id).await?;
        self.status_of(&submission).await
    }

    async fn status_of(&self, s: &Submission) -> Result<CommandStatus, FleetError> {
        let storage = self.stores.of(&s.host).await?;
        let entry = storage
            .results
            .direct_get_last_for_subject(nats_layout::result_subject(&s.host, &s.id))
            .await;
        match entry {
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => {
                Ok(CommandStatus::pending(&s.id, &s.host))
            }
            Err(e) => Err(FleetError::nats(e)),
            Ok(m) => {
                self.check(&s.host, Publication::Result, &m.payload, Some(&m.headers))
                    .await?;
                self.whole(s, &m.payload).await
            }
        }
    }

    /// A result entry as an answer: checked against the submission (the host wrote
    /// it), with its events read from `CAPSTAN_EVT` when the entry left them out
    /// (at most [`MAX_TRUNCATED_RECORDS`], each signed by the host).
    async fn whole(&self, s: &Submission, bytes: &[u8]) -> Result<CommandStatus, FleetError> {
        let mut status: CommandStatus = serde_json::from_slice(bytes).map_err(|e| {
            FleetError::Nats(format!("the result entry of {} is not a status: {e}", s.id))
        })?;
        if status.id != s.id || status.host != s.host {
            return Err(FleetError::Nats(format!(
                "the result entry of {} names command {} of host {}",
                s.id, status.id, status.host
            )));
        }
        if status.events_truncated {
            let (first, last) = (status.first_seq, status.last_seq);
            if first == 0 || last < first || last - first >= MAX_TRUNCATED_RECORDS {
                return Err(FleetError::Unreadable(format!(
                    "the result of {} says its events are records {first}..={last} of host {}: \
                     more than the {MAX_TRUNCATED_RECORDS} records a result may span",
                    s.id, s.host
                )));
            }
            let storage = self.stores.of(&s.host).await?;
            let subject = nats_layout::evt_subject(&s.host);
            let from = position::start_of(&storage.evt, &subject, first - 1).await?;
            status.events = read_subject(
                &storage.evt,
                &subject,
                from,
                |e| e["command_id"].as_str() == Some(s.id.as_str()),
                |e| e["seq"].as_u64().is_none_or(|seq| seq >= last),
                usize::try_from(MAX_TRUNCATED_RECORDS).unwrap_or(usize::MAX),
                self.record_check(&s.host).await?,
            )
            .await?;
            status.events_truncated = false;
        }
        Ok(status)
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

    /// Waits until the command is done or `timeout` passes; returns its status then.
    /// Follows the command's result puts (on per-host accounts their notices,
    /// [`nats_layout::result_notice_subject`]; one not signed by the host is ignored), and
    /// re-reads the entry after 25 ms, then doubling to every 2 s: a put whose notice
    /// was lost (across a reconnect, or sent just before the subscription began) is
    /// found that way.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<CommandStatus, FleetError> {
        let submission = self.submission(id).await?;
        // Subscribe before looking, so that nothing put in between is missed.
        // The put itself, or on per-host accounts its notice (the same bytes).
        let subject = if self.trust.host_accounts {
            nats_layout::result_notice_subject(&submission.host, &submission.id)
        } else {
            nats_layout::result_subject(&submission.host, &submission.id)
        };
        let mut live = self
            .client
            .subscribe(subject)
            .await
            .map_err(FleetError::nats)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut status = self.status_of(&submission).await?;
        let mut pause = Duration::from_millis(25);
        loop {
            if status.done {
                return Ok(status);
            }
            let recheck = tokio::time::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(2));
            tokio::select! {
                m = live.next() => status = match m {
                    Some(m) => {
                        let signed = self
                            .check(&submission.host, Publication::Result, &m.payload, m.headers.as_ref())
                            .await;
                        match signed {
                            Ok(()) => self.whole(&submission, &m.payload).await?,
                            Err(e) => {
                                tracing::warn!(error = %e, "ignoring a result notice");
                                status
                            }
                        }
                    }
                    None => self.status_of(&submission).await?,
                },
                _ = recheck => status = self.status_of(&submission).await?,
                _ = tokio::time::sleep_until(deadline) => return Ok(status),
            }
        }
    }

    /// Every host in the registry (its beat checked against its keys), and the hosts
    /// with events or a registered key but no beat left. Fails (rather than calling
    /// anyone gone) when NATS is not reachable.
    pub async fn hosts(&self) -> Result<Vec<HostStatus>, FleetError> {
        let layout = self.layout().await?;
        let prefix = format!("$KV.{}.", nats_layout::HOSTS_BUCKET);
        let latest = beats::latest(&self.client, &layout.hosts_stream, &prefix).await?;
        let now = chrono::Utc::now();
        let mut out = Vec::with_capacity(latest.len());
        for (k, m) in latest {
            if let Err(e) = self
                .check(&k, Publication::Beat, &m.payload, m.headers.as_ref())
                .await
            {
                tracing::warn!(error = %e, "a heartbeat not signed by its host");
                out.push(HostStatus {
                    host: k.clone(),
                    status: HostState::Unverified,
                    beat: None,
                    age_secs: None,
                });
                continue;
            }
            let Ok(beat) = serde_json::from_slice::<HostBeat>(&m.payload) else {
                continue;
            };
            // The key is the host: only it may write it (permissions); the body is
            // whatever the writer said.
            if beat.host != k {
                tracing::warn!(key = %k, body_host = %beat.host, "ignoring a heartbeat whose body names another host");
                continue;
            }
            let age = now.signed_duration_since(beat.at);
            let status = beat_status(age, self.stale_after);
            out.push(HostStatus {
                host: k.clone(),
                status,
                age_secs: Some(age.num_seconds()),
                beat: Some(beat),
            });
        }
        let mut known: Vec<String> = layout.keys.hosts();
        if !self.trust.host_accounts {
            let evt = &self.stores.shared().await?.evt;
            let mut subjects = evt
                .info_with_subjects("capstan.v1.evt.*")
                .await
                .map_err(FleetError::nats)?;
            while let Some(s) = subjects.next().await {
                let (subject, _count) = s.map_err(FleetError::nats)?;
                known.push(subject.rsplit('.').next().unwrap_or_default().to_string());
            }
        }
        // A host known by its key and by its events is listed once.
        let mut listed: std::collections::HashSet<String> =
            out.iter().map(|h| h.host.clone()).collect();
        for host in known {
            if listed.insert(host.clone()) {
                out.push(HostStatus {
                    host,
                    status: HostState::Gone,
                    beat: None,
                    age_secs: None,
                });
            }
        }
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(out)
    }

    /// Asks the host's agent (`rpc.<host>.<verb>`): its answer, an error answer too
    /// (read it with [`capstan_common::answers::read_answer`]).
    pub async fn rpc(&self, host: &str, verb: Verb, body: Value) -> Result<Value, FleetError> {
        let verb = verb.as_str();
        check_host(host)?;
        if !self.connected() {
            return Err(FleetError::NatsUnavailable);
        }
        let request = self.client.request(
            nats_layout::rpc_subject(host, verb),
            body.to_string().into(),
        );
        match tokio::time::timeout(Duration::from_secs(5), request).await {
            Err(_) => Err(FleetError::HostTimeout(host.into())),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Err(FleetError::HostUnreachable(host.into()))
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                Err(FleetError::HostTimeout(host.into()))
            }
            Ok(Err(e)) => Err(FleetError::nats(e)),
            Ok(Ok(reply)) => {
                let subject = nats_layout::rpc_subject(host, verb);
                self.check(
                    host,
                    Publication::Answer { subject: &subject },
                    &reply.payload,
                    reply.headers.as_ref(),
                )
                .await?;
                serde_json::from_slice(&reply.payload).map_err(FleetError::nats)
            }
        }
    }

    /// The host's records with seq > `since`, from `CAPSTAN_EVT` (the central copy:
    /// available when the host is not), each signed by the host. Where they begin in the stream is found by
    /// bisection ([`position::start_of`]), not by reading what comes before.
    pub async fn events(
        &self,
        host: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Value>, FleetError> {
        check_host(host)?;
        let storage = self.stores.of(host).await?;
        let subject = nats_layout::evt_subject(host);
        let from = position::start_of(&storage.evt, &subject, since).await?;
        read_subject(
            &storage.evt,
            &subject,
            from,
            |e| e["seq"].as_u64().is_some_and(|s| s > since),
            |_| false,
            limit,
            self.record_check(host).await?,
        )
        .await
    }
}

/// A fresh command id: `c-` and 16 random hex digits.
/// The id of the cancel [`Fleet::cancel`] sends for command `target`: `cancel-` and
/// the first 24 hex digits of the SHA-256 of `target`.
pub fn cancel_id(target: &str) -> String {
    use sha2::Digest as _;
    let digest = capstan_common::signing::to_hex(&sha2::Sha256::digest(target.as_bytes()));
    format!("cancel-{}", &digest[..24])
}

fn new_id() -> Result<String, FleetError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| FleetError::Nats(e.to_string()))?;
    Ok(format!("c-{}", capstan_common::signing::to_hex(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_id_is_the_same_for_the_same_command_and_a_valid_id_for_any() {
        let long = "x".repeat(128);
        assert_eq!(cancel_id("c-1"), cancel_id("c-1"));
        assert_ne!(cancel_id("c-1"), cancel_id("c-2"));
        for target in ["c-1", long.as_str()] {
            let id = cancel_id(target);
            assert_eq!(id.len(), "cancel-".len() + 24, "{id}");
            validate::command_id(&id).unwrap();
        }
    }

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
