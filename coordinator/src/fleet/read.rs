//! Reading a host's subject of `CAPSTAN_EVT` to its end, through a short-lived
//! consumer. A read that cannot complete is an error, never a shorter answer.
//!
//! async-nats' `fetch` is a pull that does not wait (`no_wait`): the server answers
//! at once, and a `404 No Messages` (or a `408` when the pull expires) ends the batch
//! without an error. Taking such an empty batch for the end of the subject turned a
//! read on a busy server into an empty audit log printed as the truth. Now an empty
//! batch while the consumer still has messages pending is retried with a pull that
//! waits (`batch`, up to 2 s), and after [`EMPTY_FETCHES`] empty ones the read fails.
//!
//! Each pull asks for at most [`PAGE_MESSAGES`] messages and [`PAGE_BYTES`] bytes, and
//! the next only once its page is in: a read never has more than a page in flight on
//! the coordinator's one connection. A read of 256 records of up to 512 KiB each in
//! one pull pushed that connection into slow-consumer disconnects, and the messages
//! lost on the way were skipped (the consumer acknowledges nothing, so it had moved
//! past them): a command's status was answered 200 with 181 of its 300 events. Now
//! every message's consumer sequence must follow the one before: a message lost on
//! the way fails the read ([`FleetError::Nats`], 503 `nats_error`), it is never left
//! out of the answer.

use super::FleetError;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use serde_json::Value;
use std::time::Duration;

/// How many fetches in a row may come back empty while the consumer still has
/// messages pending before the read fails.
const EMPTY_FETCHES: u32 = 3;
/// The most messages one pull asks for.
pub(super) const PAGE_MESSAGES: usize = 256;
/// The most bytes one pull asks for: above the largest message `CAPSTAN_EVT` takes
/// (`capstan_common::nats::MAX_MESSAGE_BYTES`, 512 KiB), so a page holds at least one.
pub(super) const PAGE_BYTES: usize = 1024 * 1024;

/// One message as a fetch delivered it.
pub(super) struct Delivered {
    /// Its consumer sequence: 1 for the consumer's first message, then one more each.
    pub(super) seq: u64,
    /// The size of its payload.
    pub(super) bytes: usize,
    /// Its payload, if JSON.
    pub(super) value: Option<Value>,
}

/// Where the messages come from: a consumer, or a test's script.
pub(super) trait Source {
    /// How many messages are still to be delivered.
    async fn pending(&mut self) -> Result<u64, FleetError>;
    /// Up to `max` messages and `max_bytes` bytes of them. `wait`: the server waits
    /// for messages (up to its expiry) instead of answering at once.
    async fn fetch(
        &mut self,
        max: usize,
        max_bytes: usize,
        wait: bool,
    ) -> Result<Vec<Delivered>, FleetError>;
}

/// How far a read may go: at most `records` kept, at most `bytes` read (kept or
/// not; `None`: no bound).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) records: usize,
    pub(super) bytes: Option<u64>,
}

/// Where a read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// At the message `last` accepted.
    Last,
    /// At the end of the subject, without one.
    Subject,
    /// With `records` kept.
    Records,
}

/// Reads every pending message, keeping those `keep` accepts, within `bounds`, and
/// none after the first that `last` accepts. More than `bounds.bytes` read before the
/// end is [`FleetError::Unreadable`]; a message missing on the way (its consumer
/// sequence skipped) is [`FleetError::Nats`]: never fewer messages than were there.
///
/// A host's records enter its subject in seq order, so a record whose `seq` is no
/// greater than one read before it is a replay — one of the host's own signed records
/// put there again by whoever holds its NATS credentials: it is skipped, never kept
/// nor taken for the `last` (and logged).
pub(super) async fn read_all(
    source: &mut impl Source,
    subject: &str,
    keep: impl Fn(&Value) -> bool,
    last: impl Fn(&Value) -> bool,
    bounds: Bounds,
) -> Result<(Vec<Value>, End), FleetError> {
    let mut remaining = source.pending().await?;
    let (mut read, mut bytes, mut empty) = (0u64, 0u64, 0);
    let (mut highest, mut replays) = (0u64, 0u64);
    let mut out = Vec::new();
    while remaining > 0 {
        if out.len() >= bounds.records {
            return Ok((out, End::Records));
        }
        let max = usize::try_from(remaining).map_or(PAGE_MESSAGES, |r| r.min(PAGE_MESSAGES));
        let page = source.fetch(max, PAGE_BYTES, empty > 0).await?;
        if page.is_empty() {
            // Not the end of the subject unless the consumer says so.
            remaining = source.pending().await?;
            empty += 1;
            if remaining > 0 && empty >= EMPTY_FETCHES {
                return Err(FleetError::Nats(format!(
                    "the read of {subject} stopped early: {read} messages read, {remaining} still pending"
                )));
            }
            continue;
        }
        empty = 0;
        remaining = remaining.saturating_sub(page.len() as u64);
        for m in page {
            if m.seq != read + 1 {
                return Err(FleetError::Nats(format!(
                    "the read of {subject} lost messages on the way (delivery {} came after {read}; \
                     a slow consumer?): the answer would miss some",
                    m.seq
                )));
            }
            read += 1;
            bytes += m.bytes as u64;
            if let Some(budget) = bounds.bytes.filter(|b| bytes > *b) {
                return Err(FleetError::Unreadable(format!(
                    "the read of {subject} took more than its budget of {budget} bytes \
                     ({read} messages) before its end"
                )));
            }
            let Some(v) = m.value else { continue };
            if let Some(seq) = v["seq"].as_u64() {
                if seq <= highest {
                    replays += 1;
                    if replays == 1 {
                        tracing::warn!(
                            subject,
                            seq,
                            after = highest,
                            "a record read again after a later one (a replay): refused"
                        );
                    }
                    continue;
                }
                highest = seq;
            }
            let end = last(&v);
            if keep(&v) && out.len() < bounds.records {
                out.push(v);
            }
            if end {
                return Ok((out, End::Last));
            }
        }
    }
    Ok((out, End::Subject))
}

