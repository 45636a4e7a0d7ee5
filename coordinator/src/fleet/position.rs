//! Where a host's records after seq N begin in `CAPSTAN_EVT`, found by bisection over
//! stream sequences with direct gets ("the host's next message at or after stream
//! sequence p"), not by reading what comes before: about log2(stream length) gets,
//! however long the host's history is.
//!
//! It works because a host's records enter the stream in seq order (the outbox
//! publishes record n only right after record n - 1), so along the stream the host's
//! record seqs only grow — unless whoever holds the host's NATS credentials puts an
//! older record of the host's again (a replay): a probe that lands on it can send the
//! bisection past records it wants. A read from the start found here therefore checks
//! what it got ([`whole_after`], [`last_seq`]) and reads from the stream's start when
//! the bisection was misled.

use super::FleetError;
use async_nats::jetstream::stream;

/// What bisection needs from the stream: its sequence range and the host's next
/// message from a point, as `(stream sequence, record seq)`.
pub(super) trait Probe {
    async fn range(&mut self) -> Result<(u64, u64), FleetError>;
    async fn next_from(&mut self, stream_seq: u64) -> Result<Option<(u64, u64)>, FleetError>;
}

/// The stream sequence to read `subject` from to get its records with seq > `since`:
/// the smallest `p` such that the subject's first message at or after `p` has a
/// record seq > `since` (or there is none).
pub(super) async fn start_of(
    stream: &stream::Stream,
    subject: &str,
    since: u64,
) -> Result<u64, FleetError> {
    if since == 0 {
        return Ok(1);
    }
    bisect(&mut Direct { stream, subject }, since).await
}

/// Whether `records` (each with a `seq`) are the host's records right after
/// `since`, none left out: `since + 1`, `since + 2`, … A read from a start that a
/// replay misled begins later, or skips some.
pub(super) fn whole_after(since: u64, records: &[serde_json::Value]) -> bool {
    records.iter().zip(1..).all(|(r, i)| {
        let want = since.checked_add(i);
        want.is_some() && r["seq"].as_u64() == want
    })
}

/// The record seq of the last message on `subject`, if any.
pub(super) async fn last_seq(
    stream: &stream::Stream,
    subject: &str,
) -> Result<Option<u64>, FleetError> {
    match stream.direct_get_last_for_subject(subject).await {
        Ok(m) => Ok(record_seq(&m.payload)),
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
        Err(e) => Err(FleetError::nats(e)),
    }
}

/// The record seq of a message of `CAPSTAN_EVT` (its JSON's `seq`).
fn record_seq(payload: &[u8]) -> Option<u64> {
    let record: serde_json::Value = serde_json::from_slice(payload).ok()?;
    record["seq"].as_u64()
}

pub(super) async fn bisect(probe: &mut impl Probe, since: u64) -> Result<u64, FleetError> {
    let (first, last) = probe.range().await?;
    let (mut lo, mut hi) = (first.max(1), last.saturating_add(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match probe.next_from(mid).await? {
            Some((at, seq)) if seq <= since => lo = at + 1,
            // The first wanted record is at or before `at`: no later than `mid`'s
            // answer, and no earlier than `mid` could tell.
            _ => hi = mid,
        }
    }
    Ok(lo)
}

struct Direct<'a> {
    stream: &'a stream::Stream,
    subject: &'a str,
}

