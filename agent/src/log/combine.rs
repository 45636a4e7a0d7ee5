//! Combining concurrent durable appends into one write.
//!
//! Why: sled's `flush` holds its global concurrency-control lock (shared) for the whole
//! fsync, and every transaction — each append is one, records and indexes together —
//! takes that lock exclusively. So no append can commit while a flush runs: with one
//! transaction per writer, writers queued behind a flush commit one at a time after it
//! (each blocking a runtime thread meanwhile), and appends and flushes alternate. Raw
//! sled inserts take the lock shared and overlap the flush, which is the gap the
//! `log-append` benchmark measured (docs/benchmarks.md, issue 14).
//!
//! How: [`Log::append_combined`] queues the writer's events and tries to lead. The
//! leader takes everything queued, appends it as **one** batch (one transaction, each
//! writer's events still contiguous and atomic), hands each writer its last seq, and
//! goes on while more has queued (writers that arrived while it waited for the lock).
//! A writer that cannot lead waits for its seq without holding a thread. After the
//! leader lets go it looks once more, so nothing queued is left behind. Before each
//! batch the leader waits for a running flush to end (its transaction could not
//! commit before then anyway): everything that queued during the flush is then one
//! transaction, not the first arrival's alone and then the rest.

use super::{Log, LogError};
use crate::event::Event;
use std::sync::{Mutex, TryLockError};
use tokio::sync::oneshot;

type Entry = (Vec<Event>, oneshot::Sender<Result<u64, LogError>>);

#[derive(Default)]
pub(super) struct Combiner {
    queue: Mutex<Vec<Entry>>,
    leader: Mutex<()>,
}

impl Log {
    /// [`Log::append`] of `events`, combined with concurrent callers' into one write.
    pub(super) async fn append_combined(&self, events: &[Event]) -> Result<u64, LogError> {
        let (tx, rx) = oneshot::channel();
        self.combiner
            .queue
            .lock()
            .expect("combiner lock")
            .push((events.to_vec(), tx));
        self.lead();
        rx.await.unwrap_or_else(|_| {
            Err(LogError::Flush(
                "the writer appending these records panicked".into(),
            ))
        })
    }

    /// Appends what is queued, unless another writer leads (it will).
    fn lead(&self) {
        loop {
            let leading = match self.combiner.leader.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::WouldBlock) => return,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
            };
            loop {
                // Wait out a running flush first (no transaction commits during one):
                // then the writers that queued meanwhile commit with this one.
                self.flusher.wait_while_flushing();
                let entries =
                    std::mem::take(&mut *self.combiner.queue.lock().expect("combiner lock"));
                if entries.is_empty() {
                    break;
                }
                self.append_entries(entries);
            }
            drop(leading);
            // Queued after the leader's last look and before it let go: lead again.
            if self
                .combiner
                .queue
                .lock()
                .expect("combiner lock")
                .is_empty()
            {
                return;
            }
        }
    }

    fn append_entries(&self, entries: Vec<Entry>) {
        let all: Vec<Event> = entries
            .iter()
            .flat_map(|(e, _)| e.iter().cloned())
            .collect();
        match self.append(&all) {
            Ok(last) => {
                let mut seq = last - all.len() as u64;
                for (events, tx) in entries {
                    seq += events.len() as u64;
                    let _ = tx.send(Ok(seq));
                }
            }
            // Each writer gets its own error (degraded, failed flush, …).
            Err(_) => {
                for (events, tx) in entries {
                    let _ = tx.send(self.append(&events));
                }
            }
        }
    }
}
