//! The newest records, kept in memory as appended, so that the tasks that follow the
//! log (the outbox, command results, the executor's look-up of a command's history)
//! read what was just written without going back to storage, decoding and re-hashing
//! it. Bounded by [`super::LogOptions::recent_records`]; a read that reaches further
//! back goes to storage. Only committed records are kept (pushed after their
//! transaction, under the log's tail lock, so in seq order without gaps). Each kept
//! record's JSON form is made once, by the first reader that asks for it (the outbox
//! and the results task both publish it).

use crate::event::Record;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

/// A kept record and, once asked for, its JSON form.
pub struct Kept {
    pub record: Record,
    json: OnceLock<serde_json::Value>,
}

impl Kept {
    /// [`Record::to_json`], made once.
    pub fn json(&self) -> &serde_json::Value {
        self.json.get_or_init(|| self.record.to_json())
    }
}

pub struct Recent {
    capacity: usize,
    records: Mutex<VecDeque<Arc<Kept>>>,
}

impl Recent {
    pub fn new(capacity: usize) -> Recent {
        Recent {
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    /// Keeps `records` (the next ones in seq order), dropping the oldest beyond the
    /// capacity.
    pub fn push(&self, records: impl IntoIterator<Item = Record>) {
        if self.capacity == 0 {
            return;
        }
        let mut kept = self.lock();
        for record in records {
            if kept.len() == self.capacity {
                kept.pop_front();
            }
            kept.push_back(Arc::new(Kept {
                record,
                json: OnceLock::new(),
            }));
        }
    }

    /// Record `seq`, when it is kept.
    pub fn get(&self, seq: u64) -> Option<Arc<Kept>> {
        let kept = self.lock();
        let first = kept.front()?.record.seq;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        kept.get(i).cloned()
    }

    /// Every record after `since` when all of them are kept (the kept ones start at or
    /// before `since + 1`); `None` when some are only in storage.
    pub fn since(&self, since: u64) -> Option<Vec<Arc<Kept>>> {
        let kept = self.lock();
        let first = kept.front().map_or(u64::MAX, |k| k.record.seq);
        if first > since.saturating_add(1) {
            return None;
        }
        let skip = usize::try_from(since + 1 - first).unwrap_or(usize::MAX);
        Some(kept.iter().skip(skip).cloned().collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Kept>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    fn record(seq: u64) -> Record {
        Record {
            seq,
            at_ms: 0,
            prev_hash: [0; 32],
            event: Event::CommandRejected {
                command_id: Some(format!("c{seq}")),
                code: capstan_common::ErrorCode::InvalidJson,
                message: String::new(),
            },
        }
    }

    fn seqs(kept: Option<Vec<Arc<Kept>>>) -> Option<Vec<u64>> {
        kept.map(|k| k.iter().map(|k| k.record.seq).collect())
    }

    #[test]
    fn keeps_the_newest_records_up_to_its_capacity() {
        let recent = Recent::new(3);
        assert_eq!(seqs(recent.since(0)), None, "nothing kept yet");
        recent.push((1..=2).map(record));
        assert_eq!(seqs(recent.since(0)), Some(vec![1, 2]));
        recent.push((3..=5).map(record));
        assert_eq!(seqs(recent.since(0)), None, "1 is only in storage");
        assert_eq!(seqs(recent.since(1)), None, "2 is only in storage");
        assert_eq!(seqs(recent.since(2)), Some(vec![3, 4, 5]));
        assert_eq!(seqs(recent.since(4)), Some(vec![5]));
        assert_eq!(seqs(recent.since(5)), Some(vec![]));
        assert_eq!(seqs(recent.since(9)), Some(vec![]));
        assert!(recent.get(2).is_none());
        assert_eq!(recent.get(4).map(|k| k.record.seq), Some(4));
        let kept = recent.get(4).unwrap();
        assert_eq!(kept.json(), &kept.record.to_json());
        assert!(recent.get(6).is_none());
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let recent = Recent::new(0);
        recent.push((1..=2).map(record));
        assert_eq!(seqs(recent.since(0)), None);
        assert!(recent.get(1).is_none());
    }
}
