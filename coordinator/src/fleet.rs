//! The coordinator's view of the fleet, read from NATS on every request: commands go
//! out on `CAPSTAN_CMD`; what happened to each comes back as its entry in the
//! `capstan_results` bucket (written by its host's agent, read in one get) and as the
//! host's records in `CAPSTAN_EVT`; hosts from the `capstan_hosts` bucket. The only
//! other state is `capstan_commands` (id → host and a hash of the content the id is
//! bound to), also in NATS, so any number of coordinators can serve the same fleet.

use async_nats::jetstream::{self, kv, stream};
use async_nats::HeaderMap;
use capstan_common::nats::{self as cnats, NatsError, Retention};
use capstan_common::signing::Signer;
pub use capstan_common::status::CommandStatus;
use capstan_common::wire::{self, HostBeat};
use capstan_common::{validate, Command, Rejection};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::OnceCell;

mod position;
mod read;
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

/// One host as the registry and the event stream show it.
#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub host: String,
    /// `alive` (beat within `stale_after`), `stale` (older beat still in the
    /// bucket) or `gone` (no beat left, but the host has events).
    pub status: &'static str,
    pub beat: Option<HostBeat>,
    pub age_secs: Option<i64>,
}

pub struct Fleet {
    client: async_nats::Client,
    js: jetstream::Context,
    signer: Signer,
    stale_after: Duration,
    retention: Retention,
    layout: OnceCell<Layout>,
}

struct Layout {
    evt: stream::Stream,
    hosts: kv::Store,
    commands: kv::Store,
    results: kv::Store,
}

fn key(id: &str) -> String {
    capstan_common::signing::to_hex(id.as_bytes())
}

