//! The log is the outbox. Every record, once durable, is published to
//! `capstan.v1.evt.<host>` (stream `CAPSTAN_EVT`) as its JSON form plus `host`, in seq
//! order, one at a time: the next record is sent only after JetStream acknowledged
//! the previous one, so the stream never holds a gap.
//!
//! Exactly once, without `Nats-Msg-Id`: JetStream de-duplicates message ids across
//! the whole stream, so an id another host can also send (any id: the server does
//! not tie ids to subjects) would let that host suppress our records. Instead every
//! publish carries `Nats-Expected-Last-Subject-Sequence`: the stream sequence of the
//! last message on our subject, i.e. of record `seq - 1` (0 for an empty subject).
//! The server stores record `seq` only if that is still the subject's last message, so
//! record `seq` can be stored only directly after record `seq - 1`, at most once: a
//! second copy (a re-publish after a lost ack, a stale publish from before a
//! reconnect) finds record `seq` last and is refused (`wrong last sequence`). Only
//! this host can publish on its subject (permissions), so nobody else can move it.
//!
//! Where to resume is read from JetStream itself — the last message on the host's
//! subject, its record seq and stream sequence — at start and after every failure
//! (a refused publish included), so nothing is lost across an outage or an agent
//! crash, and nothing is kept locally about it.
//!
//! A `duplicate` publish ack cannot happen without message ids; if one comes, the
//! record was not stored: it is an alarm (an error log and `outbox_alarm` in the
//! heartbeat and `status`), and the record is published again after a re-read.

use super::{pause, OutboxAlarm};
use crate::log::Log;
use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use capstan_common::wire;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
enum OutboxError {
    #[error("cannot reach the event stream")]
    Stream(#[source] capstan_common::nats::NatsError),
    #[error("cannot read the last published record")]
    Last(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the last published record has no seq")]
    NoSeq,
    #[error("cannot read the log")]
    Log(#[source] crate::log::LogError),
    #[error("cannot publish record {seq}")]
    Publish {
        seq: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("record {seq} was not stored: the subject moved on (a re-publish of a stored record, or a stale publish landed); re-reading")]
    Moved {
        seq: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("record {seq} was acknowledged as a duplicate of stream message {stream_seq} and not stored; re-reading")]
    Duplicate { seq: u64, stream_seq: u64 },
}

/// The host's last record in the stream: its record seq and its stream sequence
/// (both 0 when there is none).
async fn last_published(stream: &stream::Stream, subject: &str) -> Result<(u64, u64), OutboxError> {
    match stream.direct_get_last_for_subject(subject).await {
        Ok(message) => {
            let value: serde_json::Value = serde_json::from_slice(&message.payload)
                .map_err(|e| OutboxError::Last(e.into()))?;
            let seq = value["seq"].as_u64().ok_or(OutboxError::NoSeq)?;
            Ok((seq, message.sequence))
        }
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok((0, 0)),
        Err(e) => Err(OutboxError::Last(e.into())),
    }
}

/// Publishes records until `stop`; `published` carries the last acknowledged seq.
/// `replicas`: for the event stream, if this agent is the first to need it.
pub async fn run(
    js: jetstream::Context,
    replicas: usize,
    log: Arc<Log>,
    host: String,
    published: watch::Sender<u64>,
    alarm: OutboxAlarm,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(200);
    loop {
        match publish_all(&js, replicas, &log, &host, &published, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                if let OutboxError::Duplicate { .. } = e {
                    // Without message ids the server has nothing to de-duplicate
                    // against: someone is interfering with the stream.
                    tracing::error!(error = %e, "ALARM: unexpected duplicate publish ack");
                    alarm.set(e.to_string());
                } else {
                    let cause = std::error::Error::source(&e)
                        .map(|s| format!(": {s}"))
                        .unwrap_or_default();
                    tracing::warn!(error = %format!("{e}{cause}"), "outbox paused; retrying");
                }
                if pause(&mut stop, retry).await {
                    return;
                }
                retry = (retry * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn publish_all(
    js: &jetstream::Context,
    replicas: usize,
    log: &Log,
    host: &str,
    published: &watch::Sender<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let subject = wire::evt_subject(host);
    let stream = capstan_common::nats::evt_stream(js, replicas)
        .await
        .map_err(OutboxError::Stream)?;
    let (mut acked, mut last_stream_seq) = last_published(&stream, &subject).await?;
    let local = log.last_seq();
    if acked > local {
        tracing::error!(
            stream_seq = acked,
            log_seq = local,
            "the event stream is ahead of the local log (was the data dir replaced?); publishing from the log's end"
        );
        acked = local;
    }
    published.send_replace(acked);
    tracing::info!(resume_after = acked, "outbox publishing");
    let mut appended = log.subscribe();
    loop {
        let last = *appended.borrow_and_update();
        if last <= acked {
            // Idle: wake on the next append, not on a timer.
            if *stop.borrow() {
                return Ok(());
            }
            tokio::select! {
                _ = appended.changed() => {}
                _ = stop.changed() => return Ok(()),
            }
            continue;
        }
        // Only durable records leave the host: a record published and then lost in a
        // crash would make the stream disagree with the log.
        log.durable(last).await.map_err(OutboxError::Log)?;
        for record in log.read_since(acked) {
            let record = record.map_err(OutboxError::Log)?;
            if record.seq > last {
                break;
            }
            let seq = record.seq;
            let mut body = record.to_json();
            body["host"] = host.into();
            let message = jetstream::message::PublishMessage::build()
                .payload(body.to_string().into())
                .expected_last_subject_sequence(last_stream_seq);
            let publish_error = |e: jetstream::context::PublishError| {
                if e.kind() == PublishErrorKind::WrongLastSequence {
                    OutboxError::Moved {
                        seq,
                        source: e.into(),
                    }
                } else {
                    OutboxError::Publish {
                        seq,
                        source: e.into(),
                    }
                }
            };
            let ack = js
                .send_publish(subject.clone(), message)
                .await
                .map_err(publish_error)?
                .await
                .map_err(publish_error)?;
            if ack.duplicate {
                return Err(OutboxError::Duplicate {
                    seq,
                    stream_seq: ack.sequence,
                });
            }
            acked = seq;
            last_stream_seq = ack.sequence;
            published.send_replace(acked);
        }
    }
}
