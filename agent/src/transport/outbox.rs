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
//! Bursts (at least [`BATCH_MIN`] records waiting) go out as atomic batches
//! (nats-server 2.12 and later, when the stream allows them): up to [`BATCH`]
//! consecutive records in one round trip, stored all or none,
//! the first carrying the expected last subject sequence — so a batch, like a single
//! record, is stored only right after record `first - 1`, at most once. A batch that
//! fails for another reason than the subject moving (the server's limit of open
//! batches per stream, say) sends the outbox back to one record at a time for
//! [`FALLBACK`], at once; an older server gets one at a time throughout. A failure
//! after progress starts the retry pause afresh (0.2 s doubling to 2 s).
//!
//! Where to resume is read from JetStream itself — the last message on the host's
//! subject, its record seq and stream sequence — at start and after every failure
//! (a refused publish included), so nothing is lost across an outage or an agent
//! crash. Only the host's own signed record counts there, and only one at or past
//! the log's mark [`MARK`] (the highest seq acknowledged, kept with the log's next
//! flush): anything else last on the subject was put by whoever holds the host's NATS
//! credentials — junk, or a replay of an older record of its own — and the outbox
//! goes on after it from the mark rather than stall or publish again what it did.
//!
//! A `duplicate` publish ack cannot happen without message ids; if one comes, the
//! record was not stored: it is an alarm (an error log and `outbox_alarm` in the
//! heartbeat and `status`), and the record is published again after a re-read.