/// `alive` for a beat at most `stale_after` old and at most
/// [`wire::BEAT_SKEW_SECS`] in the future (clock skew); otherwise `stale`: a beat
/// from further in the future says nothing about now.
pub fn beat_status(age: chrono::Duration, stale_after: Duration) -> &'static str {
    let skew = chrono::Duration::seconds(wire::BEAT_SKEW_SECS as i64);
    match age.to_std() {
        Ok(age) if age <= stale_after => "alive",
        Err(_) if -age <= skew => "alive",
        _ => "stale",
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
    ) -> Fleet {
        Fleet {
            js: jetstream::new(client.clone()),
            client,
            signer,
            stale_after,
            retention,
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
                let layout = Layout {
                    evt: cnats::evt_stream(&self.js, replicas).await?,
                    hosts: cnats::bucket(
                        &self.js,
                        wire::HOSTS_BUCKET,
                        self.retention.hosts_max_age,
                        replicas,
                    )
                    .await?,
                    commands: cnats::bucket(
                        &self.js,
                        wire::COMMANDS_BUCKET,
                        self.retention.commands_max_age,
                        replicas,
                    )
                    .await?,
                    results: cnats::bucket(
                        &self.js,
                        wire::RESULTS_BUCKET,
                        self.retention.commands_max_age,
                        self.retention.replicas,
                    )
                    .await?,
                };
                // Streams and buckets an older version made get today's limits.
                cnats::migrate(&self.js, replicas).await?;
                Ok::<_, FleetError>(layout)
            })
            .await
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
        let layout = self.layout().await?;
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
                wire::cmd_subject(&command.host),
                headers,
                self.signer.signed_json(&command).into(),
            )
            .await
            .map_err(FleetError::nats)?
            .await
            .map_err(FleetError::nats)?;
        Ok((command.id, command.host))
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
        let layout = self.layout().await?;
        let entry = layout
            .results
            .get(wire::result_key(&s.host, &s.id))
            .await
            .map_err(FleetError::nats)?;
        match entry {
            None => Ok(CommandStatus::pending(&s.id, &s.host)),
            Some(bytes) => self.whole(s, &bytes).await,
        }
    }

    /// A result entry as an answer: checked against the submission (the host wrote
    /// it), with its events read from `CAPSTAN_EVT` when the entry left them out.
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
            let layout = self.layout().await?;
            let subject = wire::evt_subject(&s.host);
            let since = status.first_seq.saturating_sub(1);
            let from = position::start_of(&layout.evt, &subject, since).await?;
            let last = status.last_seq;
            status.events = read_subject(
                &layout.evt,
                &subject,
                from,
                |e| e["command_id"].as_str() == Some(s.id.as_str()),
                |e| e["seq"].as_u64().is_some_and(|seq| seq >= last),
                usize::MAX,
            )
            .await?;
            status.events_truncated = false;
        }
        Ok(status)
    }

    /// Waits until the command is done or `timeout` passes; returns its status then.
    /// Follows the result entry's subject, and re-reads the entry after 25 ms, then
    /// doubling to every 2 s: a put the subscription cannot have seen — routed just
    /// before the subscription began but stored just after the first read, or lost
    /// across a reconnect — is found that way.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<CommandStatus, FleetError> {
        let submission = self.submission(id).await?;
        // Subscribe before looking, so that nothing put in between is missed.
        let mut live = self
            .client
            .subscribe(wire::result_subject(&submission.host, &submission.id))
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
                    Some(m) => self.whole(&submission, &m.payload).await?,
                    None => self.status_of(&submission).await?,
                },
                _ = recheck => status = self.status_of(&submission).await?,
                _ = tokio::time::sleep_until(deadline) => return Ok(status),
            }
        }
    }

    /// Every host in the registry, and the hosts with events but no beat left.
    /// Fails (rather than calling anyone gone) when NATS is not reachable.
    pub async fn hosts(&self) -> Result<Vec<HostStatus>, FleetError> {
        let layout = self.layout().await?;
        let mut keys = layout.hosts.keys().await.map_err(FleetError::nats)?;
        let now = chrono::Utc::now();
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(FleetError::nats)?;
            let Some(bytes) = layout.hosts.get(&k).await.map_err(FleetError::nats)? else {
                continue;
            };
            let Ok(beat) = serde_json::from_slice::<HostBeat>(&bytes) else {
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
        let mut subjects = layout
            .evt
            .info_with_subjects("capstan.v1.evt.*")
            .await
            .map_err(FleetError::nats)?;
        while let Some(s) = subjects.next().await {
            let (subject, _count) = s.map_err(FleetError::nats)?;
            let host = subject.rsplit('.').next().unwrap_or_default().to_string();
            if !out.iter().any(|h| h.host == host) {
                out.push(HostStatus {
                    host,
                    status: "gone",
                    beat: None,
                    age_secs: None,
                });
            }
        }
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(out)
    }

    /// Asks the host's agent (`rpc.<host>.<verb>`).
    pub async fn rpc(&self, host: &str, verb: &str, body: Value) -> Result<Value, FleetError> {
        check_host(host)?;
        if !self.connected() {
            return Err(FleetError::NatsUnavailable);
        }
        let request = self
            .client
            .request(wire::rpc_subject(host, verb), body.to_string().into());
        match tokio::time::timeout(Duration::from_secs(5), request).await {
            Err(_) => Err(FleetError::HostTimeout(host.into())),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Err(FleetError::HostUnreachable(host.into()))
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                Err(FleetError::HostTimeout(host.into()))
            }
            Ok(Err(e)) => Err(FleetError::nats(e)),
            Ok(Ok(reply)) => serde_json::from_slice(&reply.payload).map_err(FleetError::nats),
        }
    }

    /// The host's records with seq > `since`, from `CAPSTAN_EVT` (the central copy:
    /// available when the host is not). Where they begin in the stream is found by
    /// bisection ([`position::start_of`]), not by reading what comes before.
    pub async fn events(
        &self,
        host: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Value>, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        let subject = wire::evt_subject(host);
        let from = position::start_of(&layout.evt, &subject, since).await?;
        read_subject(
            &layout.evt,
            &subject,
            from,
            |e| e["seq"].as_u64().is_some_and(|s| s > since),
            |_| false,
            limit,
        )
        .await
    }
}

/// A fresh command id: `c-` and 16 random hex digits.
fn new_id() -> Result<String, FleetError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| FleetError::Nats(e.to_string()))?;
    Ok(format!("c-{}", capstan_common::signing::to_hex(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_from_beyond_the_skew_is_not_alive() {
        let stale_after = Duration::from_secs(15);
        let secs = chrono::Duration::seconds;
        assert_eq!(beat_status(secs(3), stale_after), "alive");
        assert_eq!(beat_status(secs(16), stale_after), "stale");
        let skew = wire::BEAT_SKEW_SECS as i64;
        assert_eq!(beat_status(secs(-skew), stale_after), "alive");
        assert_eq!(beat_status(secs(-skew - 1), stale_after), "stale");
        assert_eq!(beat_status(secs(-3600), stale_after), "stale");
    }
}
