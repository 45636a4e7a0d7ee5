//! Opening the log: the cut back to the tip after a crash, the newest usable snapshot
//! or the anchor, the replay and check of the records after it, the flusher started.

use super::records::Records;
use super::{anchor, combine, db_lock, flusher, layout, pruned, snapshot, tip};
use super::{Fold, Log, LogError, LogOptions, ScanError, Tail};
use std::path::Path;
use std::sync::Mutex;

impl<F: Fold> Log<F> {
    /// Opens (or creates) the log in `dir` (made `0700`, see [`layout::private`]),
    /// rebuilds the intent from the newest snapshot plus the records after it, and
    /// verifies that tail. A bad record leaves the log open but degraded: readable,
    /// and refusing appends.
    pub fn open(dir: &Path, options: LogOptions) -> Result<Log<F>, LogError> {
        layout::prepare::<F::Entry>(dir)?;
        layout::private(dir)?;
        let mut config = sled::Config::new().path(dir).flush_every_ms(None);
        if let Some(bytes) = options.cache_bytes {
            config = config.cache_capacity(bytes);
        }
        let db = config.open().map_err(|source| LogError::Open {
            path: dir.to_path_buf(),
            source,
        })?;
        layout::mark_new(&db, dir)?;
        let tree = |name: &str| db.open_tree(name).map_err(LogError::Storage);
        let [records, by_command, by_workload, by_time] = layout::TREES.map(tree);
        let (records, by_command, by_workload, by_time) =
            (Records::new(records?), by_command?, by_workload?, by_time?);
        let snapshots = tree("snapshots")?;
        let marks = tree(super::marks::TREE)?;
        let pruned = pruned::PrunedIds::open(&db)?;
        // An append a crash cut short: back to the tip, before anything reads.
        if let Some(tip) = tip::read(&db)? {
            let trees = tip::Trees {
                records: &records,
                by_command: &by_command,
                by_workload: &by_workload,
                by_time: &by_time,
            };
            let cut = tip::cut_after::<F::Entry>(&trees, tip)?;
            if cut > 0 {
                tracing::warn!(
                    records = cut,
                    tip,
                    "dropped the records of an append the last run did not finish writing (never acknowledged)"
                );
            }
        }

        let mut tail = Tail {
            next_seq: 1,
            last_hash: [0; 32],
            intent: F::default(),
            since_snapshot: 0,
        };
        let mut degraded = None;
        // The newest usable snapshot, anchored to the record it names.
        let anchor_of = |seq: u64| records.hash_of(seq);
        let mut start_after = 0;
        if let Some(snap) = snapshot::newest(&snapshots, anchor_of).map_err(LogError::Storage)? {
            start_after = snap.seq;
            tail.next_seq = snap.seq + 1;
            tail.last_hash = snap.anchor;
            tail.intent = snap.intent;
        }
        // After a prune: the anchor, when no snapshot past it is usable.
        let anchors = tree(anchor::TREE)?;
        let mut anchored = None;
        match anchor::read(&anchors) {
            Ok(Some(a)) if a.seq >= start_after => {
                anchored = Some(a.seq);
                start_after = a.seq;
                tail.next_seq = a.seq + 1;
                tail.last_hash = a.hash;
                tail.intent = a.intent;
            }
            Ok(a) => anchored = a.map(|a| a.seq),
            Err(LogError::Corrupt(c)) => degraded = Some(c),
            Err(e) => return Err(e),
        }
        // A damaged anchor: nothing to replay from.
        let replay = degraded.is_none().then_some(start_after).into_iter();
        let (from, prev) = (&records, tail.last_hash);
        let scan = replay.flat_map(move |after| Self::scan(from, after, after + 1, prev));
        for item in scan {
            match item {
                Ok((record, hash)) => {
                    tail.intent.apply(record.seq, &record.event);
                    tail.next_seq = record.seq + 1;
                    tail.last_hash = hash;
                    tail.since_snapshot += 1;
                }
                Err(ScanError::Corrupt(c)) => {
                    tracing::error!(seq = c.seq, defect = %c.defect, "log verification failed; the agent is degraded and read-only");
                    degraded = Some(c);
                    break;
                }
                Err(ScanError::Storage(e)) => return Err(LogError::Storage(e)),
            }
        }
        let flush_db = db.clone();
        #[cfg(any(test, feature = "testing"))]
        let flush_fault = std::sync::Arc::new(Mutex::new(None::<String>));
        #[cfg(any(test, feature = "testing"))]
        let fault = std::sync::Arc::clone(&flush_fault);
        let flusher = flusher::Flusher::start(tail.next_seq - 1, move || {
            #[cfg(any(test, feature = "testing"))]
            if let Some(reason) = fault.lock().expect("flush fault lock").clone() {
                return Err(reason);
            }
            flush_db.flush().map(|_| ()).map_err(|e| e.to_string())
        });
        let appended = tokio::sync::watch::Sender::new(tail.next_seq - 1);
        // A long replay (no usable snapshot: a new snapshot format, or none yet) is
        // not repeated on the next open.
        if degraded.is_none() && options.snapshot_due(tail.since_snapshot, &tail.intent) {
            snapshot::write(&snapshots, tail.next_seq - 1, tail.last_hash, &tail.intent)?;
            tail.since_snapshot = 0;
        }
        let log = Log {
            db,
            records,
            by_command,
            by_workload,
            by_time,
            snapshots,
            marks,
            pruned,
            options,
            tail: Mutex::new(tail),
            flusher,
            combiner: combine::Combiner::default(),
            #[cfg(any(test, feature = "testing"))]
            flush_fault,
            appended,
            degraded: degraded.map(std::sync::OnceLock::from).unwrap_or_default(),
            pruned_through: anchored.unwrap_or(0).into(),
            _released: db_lock::Released::new(dir),
        };
        if let Some(seq) = anchored {
            // A prune that crashed after writing its anchor is finished here.
            log.remove_through(seq)?;
        }
        Ok(log)
    }
}