use super::{pause, Link, OutboxAlarm};
use crate::log::Log;
use async_nats::header;
use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use capstan_common::nats_layout;
use capstan_common::published::{HostKeys, Publication};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
enum OutboxError {
    #[error("cannot reach the event stream")]
    Stream(#[source] capstan_common::nats::NatsError),
    #[error("cannot read the last published record")]
    Last(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    #[error(
        "the batch of records {first}..={last} was not stored; one at a time for {FALLBACK:?}"
    )]
    Batch {
        first: u64,
        last: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The most records in one atomic batch.
const BATCH: usize = 256;
/// The fewest records worth a batch: fewer go one at a time, so that many hosts each
/// publishing a few records do not crowd the server's open batches.
const BATCH_MIN: usize = 8;
/// How long the outbox publishes one record at a time after a batch failed for
/// another reason than the subject moving.
const FALLBACK: Duration = Duration::from_secs(30);

/// Whether records go out in atomic batches: the stream allows them (nats-server
/// 2.12 and later; the layout asks for it), and no batch failed lately.
#[derive(Debug, Default)]
struct Atomic {
    allowed: bool,
    failed_at: Option<tokio::time::Instant>,
}

impl Atomic {
    fn ready(&self) -> bool {
        self.allowed && self.failed_at.is_none_or(|t| t.elapsed() >= FALLBACK)
    }

    fn fail(&mut self) {
        self.failed_at = Some(tokio::time::Instant::now());
    }
}

/// The log's mark of the highest record seq the stream acknowledged.
pub const MARK: &str = "published";

/// The last message on the host's subject (`None` when there is none): its record
/// seq when it is the host's own signed record (`None` for anything else), and its
/// stream sequence.
async fn last_on_subject<I>(
    stream: &stream::Stream<I>,
    subject: &str,
    own: &HostKeys,
) -> Result<Option<(Option<u64>, u64)>, OutboxError> {
    match stream.direct_get_last_for_subject(subject).await {
        Ok(m) => {
            let seq = super::own_seq(own, Publication::Record, &m).ok().flatten();
            Ok(Some((seq, m.sequence)))
        }
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
        Err(e) => Err(OutboxError::Last(e.into())),
    }
}

/// Where to resume: the last record acknowledged and its stream sequence, from what
/// is last on the subject and the log's [`MARK`]. An empty subject is re-filled from
/// seq 1 (a new stream, a host moved to another shard) unless the server cannot be
/// believed on that (`trust_empty` false: nats-server 2.9, which forgets a subject's
/// messages once it refuses a publish there for quota) and the log says records were
/// acknowledged: then from the mark.
fn resume_point(last: Option<(Option<u64>, u64)>, mark: u64, trust_empty: bool) -> (u64, u64) {
    match last {
        None if trust_empty || mark == 0 => (0, 0),
        None => {
            tracing::warn!(
                published_mark = mark,
                "this host's subject reads empty though the stream acknowledged records up to the mark (nats-server 2.9 after refusing a publish for quota); publishing after the mark"
            );
            (mark, 0)
        }
        Some((Some(seq), stream_seq)) if seq >= mark => (seq, stream_seq),
        Some((seq, stream_seq)) => {
            tracing::warn!(
                claimed_seq = ?seq,
                published_mark = mark,
                "the last message on this host's subject is not its own latest record (junk or a replay, put there with its NATS credentials); publishing after it from the log's mark"
            );
            (mark, stream_seq)
        }
    }
}

/// Publishes records until `stop`; `published` carries the last acknowledged seq.
/// `replicas`: for the event stream, if this agent is the first to need it.
pub(crate) async fn run(
    link: Link,
    log: Arc<Log>,
    host: String,
    published: watch::Sender<u64>,
    alarm: OutboxAlarm,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(200);
    let mut atomic = Atomic::default();
    loop {
        let before = *published.borrow();
        match publish_all(&link, &log, &host, &published, &mut atomic, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                if *published.borrow() > before {
                    // It made progress since the last failure: a fresh failure.
                    retry = Duration::from_millis(200);
                }
                if let OutboxError::Batch { .. } = e {
                    // The server would not take a batch (e.g. its limit of open
                    // batches per stream, 50 by default, with many hosts at once):
                    // go on at once, one record at a time.
                    tracing::info!(error = %e, "outbox batch refused; publishing one record at a time");
                    continue;
                }
                if let OutboxError::Duplicate { .. } = e {
                    // Without message ids the server has nothing to de-duplicate
                    // against: someone is interfering with the stream.
                    tracing::error!(error = %e, "ALARM: unexpected duplicate publish ack");
                    alarm.set(e.to_string());
                } else {
                    tracing::warn!(error = %capstan_common::report(&e), "outbox paused; retrying");
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
    link: &Link,
    log: &Log,
    host: &str,
    published: &watch::Sender<u64>,
    atomic: &mut Atomic,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let subject = nats_layout::evt_subject(host);
    let (stream, allowed) = link.events().await.map_err(OutboxError::Stream)?;
    atomic.allowed = allowed;
    let own = link.key.own_keys(host);
    let mark = log.mark(MARK).map_err(OutboxError::Log)?;
    let (mut acked, mut last_stream_seq) = resume_point(
        last_on_subject(&stream, &subject, &own).await?,
        mark,
        link.empty_subject_trusted(),
    );
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
        let mut batch = Vec::with_capacity(BATCH);
        for record in log.read_since(acked) {
            let record = record.map_err(OutboxError::Log)?;
            if record.seq > last {
                break;
            }
            let mut body = record.to_json();
            body["host"] = host.into();
            batch.push((record.seq, body.to_string()));
            if batch.len() == BATCH {
                break;
            }
        }
        if batch.len() >= BATCH_MIN && atomic.ready() {
            let sent = send_batch(link, &subject, batch, last_stream_seq).await;
            if let Err(OutboxError::Batch { .. }) = &sent {
                atomic.fail();
            }
            (acked, last_stream_seq) = sent?;
            acknowledged(log, published, acked)?;
        } else {
            // One at a time, every record read (none is read and encoded twice).
            for (seq, body) in batch {
                (acked, last_stream_seq) =
                    send_one(link, &subject, seq, body, last_stream_seq).await?;
                acknowledged(log, published, acked)?;
            }
        }
    }
}

/// Records up to `acked` are in the stream: the log's [`MARK`] moves, and the watch.
fn acknowledged(log: &Log, published: &watch::Sender<u64>, acked: u64) -> Result<(), OutboxError> {
    log.advance_mark(MARK, acked).map_err(OutboxError::Log)?;
    published.send_replace(acked);
    Ok(())
}

/// Test builds only: `CAPSTAN_FAULT_MSG_ID_AT=<seq>:<id>` sends record `seq`, the
/// first time it goes out alone, with `Nats-Msg-Id: <id>`. A test that stored a
/// message under that id first then gets the `duplicate` ack this outbox (which sends
/// no message ids) otherwise never sees, from a real server.
#[cfg(feature = "testing")]
pub const FAULT_MSG_ID_AT: &str = "CAPSTAN_FAULT_MSG_ID_AT";

/// [`FAULT_MSG_ID_AT`]: `headers`, with the message id when it is `seq`'s turn.
#[cfg(feature = "testing")]
fn with_fault_msg_id(mut headers: async_nats::HeaderMap, seq: u64) -> async_nats::HeaderMap {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SENT: AtomicBool = AtomicBool::new(false);
    let Ok(fault) = std::env::var(FAULT_MSG_ID_AT) else {
        return headers;
    };
    let Some((at, id)) = fault.split_once(':') else {
        return headers;
    };
    if at.parse() == Ok(seq) && !SENT.swap(true, Ordering::SeqCst) {
        eprintln!("FAULT {FAULT_MSG_ID_AT}: record {seq} sent with Nats-Msg-Id {id}");
        headers.insert(header::NATS_MESSAGE_ID, id);
    }
    headers
}

/// Publishes one record; its seq and stream sequence.
async fn send_one(
    link: &Link,
    subject: &str,
    seq: u64,
    body: String,
    last_stream_seq: u64,
) -> Result<(u64, u64), OutboxError> {
    let headers = link
        .sign_batch(Publication::Record, &[body.as_bytes()])
        .pop()
        .expect("one member");
    #[cfg(feature = "testing")]
    let headers = with_fault_msg_id(headers, seq);
    let message = jetstream::message::PublishMessage::build()
        .headers(headers)
        .payload(body.into())
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
    let ack = link
        .js
        .send_publish(subject.to_string(), message)
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
    Ok((seq, ack.sequence))
}

/// Publishes `batch` (consecutive records) as one atomic batch: all stored or none.
/// Only the first message carries `Nats-Expected-Last-Subject-Sequence` (the server
/// allows no more), which is enough: the batch is stored only right after record
/// `first - 1`, in one piece. The batch id is random, so no other host can join or
/// break it. The last record's seq and stream sequence.
async fn send_batch(
    link: &Link,
    subject: &str,
    batch: Vec<(u64, String)>,
    last_stream_seq: u64,
) -> Result<(u64, u64), OutboxError> {
    let (first, last, size) = (batch[0].0, batch[batch.len() - 1].0, batch.len());
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| OutboxError::Batch {
        first,
        last,
        source,
    };
    let id = batch_id().map_err(|e| failed(e.into()))?;
    let js = &link.js;
    let client = js.client();
    let mut commit = None;
    // One signature for the whole batch, each record with its proof.
    let bodies: Vec<&[u8]> = batch.iter().map(|(_, b)| b.as_bytes()).collect();
    let signed = link.sign_batch(Publication::Record, &bodies);
    for (i, ((_, body), mut headers)) in batch.into_iter().zip(signed).enumerate() {
        headers.insert(header::NATS_BATCH_ID, id.as_str());
        headers.insert(header::NATS_BATCH_SEQUENCE, (i + 1).to_string().as_str());
        if i == 0 {
            headers.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                last_stream_seq.to_string().as_str(),
            );
        }
        if i + 1 < size {
            client
                .publish_with_headers(subject.to_string(), headers, body.into())
                .await
                .map_err(|e| failed(e.into()))?;
        } else {
            headers.insert(header::NATS_BATCH_COMMIT, "1");
            let message = jetstream::message::PublishMessage::build()
                .headers(headers)
                .payload(body.into());
            commit = Some(
                js.send_publish(subject.to_string(), message)
                    .await
                    .map_err(|e| failed(e.into()))?,
            );
        }
    }
    let ack = match commit.expect("a batch has a last record").await {
        Ok(ack) => ack,
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
            return Err(OutboxError::Moved {
                seq: first,
                source: e.into(),
            })
        }
        Err(e) => return Err(failed(e.into())),
    };
    if ack.duplicate {
        return Err(OutboxError::Duplicate {
            seq: last,
            stream_seq: ack.sequence,
        });
    }
    let stored = ack.batch_size.unwrap_or(0);
    if stored != size as u64 {
        return Err(failed(
            format!("the server stored {stored} of {size} records").into(),
        ));
    }
    Ok((last, ack.sequence))
}

/// 32 random hex digits.
fn batch_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes)?;
    Ok(capstan_common::signing::to_hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::resume_point;

    #[test]
    fn where_the_outbox_resumes() {
        // Its own record at or past the mark: after it.
        assert_eq!(resume_point(Some((Some(9), 40)), 7, true), (9, 40));
        // Junk, a replay or someone else's record last: after it, from the mark.
        assert_eq!(resume_point(Some((None, 41)), 7, true), (7, 41));
        assert_eq!(resume_point(Some((Some(3), 42)), 7, true), (7, 42));
        // Empty: the whole log, where the server can be believed or nothing was
        // acknowledged yet; else from the mark.
        assert_eq!(resume_point(None, 7, true), (0, 0));
        assert_eq!(resume_point(None, 0, false), (0, 0));
        assert_eq!(resume_point(None, 7, false), (7, 0));
    }
}
