//! Commands through the fleet: submitting one (its id bound to its content in
//! `capstan_commands`), cancelling it, and reading or waiting for its status from its
//! host's result entry.

use super::{position, read, read_subject, CommandStatus, Fleet, FleetError, UnknownHost};
use async_nats::jetstream::{kv, stream};
use async_nats::HeaderMap;
use capstan_common::nats_layout;
use capstan_common::published::Publication;
use capstan_common::{validate, Command, ErrorCode, Op, Rejection};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;

/// The most bytes of records the coordinator reads from `CAPSTAN_EVT` for one result
/// whose host left its events out (`events_truncated`): the host's records
/// `first_seq`..=`last_seq`, other commands' among them. A result whose records take
/// more is answered [`FleetError::Unreadable`] (502 `result_unreadable`), never in
/// part.
pub const MAX_TRUNCATED_READ_BYTES: u64 = 32 * 1024 * 1024;

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

fn key(id: &str) -> String {
    capstan_common::signing::to_hex(id.as_bytes())
}

/// The last message on `subject` of `stream` (a bucket's key), read at the stream's
/// leader, which answers only with what is committed: never a replica's direct get,
/// which a follower lagging behind an acknowledged write may answer with nothing (a
/// 404 right after a 202) or an older value (a status going back). `None`: no
/// message, or the key deleted.
async fn at_leader(
    stream: &stream::Stream,
    subject: &str,
) -> Result<Option<async_nats::jetstream::message::StreamMessage>, FleetError> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => {
            let op = m.headers.get("KV-Operation").map(|v| v.as_str());
            Ok((!matches!(op, Some("DEL" | "PURGE"))).then_some(m))
        }
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(FleetError::nats(e)),
    }
}

impl Fleet {
    /// Fills `v`, `id` and `issued_at` when absent, validates, signs and publishes.
    /// Idempotent by id: re-posting the same command (any `issued_at`) re-publishes it,
    /// and the agent answers it from its log; re-posting the id with other content is
    /// [`FleetError::IdConflict`] and publishes nothing. A command for a host
    /// nobody knows is refused unless `unknown` says to queue it
    /// ([`Fleet::known_host`]).
    pub async fn submit(
        &self,
        mut body: Value,
        unknown: UnknownHost,
    ) -> Result<(String, String), FleetError> {
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
        let mut command = Command::parse(&body.to_string()).map_err(FleetError::BadCommand)?;
        if let Op::PrepareRevision { spec, .. } = &mut command.op {
            crate::spec_rules::admit(spec).map_err(FleetError::BadCommand)?;
        }
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
        self.known_host(&command.host, unknown).await?;
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
        // The command was taken for its host: so is the cancel.
        let (cancel, _) = self.submit(cancel, UnknownHost::Queue).await?;
        Ok((Some(cancel), status))
    }

    /// Where command `id` went, read at the bucket's leader ([`at_leader`]): once a
    /// submission was answered 202, every read finds it.
    async fn submission(&self, id: &str) -> Result<Submission, FleetError> {
        validate::command_id(id).map_err(FleetError::BadCommand)?;
        let layout = self.layout().await?;
        let subject = format!("$KV.{}.{}", nats_layout::COMMANDS_BUCKET, key(id));
        let entry = at_leader(&layout.commands.stream, &subject)
            .await?
            .ok_or_else(|| FleetError::CommandNotFound(id.to_string()))?;
        serde_json::from_slice(&entry.payload).map_err(FleetError::nats)
    }

    /// The command's status and every event that carries its id: its host's entry in
    /// `capstan_results` (one get), `pending` while there is none.
    pub async fn command(&self, id: &str) -> Result<CommandStatus, FleetError> {
        let submission = self.submission(id).await?;
        self.status_of(&submission).await
    }

    /// The command's status from its host's result entries, read at the bucket's
    /// leader ([`at_leader`]): a status once read is never followed by an older one.
    /// The final entry first ([`nats_layout::final_result_key`]): once it is there, the
    /// unfinished one — which a replay of an older signed result may have put back —
    /// is never read. (An agent of an earlier release put its final result under the
    /// unfinished key: read there as before.)
    async fn status_of(&self, s: &Submission) -> Result<CommandStatus, FleetError> {
        let storage = self.stores.of(&s.host).await?;
        let done = nats_layout::final_result_subject(&s.host, &s.id);
        let entry = match at_leader(&storage.results, &done).await? {
            Some(m) => Some(m),
            None => {
                let subject = nats_layout::result_subject(&s.host, &s.id);
                at_leader(&storage.results, &subject).await?
            }
        };
        match entry {
            None => Ok(CommandStatus::pending(&s.id, &s.host)),
            Some(m) => {
                self.check(&s.host, Publication::Result, &m.payload, Some(&m.headers))
                    .await?;
                self.whole(s, &m.payload).await
            }
        }
    }

