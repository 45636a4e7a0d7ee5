//! Verification of the whole log: every record's hash, seq and link from seq 1 (or,
//! after a prune, from the anchor: its hash and its intent, see [`super::anchor`]), and
//! every snapshot against the records — its anchor is the hash of the record at its
//! seq, and its intent is the fold of records `1..=seq`. A snapshot is trusted on open
//! (that keeps opening bounded), so this is what catches a forged one (a changed intent
//! under a recomputed hash). `log verify` runs it at once; the daemon runs it in the
//! background after start, paced, and degrades the log if it fails.

use super::codec::Hash;
use super::snapshot::{self, Snapshot};
use super::{key_seq, seq_key, Corruption, Defect, Fold, Log, LogError, ScanError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How fast a background verification reads: `chunk` records, then a `pause`.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub chunk: u64,
    pub pause: Duration,
}

/// A verification in progress, resumable chunk by chunk.
pub(super) struct Verifier<F> {
    next_seq: u64,
    prev: Hash,
    /// The fold of records `1..next_seq`.
    intent: F,
    /// The snapshots present when the verification began, by seq, not yet checked;
    /// one that cannot be read is its defect.
    snapshots: BTreeMap<u64, Result<Snapshot<F>, Defect>>,
    count: u64,
}

impl<F: Fold> Verifier<F> {
    pub(super) fn new(log: &Log<F>) -> Result<Verifier<F>, LogError> {
        // After a prune the chain starts at the anchor, with the intent it holds.
        let anchor = log.anchor()?;
        let after = anchor.as_ref().map_or(0, |a| a.seq);
        let mut snapshots = BTreeMap::new();
        for entry in log.snapshots.range(seq_key(after + 1)..) {
            let (key, value) = entry.map_err(LogError::Storage)?;
            let seq = key_seq(&key).unwrap_or(0);
            match snapshot::check(seq, &value) {
                Ok(Some(snap)) => drop(snapshots.insert(seq, Ok(snap))),
                // Another snapshot version: ignored by open, nothing to check.
                Ok(None) => {}
                Err(defect) => drop(snapshots.insert(seq, Err(defect))),
            }
        }
        let (prev, intent) = anchor.map_or(([0; 32], F::default()), |a| (a.hash, a.intent));
        Ok(Verifier {
            next_seq: after + 1,
            prev,
            intent,
            snapshots,
            count: 0,
        })
    }

    /// Checks up to `max` more records (and the snapshots at them). True when the
    /// end of the log was reached.
    pub(super) fn step(&mut self, log: &Log<F>, max: u64) -> Result<bool, LogError> {
        let mut checked = 0;
        let scan = Log::<F>::scan(&log.records, self.next_seq - 1, self.next_seq, self.prev);
        for item in scan.take(usize::try_from(max).unwrap_or(usize::MAX)) {
            let (record, hash) = match item {
                Ok(ok) => ok,
                // Records gone from under the verification: pruned meanwhile (the
                // prune checked their links as it exported them); on from the anchor.
                Err(ScanError::Corrupt(c))
                    if c.defect == Defect::OutOfSequence && self.skip_to_anchor(log)? =>
                {
                    return Ok(false)
                }
                Err(ScanError::Corrupt(c)) => return Err(LogError::Corrupt(c)),
                Err(ScanError::Storage(e)) => return Err(LogError::Storage(e)),
            };
            self.intent.apply(record.seq, &record.event);
            self.next_seq = record.seq + 1;
            self.prev = hash;
            self.count += 1;
            checked += 1;
            if let Some(snap) = self.snapshots.remove(&record.seq) {
                let defect = match snap {
                    Err(defect) => Some(defect),
                    Ok(s) if s.anchor != hash => Some(Defect::SnapshotUnanchored),
                    Ok(s) if s.intent != self.intent => Some(Defect::SnapshotForged),
                    Ok(_) => None,
                };
                if let Some(defect) = defect {
                    return Err(LogError::Corrupt(Corruption {
                        seq: record.seq,
                        defect,
                    }));
                }
            }
        }
        Ok(checked < max)
    }

    /// Moves on to the anchor when a prune has passed the verification by: true when it
    /// did.
    fn skip_to_anchor(&mut self, log: &Log<F>) -> Result<bool, LogError> {
        match log.anchor()? {
            Some(a) if a.seq >= self.next_seq => {
                self.next_seq = a.seq + 1;
                self.prev = a.hash;
                self.intent = a.intent;
                self.snapshots.retain(|seq, _| *seq > a.seq);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// After the last step: a snapshot past the last record has nothing to anchor it.
    /// Returns the number of records checked.
    pub(super) fn finish(self) -> Result<u64, LogError> {
        match self.snapshots.into_iter().next() {
            Some((seq, snap)) => Err(LogError::Corrupt(Corruption {
                seq,
                defect: snap.err().unwrap_or(Defect::SnapshotUnanchored),
            })),
            None => Ok(self.count),
        }
    }
}

impl<F: Fold> Log<F> {
    /// Checks the whole chain from seq 1 — every hash, every seq, every link — and
    /// every snapshot against the records. Returns the number of records, or the first
    /// bad record or snapshot.
    pub fn verify(&self) -> Result<u64, LogError> {
        let mut verifier = Verifier::new(self)?;
        while !verifier.step(self, u64::MAX)? {}
        verifier.finish()
    }

    /// [`Log::verify`] for a running agent: `pace.chunk` records at a time on a
    /// blocking thread, `pace.pause` between chunks, until done or `stop`. A failure
    /// puts the log in degraded mode (read-only, `log_degraded`). `Ok(None)` when
    /// stopped first.
    pub async fn verify_in_background(
        log: Arc<Log<F>>,
        pace: Pace,
        stop: CancellationToken,
    ) -> Result<Option<u64>, LogError> {
        let mut verifier = Verifier::new(&log)?;
        loop {
            let chunk = {
                let log = Arc::clone(&log);
                tokio::task::spawn_blocking(move || {
                    let done = verifier.step(&log, pace.chunk.max(1));
                    (verifier, done)
                })
            };
            let (back, done) = chunk.await.expect("the verification chunk panicked");
            verifier = back;
            match done {
                Ok(true) => break,
                Ok(false) => {}
                Err(LogError::Corrupt(c)) => {
                    log.degrade(c.clone());
                    return Err(LogError::Corrupt(c));
                }
                Err(e) => return Err(e),
            }
            tokio::select! {
                _ = tokio::time::sleep(pace.pause) => {}
                _ = stop.cancelled() => return Ok(None),
            }
        }
        match verifier.finish() {
            Ok(count) => Ok(Some(count)),
            Err(LogError::Corrupt(c)) => {
                log.degrade(c.clone());
                Err(LogError::Corrupt(c))
            }
            Err(e) => Err(e),
        }
    }

    /// Puts the log in degraded mode (read-only) for `corruption`, unless it already is.
    fn degrade(&self, corruption: Corruption) {
        tracing::error!(seq = corruption.seq, defect = %corruption.defect, "background log verification failed; the agent is degraded and read-only");
        let _ = self.degraded.set(corruption);
    }
}
