//! The log is the outbox. Every record, once durable, is published to
//! `capstan.v1.evt.<host>` (stream `CAPSTAN_EVT`) as its JSON form plus `host`, in seq
//! order, one at a time: the next record is sent only after JetStream acknowledged
//! the previous one, so the stream never holds a gap. Each message carries
//! `Nats-Msg-Id: <host>:<seq>`, so a re-publish after a lost ack is dropped.
//!
//! Where to resume is read from JetStream itself — the last message on the host's
//! subject — at start and after every failure, so nothing is lost across an outage or
//! an agent crash, and nothing is kept locally about it.

use super::pause;
use crate::log::Log;
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use capstan_common::wire;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the outbox looks for new records when it is idle.

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
}

/// The seq of the host's last record in the stream (0 when there is none).
async fn last_published(stream: &stream::Stream, subject: &str) -> Result<u64, OutboxError> {
    match stream.direct_get_last_for_subject(subject).await {
        Ok(message) => {
            let value: serde_json::Value = serde_json::from_slice(&message.payload)
                .map_err(|e| OutboxError::Last(e.into()))?;
            value["seq"].as_u64().ok_or(OutboxError::NoSeq)
        }
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(0),
        Err(e) => Err(OutboxError::Last(e.into())),
    }
}

/// Publishes records until `stop`; `published` carries the last acknowledged seq.
pub async fn run(
    js: jetstream::Context,
    log: Arc<Log>,
    host: String,
    published: watch::Sender<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(200);
    loop {
        match publish_all(&js, &log, &host, &published, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                tracing::warn!(error = %format!("{e}{cause}"), "outbox paused; retrying");
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
    log: &Log,
    host: &str,
    published: &watch::Sender<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let subject = wire::evt_subject(host);
    let stream = capstan_common::nats::evt_stream(js)
        .await
        .map_err(OutboxError::Stream)?;
    let mut acked = last_published(&stream, &subject).await?;
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
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", wire::record_msg_id(host, seq).as_str());
            let publish_error = |source: Box<dyn std::error::Error + Send + Sync>| {
                OutboxError::Publish { seq, source }
            };
            js.publish_with_headers(subject.clone(), headers, body.to_string().into())
                .await
                .map_err(|e| publish_error(e.into()))?
                .await
                .map_err(|e| publish_error(e.into()))?;
            acked = seq;
            published.send_replace(acked);
        }
    }
}