    /// A result entry as an answer: checked against the submission (the host wrote
    /// it), with its events read from `CAPSTAN_EVT` when the entry left them out:
    /// every record of the host from `first_seq` to `last_seq`, each signed by the
    /// host, within [`MAX_TRUNCATED_READ_BYTES`] ([`read::read_all`]: bounded pages,
    /// none lost on the way). A read that cannot get them all is an error.
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
            if first == 0 || last < first {
                return Err(FleetError::Unreadable(format!(
                    "the result of {} says its events are records {first}..={last} of host {}: \
                     no such range",
                    s.id, s.host
                )));
            }
            let storage = self.stores.of(&s.host).await?;
            let subject = nats_layout::evt_subject(&s.host);
            let from = position::start_of(&storage.evt, &subject, first - 1).await?;
            let bounds = read::Bounds {
                records: usize::MAX,
                bytes: Some(MAX_TRUNCATED_READ_BYTES),
            };
            let check = self.record_check(&s.host).await?;
            let read = |from| {
                read_subject(
                    &storage.evt,
                    &subject,
                    from,
                    |e| e["command_id"].as_str() == Some(s.id.as_str()),
                    |e| e["seq"].as_u64().is_none_or(|seq| seq >= last),
                    bounds,
                    &check,
                )
            };
            let mut events = read(from).await;
            // Its first record not first: a replay misled the bisection past it
            // ([`position`]); from the stream's start, within the same bound.
            let misled = |read: &Result<(Vec<Value>, read::End), FleetError>| {
                read.as_ref().is_ok_and(|(events, _)| {
                    events.first().and_then(|e| e["seq"].as_u64()) != Some(first)
                })
            };
            if from > 1 && misled(&events) {
                tracing::warn!(
                    command_id = s.id,
                    host = s.host,
                    first,
                    "a command's records do not begin where the bisection found (a replayed record?): reading from the stream's start"
                );
                events = read(1).await;
            }
            let (events, end) = events.map_err(|e| match e {
                FleetError::Unreadable(why) => FleetError::Unreadable(format!(
                    "the events of {} (records {first}..={last} of host {}) cannot be read whole: {why}",
                    s.id, s.host
                )),
                other => other,
            })?;
            if end != read::End::Last {
                return Err(FleetError::Unreadable(format!(
                    "the events of {} are records {first}..={last} of host {}, but its records \
                     in CAPSTAN_EVT end before {last}: they cannot be read whole",
                    s.id, s.host
                )));
            }
            status.events = events;
            status.events_truncated = false;
        }
        Ok(status)
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
        // The puts themselves (unfinished and final), or on per-host accounts their
        // notices (the same bytes).
        let (host, id) = (&submission.host, &submission.id);
        let subjects = if self.trust.host_accounts {
            vec![nats_layout::result_notice_subject(host, id)]
        } else {
            vec![
                nats_layout::result_subject(host, id),
                nats_layout::final_result_subject(host, id),
            ]
        };
        let mut subscriptions = Vec::with_capacity(subjects.len());
        for subject in subjects {
            let subscription = self
                .reach
                .subscribe(subject)
                .await
                .map_err(FleetError::nats)?;
            subscriptions.push(subscription);
        }
        let mut live = futures::stream::select_all(subscriptions);
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
                            // Never an older one than already read (a replay).
                            Ok(()) => newer(status, self.whole(&submission, &m.payload).await?),
                            Err(e) => {
                                tracing::warn!(error = %e, "ignoring a result notice");
                                status
                            }
                        }
                    }
                    None => newer(status, self.status_of(&submission).await?),
                },
                _ = recheck => status = newer(status, self.status_of(&submission).await?),
                _ = tokio::time::sleep_until(deadline) => return Ok(status),
            }
        }
    }
}

/// The later of two statuses of one command: `next`, unless it is an unfinished one
/// that sums up fewer of the host's records than `now` does (an older result, heard
/// again).
fn newer(now: CommandStatus, next: CommandStatus) -> CommandStatus {
    if now.done || (!next.done && next.last_seq < now.last_seq) {
        now
    } else {
        next
    }
}

/// The id of the cancel [`Fleet::cancel`] sends for command `target`: `cancel-` and
/// the first 24 hex digits of the SHA-256 of `target`.
pub fn cancel_id(target: &str) -> String {
    use sha2::Digest as _;
    let digest = capstan_common::signing::to_hex(&sha2::Sha256::digest(target.as_bytes()));
    format!("cancel-{}", &digest[..24])
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

    fn status(status: &str, done: bool, last_seq: u64) -> CommandStatus {
        CommandStatus {
            status: status.into(),
            done,
            last_seq,
            ..CommandStatus::pending("c-1", "h1")
        }
    }

    #[test]
    fn a_status_heard_again_never_takes_the_place_of_a_later_one() {
        // Given a command running up to record 7,
        let now = status("running", false, 7);
        // when an older result of it is heard again, it is not taken;
        assert_eq!(newer(now.clone(), status("running", false, 5)), now);
        // when a later or final one is, it is.
        let later = status("running", false, 9);
        assert_eq!(newer(now.clone(), later.clone()), later);
        let done = status("succeeded", true, 8);
        assert_eq!(newer(now, done.clone()), done.clone());
        // Once done, nothing replaces it.
        assert_eq!(newer(done.clone(), status("running", false, 20)), done);
    }

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
}
