//! The write path: an append sealed, written (chunks, index entries, then the tip) and
//! folded into the intent, a due snapshot, and the wait for it to be durable.

use super::records::Records;
use super::{codec, postings, query, snapshot, tip, Fold, Log, LogError};

impl<F: Fold> Log<F> {
    /// Appends events in order, in one atomic write, folding them into the intent.
    /// Not yet durable: await [`Log::durable`] with the returned seq (or use
    /// [`Log::append_durable`]) before telling anyone.
    pub fn append(&self, events: &[F::Entry]) -> Result<u64, LogError> {
        self.append_at(events, chrono::Utc::now().timestamp_millis())
    }

    /// [`Log::append`] with the records' time given (the wall clock's, or a test's).
    pub(crate) fn append_at(&self, events: &[F::Entry], at_ms: i64) -> Result<u64, LogError> {
        if let Some(c) = self.degraded() {
            return Err(LogError::Degraded(c.clone()));
        }
        // After a failed flush nothing is durable: writing more would only grow what a
        // crash loses, and what a reader might take for recorded.
        if let Some(reason) = self.flush_failed() {
            return Err(LogError::Flush(reason));
        }
        let mut tail = self.tail.lock().expect("log lock");
        let mut writes = Vec::with_capacity(events.len());
        let (mut seq, mut prev) = (tail.next_seq, tail.last_hash);
        for event in events {
            let (bytes, hash) =
                codec::seal_record(seq, at_ms, prev, event).map_err(LogError::Encode)?;
            writes.push((seq, bytes, query::IndexKeys::of(seq, at_ms, event)));
            prev = hash;
            seq += 1;
        }
        // Plain writes, in order, the tip last (see [`tip`]): chunks, index entries.
        // Each chunk and each list is read and written once, however many of the
        // batch's records it takes.
        let write = || -> Result<(), sled::Error> {
            let chunks = self.records.tree();
            let sealed: Vec<(u64, &[u8])> = writes.iter().map(|(s, b, _)| (*s, &b[..])).collect();
            Records::push(chunks, &sealed)?;
            let mut by_command = postings::Entries::new(8);
            let mut by_workload = postings::Entries::new(8);
            let mut by_time = postings::Entries::new(16);
            for (seq, _, index) in &writes {
                let seq_bytes = seq.to_be_bytes();
                if let Some(key) = &index.command {
                    by_command.add(key, &seq_bytes);
                }
                if let Some(key) = &index.workload {
                    by_workload.add(key, &seq_bytes);
                }
                by_time.add(&index.minute, &index.time_entry);
            }
            by_command.push(&self.by_command)?;
            by_workload.push(&self.by_workload)?;
            by_time.push(&self.by_time)?;
            tip::write(&self.db, seq - 1)
        };
        if let Err(e) = write() {
            // Part of the append may be written: nothing more is, until a restart
            // cuts it back to the tip.
            self.flusher.fail(format!("an append failed to write: {e}"));
            return Err(LogError::Storage(e));
        }
        // Written: fold in place (no copy of the intent on the write path).
        let last = seq - 1;
        for (event, (seq, ..)) in events.iter().zip(&writes) {
            tail.intent.apply(*seq, event);
        }
        tail.next_seq = seq;
        tail.last_hash = prev;
        tail.since_snapshot += events.len() as u64;
        if self.options.snapshot_due(tail.since_snapshot, &tail.intent) {
            // Anchored to the batch's last record, after its tip: a snapshot lost to
            // a crash only lengthens the next replay.
            snapshot::write(&self.snapshots, last, prev, &tail.intent)?;
            tail.since_snapshot = 0;
        }
        self.flusher.written(last);
        drop(tail);
        // Writers race from here: keep the maximum, so the watched seq never goes
        // back and always ends at the last record (a follower waiting on it would
        // otherwise miss the newest record until the next append).
        self.appended.send_if_modified(|seen| {
            let newer = last > *seen;
            if newer {
                *seen = last;
            }
            newer
        });
        Ok(last)
    }

    /// Waits until every record up to `seq` is on disk. Concurrent callers share one
    /// flush (group commit).
    pub async fn durable(&self, seq: u64) -> Result<(), LogError> {
        self.flusher
            .durable(seq, None)
            .await
            .map_err(LogError::Flush)
    }

    /// [`Log::append`], then [`Log::durable`]. While this writer is between the two,
    /// the flusher holds its next flush for it, so concurrent writers share flushes;
    /// concurrent writers' appends are combined into one write (see [`combine`](super::combine)).
    pub async fn append_durable(&self, events: &[F::Entry]) -> Result<u64, LogError> {
        let arriving = self.flusher.arriving();
        let seq = self.append_combined(events).await?;
        self.flusher
            .durable(seq, Some(arriving))
            .await
            .map_err(LogError::Flush)?;
        Ok(seq)
    }

    /// How many flushes have run since open (for metrics and benchmarks).
    pub fn flushes(&self) -> u64 {
        self.flusher.flushes()
    }
}
