//! Combining concurrent durable appends into one write.
//!
//! Why: an append holds the log's tail (its next seq and last hash) while it seals
//! its records and writes them. Writers that arrive meanwhile would each wait for the
//! lock and then write alone, blocking a runtime thread apiece; combined, the one
//! holding the tail writes everything queued at once, and the others wait without a
//! thread. (Before storage layout 2's plain writes, each append was also a sled
//! transaction, which cannot commit during a flush: docs/benchmarks.md, issue 11.)
//!
//! How: [`Log::append_combined`] queues the writer's events and tries to lead. The
//! leader takes everything queued, appends it as **one** batch (each writer's events
//! still contiguous, and all or none of them recovered after a crash: see [`super`]),
//! hands each writer its last seq, and goes on while more has queued (writers that
//! arrived while it wrote). A writer that cannot lead waits for its seq without
//! holding a thread. After the leader lets go it looks once more, so nothing queued
//! is left behind. A running flush never holds an append up: what is appended during
//! it is made durable by the next one.

use super::{Fold, Log, LogError};
use std::sync::{Mutex, TryLockError};
use tokio::sync::oneshot;

/// One writer's entries, and where its last seq goes.
type Queued<E> = (Vec<E>, oneshot::Sender<Result<u64, LogError>>);

pub(super) struct Combiner<E> {
    queue: Mutex<Vec<Queued<E>>>,
    leader: Mutex<()>,
}

impl<E> Default for Combiner<E> {
    fn default() -> Self {
        Combiner {
            queue: Mutex::new(Vec::new()),
            leader: Mutex::new(()),
        }
    }
}

impl<F: Fold> Log<F> {
    /// [`Log::append`] of `events`, combined with concurrent callers' into one write.
    pub(super) async fn append_combined(&self, events: &[F::Entry]) -> Result<u64, LogError> {
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

    fn append_entries(&self, entries: Vec<Queued<F::Entry>>) {
        let all: Vec<F::Entry> = entries
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