impl Probe for Direct<'_> {
    async fn range(&mut self) -> Result<(u64, u64), FleetError> {
        let info = self.stream.get_info().await.map_err(FleetError::nats)?;
        Ok((info.state.first_sequence, info.state.last_sequence))
    }

    async fn next_from(&mut self, stream_seq: u64) -> Result<Option<(u64, u64)>, FleetError> {
        match self
            .stream
            .direct_get_next_for_subject(self.subject, Some(stream_seq))
            .await
        {
            Ok(m) => {
                let seq = record_seq(&m.payload).ok_or_else(|| {
                    FleetError::Nats(format!(
                        "{} message {} has no record seq",
                        self.subject, m.sequence
                    ))
                })?;
                Ok(Some((m.sequence, seq)))
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(FleetError::nats(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of `len` messages where the host's records sit at `positions`
    /// (record seq i + 1 at positions[i]); counts the probes.
    struct Stream {
        first: u64,
        len: u64,
        positions: Vec<u64>,
        probes: u32,
    }

    impl Probe for Stream {
        async fn range(&mut self) -> Result<(u64, u64), FleetError> {
            Ok((self.first, self.len))
        }
        async fn next_from(&mut self, p: u64) -> Result<Option<(u64, u64)>, FleetError> {
            self.probes += 1;
            Ok(self
                .positions
                .iter()
                .enumerate()
                .find(|(_, at)| **at >= p)
                .map(|(i, at)| (*at, i as u64 + 1)))
        }
    }

    /// A host's records interleaved with others': every third message, from 5.
    fn interleaved(records: u64) -> Stream {
        let positions: Vec<u64> = (0..records).map(|i| 5 + 3 * i).collect();
        Stream {
            first: 1,
            len: positions.last().copied().unwrap_or(0) + 7,
            positions,
            probes: 0,
        }
    }

    #[tokio::test]
    async fn the_start_is_the_first_record_after_since() {
        for since in [1, 2, 17, 99] {
            let mut stream = interleaved(100);
            let from = bisect(&mut stream, since).await.unwrap();
            // Reading from `from`, the host's first record is since + 1.
            let first = stream.next_from(from).await.unwrap().unwrap();
            assert_eq!(first.1, since + 1, "since {since}");
            // Nothing of the host between since's record and `from`.
            assert!(from > stream.positions[since as usize - 1]);
        }
    }

    #[tokio::test]
    async fn past_the_last_record_the_start_is_the_end() {
        let mut stream = interleaved(100);
        let from = bisect(&mut stream, 100).await.unwrap();
        assert_eq!(stream.next_from(from).await.unwrap(), None);
        let mut stream = interleaved(100);
        let from = bisect(&mut stream, 5000).await.unwrap();
        assert_eq!(stream.next_from(from).await.unwrap(), None);
    }

    #[tokio::test]
    async fn older_records_aged_out_start_at_the_first_kept() {
        let mut stream = interleaved(100);
        // Records 1..=10 are gone: the stream starts after them.
        stream.first = stream.positions[10];
        stream.positions.iter_mut().take(10).for_each(|p| *p = 0);
        let from = bisect(&mut stream, 3).await.unwrap();
        assert_eq!(stream.next_from(from).await.unwrap().unwrap().1, 11);
    }

    /// Given the host's records 1..=10, then record 3 put again (a replay), then its
    /// records 11..=20, when the start after 5 is looked for, then the bisection can
    /// land past records 6..=10 — and a read from there is seen not to be whole.
    #[tokio::test]
    async fn a_replay_can_mislead_the_bisection_and_the_read_shows_it() {
        struct Replayed(Vec<u64>);
        impl Probe for Replayed {
            async fn range(&mut self) -> Result<(u64, u64), FleetError> {
                Ok((1, self.0.len() as u64))
            }
            async fn next_from(&mut self, p: u64) -> Result<Option<(u64, u64)>, FleetError> {
                let at = p.max(1) as usize - 1;
                Ok(self.0.get(at).map(|seq| (p.max(1), *seq)))
            }
        }
        let seqs: Vec<u64> = (1..=10).chain([3]).chain(11..=20).collect();
        let from = bisect(&mut Replayed(seqs.clone()), 5).await.unwrap();
        assert_eq!(from, 12, "misled past records 6..=10");
        let read: Vec<serde_json::Value> = seqs[from as usize - 1..]
            .iter()
            .map(|seq| serde_json::json!({ "seq": seq }))
            .collect();
        assert!(!whole_after(5, &read));
        let from_start: Vec<serde_json::Value> = (6..=20)
            .map(|seq| serde_json::json!({ "seq": seq }))
            .collect();
        assert!(whole_after(5, &from_start));
        assert!(whole_after(5, &[]));
        // No record comes after the last seq there can be.
        assert!(whole_after(u64::MAX, &[]));
        assert!(!whole_after(u64::MAX, &[serde_json::json!({ "seq": 0 })]));
    }

    #[tokio::test]
    async fn the_probes_grow_with_the_log_of_the_stream() {
        let mut small = interleaved(1_000);
        bisect(&mut small, 500).await.unwrap();
        let mut large = interleaved(1_000_000);
        bisect(&mut large, 500_000).await.unwrap();
        assert!(small.probes <= 13, "{} probes", small.probes);
        assert!(large.probes <= 23, "{} probes", large.probes);
    }
}
