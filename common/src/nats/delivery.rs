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
/// coordinator's signed JSON, exactly as published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub seq: u64,
    pub command: String,
}

/// The answer to a [`SyncRequest`]: the host's next commands in stream order, and
/// whether more may follow them (ask again after the last). `error`: why none could
/// be read (the host asks again later).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncAnswer {
    pub commands: Vec<Queued>,
    pub more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
/// at a replica that may lag behind an acknowledged publish.
pub async fn commands_after(
    commands: &stream::Stream,
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
        answer.commands.push(Queued {
            seq: message.sequence,
            command: String::from_utf8_lossy(&message.payload).into_owned(),
        });
    }
}