/// A consumer whose every message must pass `check` (its payload and its
/// signature header) before it counts.
struct Consumer<C> {
    consumer: jetstream::consumer::PullConsumer,
    check: C,
}

impl<C: Fn(&[u8], Option<&async_nats::HeaderMap>) -> Result<(), FleetError>> Source
    for Consumer<C>
{
    async fn pending(&mut self) -> Result<u64, FleetError> {
        Ok(self
            .consumer
            .info()
            .await
            .map_err(FleetError::nats)?
            .num_pending)
    }

    async fn fetch(
        &mut self,
        max: usize,
        max_bytes: usize,
        wait: bool,
    ) -> Result<Vec<Delivered>, FleetError> {
        let expires = Duration::from_secs(2);
        let batch = if wait {
            self.consumer
                .batch()
                .max_messages(max)
                .max_bytes(max_bytes)
                .expires(expires)
                .messages()
                .await
        } else {
            self.consumer
                .fetch()
                .max_messages(max)
                .max_bytes(max_bytes)
                .expires(expires)
                .messages()
                .await
        };
        let mut batch = batch.map_err(FleetError::nats)?;
        let mut page = Vec::new();
        while let Some(m) = batch.next().await {
            let m = match m {
                Ok(m) => m,
                // The server ends a page that reached `max_bytes` with a 409 status:
                // the end of the page, not a failure (a lost message would show as a
                // gap in the consumer sequences).
                Err(e) if e.to_string().contains("Exceeds MaxBytes") => break,
                Err(e) => return Err(FleetError::nats(e)),
            };
            let seq = m.info().map_err(FleetError::nats)?.consumer_sequence;
            (self.check)(&m.payload, m.headers.as_ref())?;
            page.push(Delivered {
                seq,
                bytes: m.payload.len(),
                value: serde_json::from_slice::<Value>(&m.payload).ok(),
            });
        }
        Ok(page)
    }
}

