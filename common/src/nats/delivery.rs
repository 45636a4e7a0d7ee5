//! Commands delivered without a consumer per host (`docs/nats.md`, *Delivery*).
//!
//! Every host's commands sit in one [`CMD_STREAM`](nats_layout::CMD_STREAM), under
//! its own subject, in the order they were published. No host owns anything there:
//! its agent keeps its **position** (the stream sequence of the last command it has
//! finished with, every earlier one of its subject too) in its own log, and asks for
//! the commands after it — [`commands_after`], read at the stream's leader, so that
//! a command whose publish was acknowledged is always found. On per-host accounts
//! the agent cannot read the stream: it asks the coordinators on
//! [`nats_layout::sync_subject`] ([`SyncRequest`] → [`SyncAnswer`]), and they read it
//! for the host the subject names. A command is also a bell: the host hears every
//! publish on its command subject (on per-host accounts a stream export of exactly
//! that subject) and asks for what follows its position.
//!
//! A command whose result the host already recorded as final (its entry in the
//! results bucket, `done`) is handed as [`Queued::finished`], not to be carried out:
//! the host moves past it. Its log answers a command it knows anyway; this is for a
//! log that no longer knows it — a data dir restored from an older copy — which
//! would otherwise carry out again every command since that copy.

use super::NatsError;
use crate::nats_layout;
use async_nats::jetstream::stream;
use serde::{Deserialize, Serialize};

/// The most commands one [`SyncAnswer`] carries.
pub const SYNC_BATCH: usize = 64;
/// The most bytes of commands one [`SyncAnswer`] carries (one command always, even
/// a larger one: a command is at most [`crate::MAX_COMMAND_BYTES`]), well under
/// nats-server's default 1 MiB message limit.
pub const SYNC_MAX_BYTES: usize = 512 * 1024;

/// What a host asks on [`nats_layout::sync_subject`]: its commands after stream
/// sequence `after`, at most `max` of them (capped at [`SYNC_BATCH`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    pub after: u64,
    pub max: usize,
}

/// A command as it sits in the stream: its stream sequence and its text (the
/// coordinator's signed JSON, exactly as published). `finished`: the final status
/// (`succeeded`, `failed`, `rejected`) the host's results bucket already holds for
/// the command's id — the host moves past it without carrying it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub seq: u64,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
}

/// The answer to a [`SyncRequest`]: the host's next commands in stream order, and
/// whether more may follow them (ask again after the last). `error`: why none could
/// be read (the host asks again later). `beat_secs`: the fleet's heartbeat pace,
/// how often the host is to beat (coordinators of earlier releases: none, the host
/// keeps its pace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncAnswer {
    pub commands: Vec<Queued>,
    pub more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beat_secs: Option<u64>,
}

fn read_error(host: &str) -> impl FnOnce(stream::RawMessageError) -> NatsError {
    let what = format!("the commands of host {host}");
    move |e| NatsError::Setup {
        what,
        source: e.into(),
    }
}

/// Host `host`'s commands in `commands` (the stream [`nats_layout::CMD_STREAM`])
/// with a stream sequence above `after`, in order: at most `max` (and
/// [`SYNC_BATCH`]) of them and about [`SYNC_MAX_BYTES`]. Each is one read at the
/// stream's leader ("the subject's first message at or after sequence s"), never
/// at a replica that may lag behind an acknowledged publish, and one of the host's
/// entry for it in `results` (the stream of the results bucket the host writes):
/// one that is final is [`Queued::finished`].
pub async fn commands_after(
    commands: &stream::Stream,
    results: &stream::Stream,
    host: &str,
    after: u64,
    max: usize,
) -> Result<SyncAnswer, NatsError> {
    let subject = nats_layout::cmd_subject(host);
    let max = max.clamp(1, SYNC_BATCH);
    let mut answer = SyncAnswer::default();
    let (mut from, mut bytes) = (after.saturating_add(1), 0);
    loop {
        if answer.commands.len() == max || bytes >= SYNC_MAX_BYTES {
            answer.more = true;
            return Ok(answer);
        }
        let message = match commands
            .get_first_raw_message_by_subject(&subject, from)
            .await
        {
            Ok(m) => m,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(answer)
            }
            Err(e) => return Err(read_error(host)(e)),
        };
        if message.sequence < from {
            // Not what was asked: never hand out a command twice in one answer.
            return Ok(answer);
        }
        from = message.sequence + 1;
        bytes += message.payload.len();
        let command = String::from_utf8_lossy(&message.payload).into_owned();
        let finished = match command_id(&command) {
            Some(id) => finished(results, host, &id).await?,
            None => None,
        };
        answer.commands.push(Queued {
            seq: message.sequence,
            command,
            finished,
        });
    }
}

/// The id a command's text gives itself, read without admitting it (the host's
/// admission judges the rest).
fn command_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        id: Option<String>,
    }
    serde_json::from_str::<Head>(text).ok()?.id
}

/// The final status host `host` recorded for command `id`, if it did.
async fn finished(
    results: &stream::Stream,
    host: &str,
    id: &str,
) -> Result<Option<String>, NatsError> {
    #[derive(Deserialize)]
    struct Entry {
        status: String,
        done: bool,
    }
    // The final key, then (results put by an agent of an earlier release) the other.
    for subject in [
        nats_layout::final_result_subject(host, id),
        nats_layout::result_subject(host, id),
    ] {
        match results.direct_get_last_for_subject(&subject).await {
            Ok(m) => {
                let done = serde_json::from_slice::<Entry>(&m.payload)
                    .ok()
                    .filter(|e| e.done);
                if let Some(e) = done {
                    return Ok(Some(e.status));
                }
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => {}
            Err(e) => {
                return Err(NatsError::Setup {
                    what: format!("the result of command {id} of host {host}"),
                    source: e.into(),
                })
            }
        }
    }
    Ok(None)
}
