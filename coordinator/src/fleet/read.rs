//! Reading a host's subject of `CAPSTAN_EVT` to its end, through a short-lived
//! consumer. A read that cannot complete is an error, never a shorter answer.
//!
//! async-nats' `fetch` is a pull that does not wait (`no_wait`): the server answers
//! at once, and a `404 No Messages` (or a `408` when the pull expires) ends the batch
//! without an error. Taking such an empty batch for the end of the subject turned a
//! read on a busy server into an empty audit log printed as the truth. Now an empty
//! batch while the consumer still has messages pending is retried with a pull that
//! waits (`batch`, up to 2 s), and after [`EMPTY_FETCHES`] empty ones the read fails.

use super::FleetError;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use serde_json::Value;
use std::time::Duration;

/// How many fetches in a row may come back empty while the consumer still has
/// messages pending before the read fails.
const EMPTY_FETCHES: u32 = 3;

/// Where the messages come from: a consumer, or a test's script.
pub(super) trait Source {
    /// How many messages are still to be delivered.
    async fn pending(&mut self) -> Result<u64, FleetError>;
    /// Up to `max` messages: how many arrived, and those that are JSON. `wait`: the
    /// server waits for messages (up to its expiry) instead of answering at once.
    async fn fetch(&mut self, max: usize, wait: bool) -> Result<(u64, Vec<Value>), FleetError>;
}

/// Reads every pending message, keeping those `keep` accepts, at most `limit`, and
/// none after the first that `last` accepts.
pub(super) async fn read_all(
    source: &mut impl Source,
    subject: &str,
    keep: impl Fn(&Value) -> bool,
    last: impl Fn(&Value) -> bool,
    limit: usize,
) -> Result<Vec<Value>, FleetError> {
    let mut remaining = source.pending().await?;
    let (mut read, mut empty) = (0u64, 0);
    let mut out = Vec::new();
    while remaining > 0 && out.len() < limit {
        let (got, page) = source
            .fetch(
                usize::try_from(remaining.min(256)).unwrap_or(256),
                empty > 0,
            )
            .await?;
        if got == 0 {
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
        read += got;
        remaining = remaining.saturating_sub(got);
        for v in page {
            let end = last(&v);
            if keep(&v) && out.len() < limit {
                out.push(v);
            }
            if end {
                return Ok(out);
            }
        }
    }
    Ok(out)
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

    async fn fetch(&mut self, max: usize, wait: bool) -> Result<(u64, Vec<Value>), FleetError> {
        let expires = Duration::from_secs(2);
        let batch = if wait {
            self.consumer
                .batch()
                .max_messages(max)
                .expires(expires)
                .messages()
                .await
        } else {
            self.consumer
                .fetch()
                .max_messages(max)
                .expires(expires)
                .messages()
                .await
        };
        let mut batch = batch.map_err(FleetError::nats)?;
        let (mut got, mut page) = (0, Vec::new());
        while let Some(m) = batch.next().await {
            let m = m.map_err(FleetError::nats)?;
            got += 1;
            (self.check)(&m.payload, m.headers.as_ref())?;
            if let Ok(v) = serde_json::from_slice::<Value>(&m.payload) {
                page.push(v);
            }
        }
        Ok((got, page))
    }
}

/// Reads the messages of `subject` from stream sequence `from` to the current end (or
/// to the first that `last` accepts) through a short-lived consumer, keeping those
/// `keep` accepts, at most `limit`. Every message must pass `check` (the host's
/// signature), or the read fails.
pub(super) async fn read_subject(
    stream: &stream::Stream,
    subject: &str,
    from: u64,
    keep: impl Fn(&Value) -> bool,
    last: impl Fn(&Value) -> bool,
    limit: usize,
    check: impl Fn(&[u8], Option<&async_nats::HeaderMap>) -> Result<(), FleetError>,
) -> Result<Vec<Value>, FleetError> {
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
    let result = read_all(&mut source, subject, keep, last, limit).await;
    let _ = stream.delete_consumer(&name).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A consumer with `pending` messages whose fetches return `pages` in turn.
    struct Script {
        pending: u64,
        pages: std::collections::VecDeque<Vec<Value>>,
        /// Whether each fetch asked the server to wait.
        waits: Vec<bool>,
    }

    impl Source for Script {
        async fn pending(&mut self) -> Result<u64, FleetError> {
            Ok(self.pending)
        }
        async fn fetch(&mut self, max: usize, wait: bool) -> Result<(u64, Vec<Value>), FleetError> {
            self.waits.push(wait);
            let page: Vec<Value> = self.pages.pop_front().unwrap_or_default();
            assert!(page.len() <= max);
            self.pending -= page.len() as u64;
            Ok((page.len() as u64, page))
        }
    }

    fn records(seqs: std::ops::RangeInclusive<u64>) -> Vec<Value> {
        seqs.map(|seq| json!({"seq": seq})).collect()
    }

    #[tokio::test]
    async fn a_fetch_that_ends_early_is_an_error_not_an_empty_log() {
        // Nine records pending, and the fetches come back empty (a busy server).
        let mut source = Script {
            pending: 9,
            pages: Default::default(),
            waits: Vec::new(),
        };
        let read = read_all(&mut source, "capstan.v1.evt.h1", |_| true, |_| false, 1000).await;
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
        let mut source = Script {
            pending: 9,
            pages: [records(1..=4), vec![], records(5..=9)].into(),
            waits: Vec::new(),
        };
        let read = read_all(&mut source, "capstan.v1.evt.h1", |_| true, |_| false, 1000)
            .await
            .unwrap();
        assert_eq!(read, records(1..=9));
        // After the empty answer, the pull waits for the server.
        assert_eq!(source.waits, [false, false, true]);
    }

    #[tokio::test]
    async fn a_read_ends_at_the_last_wanted_message() {
        let mut source = Script {
            pending: 9,
            pages: [records(1..=4), records(5..=9)].into(),
            waits: Vec::new(),
        };
        let read = read_all(
            &mut source,
            "capstan.v1.evt.h1",
            |v| v["seq"].as_u64() != Some(2),
            |v| v["seq"].as_u64() == Some(3),
            1000,
        )
        .await
        .unwrap();
        assert_eq!(read, [json!({"seq": 1}), json!({"seq": 3})]);
        // The second page was never fetched.
        assert_eq!(source.waits, [false]);
    }

    #[tokio::test]
    async fn nothing_pending_is_an_empty_answer() {
        let mut source = Script {
            pending: 0,
            pages: Default::default(),
            waits: Vec::new(),
        };
        let read = read_all(&mut source, "capstan.v1.evt.h1", |_| true, |_| false, 1000)
            .await
            .unwrap();
        assert!(read.is_empty());
    }
}