/// Reads the messages of `subject` from stream sequence `from` to the current end (or
/// to the first that `last` accepts) through a short-lived consumer, keeping those
/// `keep` accepts, within `bounds` ([`read_all`]); where it ended. Every message must
/// pass `check` (the host's signature), or the read fails.
pub(super) async fn read_subject(
    stream: &stream::Stream,
    subject: &str,
    from: u64,
    keep: impl Fn(&Value) -> bool,
    last: impl Fn(&Value) -> bool,
    bounds: Bounds,
    check: impl Fn(&[u8], Option<&async_nats::HeaderMap>) -> Result<(), FleetError>,
) -> Result<(Vec<Value>, End), FleetError> {
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subject.to_string(),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ack_policy: jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(FleetError::nats)?;
    let name = consumer.cached_info().name.clone();
    let mut source = Consumer { consumer, check };
    let result = read_all(&mut source, subject, keep, last, bounds).await;
    let _ = stream.delete_consumer(&name).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A consumer with `pending` messages whose fetches return `pages` in turn, each
    /// message numbered by its delivery (or as a page says, to play a lost one).
    struct Script {
        pending: u64,
        pages: std::collections::VecDeque<Vec<Value>>,
        delivered: u64,
        /// Deliveries that never arrive (lost on the way).
        lost: Vec<u64>,
        /// Each fetch: whether it asked the server to wait, and its byte bound.
        asked: Vec<(bool, usize)>,
    }

    impl Script {
        fn new(pending: u64, pages: Vec<Vec<Value>>) -> Script {
            Script {
                pending,
                pages: pages.into(),
                delivered: 0,
                lost: Vec::new(),
                asked: Vec::new(),
            }
        }
    }

    impl Source for Script {
        async fn pending(&mut self) -> Result<u64, FleetError> {
            Ok(self.pending)
        }
        async fn fetch(
            &mut self,
            max: usize,
            max_bytes: usize,
            wait: bool,
        ) -> Result<Vec<Delivered>, FleetError> {
            self.asked.push((wait, max_bytes));
            let page: Vec<Value> = self.pages.pop_front().unwrap_or_default();
            assert!(page.len() <= max);
            self.pending -= page.len() as u64;
            let mut out = Vec::new();
            for v in page {
                self.delivered += 1;
                while self.lost.contains(&self.delivered) {
                    self.delivered += 1;
                }
                out.push(Delivered {
                    seq: self.delivered,
                    bytes: v.to_string().len(),
                    value: Some(v),
                });
            }
            Ok(out)
        }
    }

    fn records(seqs: std::ops::RangeInclusive<u64>) -> Vec<Value> {
        seqs.map(|seq| json!({"seq": seq})).collect()
    }

    const ALL: Bounds = Bounds {
        records: 1000,
        bytes: None,
    };
    const SUBJECT: &str = "capstan.v1.evt.h1";

    #[tokio::test]
    async fn a_fetch_that_ends_early_is_an_error_not_an_empty_log() {
        // Nine records pending, and the fetches come back empty (a busy server).
        let mut source = Script::new(9, vec![]);
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, ALL).await;
        match read {
            Err(FleetError::Nats(message)) => {
                assert!(
                    message.contains("0 messages read, 9 still pending"),
                    "{message}"
                )
            }
            other => panic!("an incomplete read answered {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_empty_fetch_between_pages_is_retried() {
        let mut source = Script::new(9, vec![records(1..=4), vec![], records(5..=9)]);
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, ALL)
            .await
            .unwrap();
        assert_eq!(read, (records(1..=9), End::Subject));
        // After the empty answer, the pull waits for the server; every pull is a
        // bounded page.
        let asked = [(false, PAGE_BYTES), (false, PAGE_BYTES), (true, PAGE_BYTES)];
        assert_eq!(source.asked, asked);
    }

    /// Given a read whose connection lost messages on the way (a slow consumer: the
    /// consumer, acknowledging nothing, moved past them), when the next ones arrive,
    /// then the read fails: it never answers the rest as the whole.
    #[tokio::test]
    async fn a_message_lost_on_the_way_fails_the_read_rather_than_shortening_it() {
        let mut source = Script::new(9, vec![records(1..=4), records(6..=9)]);
        source.lost = vec![5];
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, ALL).await;
        match read {
            Err(FleetError::Nats(message)) => {
                assert!(message.contains("delivery 6 came after 4"), "{message}")
            }
            other => panic!("a read with a gap answered {other:?}"),
        }
    }

    /// Given a read bounded by bytes, when the messages read take more before its
    /// end, then it fails (`Unreadable`) instead of answering what it read so far.
    #[tokio::test]
    async fn a_read_past_its_byte_budget_fails_rather_than_answering_a_part() {
        let one = json!({"seq": 1}).to_string().len() as u64;
        let budget = Bounds {
            records: 1000,
            bytes: Some(3 * one),
        };
        let mut source = Script::new(9, vec![records(1..=9)]);
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, budget).await;
        match read {
            Err(FleetError::Unreadable(message)) => {
                assert!(message.contains("(4 messages)"), "{message}")
            }
            other => panic!("a read over its budget answered {other:?}"),
        }
        // Within it, the read is whole.
        let mut source = Script::new(3, vec![records(1..=3)]);
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, budget).await;
        assert_eq!(read.unwrap(), (records(1..=3), End::Subject));
    }

    #[tokio::test]
    async fn a_read_ends_at_the_last_wanted_message() {
        let mut source = Script::new(9, vec![records(1..=4), records(5..=9)]);
        let read = read_all(
            &mut source,
            SUBJECT,
            |v| v["seq"].as_u64() != Some(2),
            |v| v["seq"].as_u64() == Some(3),
            ALL,
        )
        .await
        .unwrap();
        assert_eq!(
            read,
            (vec![json!({"seq": 1}), json!({"seq": 3})], End::Last)
        );
        // The second page was never fetched.
        assert_eq!(source.asked.len(), 1);
    }

    /// Given a subject where older records of the host were put again after later
    /// ones (replays), when it is read, then each record is kept once, in order, and a
    /// replay is kept by no filter.
    #[tokio::test]
    async fn a_replayed_record_is_skipped_never_kept_again() {
        let mut pages = vec![records(1..=4), records(2..=3), records(5..=6)];
        pages[1].push(json!({"seq": 4}));
        let mut source = Script::new(9, pages.clone());
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, ALL)
            .await
            .unwrap();
        assert_eq!(read, (records(1..=6), End::Subject));
        // A replay is not kept even where `keep` would take its record (4, again).
        let mut source = Script::new(9, pages);
        let read = read_all(
            &mut source,
            SUBJECT,
            |v| v["seq"].as_u64() > Some(3),
            |v| v["seq"].as_u64() == Some(6),
            ALL,
        )
        .await
        .unwrap();
        assert_eq!(read, (records(4..=6), End::Last));
    }

    #[tokio::test]
    async fn nothing_pending_is_an_empty_answer() {
        let mut source = Script::new(0, vec![]);
        let read = read_all(&mut source, SUBJECT, |_| true, |_| false, ALL)
            .await
            .unwrap();
        assert_eq!(read, (vec![], End::Subject));
    }
}
