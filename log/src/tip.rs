//! The tip: the last seq of the last append written whole, under the key `tip` of the
//! database's default tree.
//!
//! Why: an append writes its records (their chunks) and their index entries as plain
//! sled inserts, not as a sled transaction. A sled transaction rolls sled's IO buffer
//! twice (once to write what came before it, once for its batch manifest), and each
//! roll is a synchronous write to the disk (`pwrite` and `sync_file_range`) on sled's
//! IO threads: two disk writes an append, on top of the flush that makes it durable.
//! Plain inserts stay in the buffer until the flush (docs/benchmarks.md, issue 11).
//!
//! What makes it safe: sled recovers, after a crash, a prefix of its writes in the
//! order they were made (its log is replayed up to the first write missing or torn).
//! An append writes the chunks, then the index entries, then the tip, holding the
//! log's tail, so no other append's writes come between. So when a tip is recovered,
//! everything every append up to it wrote is too; what a crash can leave after the tip
//! is part of one append (or of several combined), never acknowledged, since a writer
//! is told its records are durable only after a flush that came after the tip.
//! [`cut_after`], on open, removes that part: the records after the tip, and the index
//! entries after the tip in the lists those records name. A [`super::LogReader`] does
//! not write: it shows nothing after the tip.
//!
//! A log without a tip (written before the tip existed, by sled transactions, or
//! converted from layout 1) holds only whole appends: nothing is cut.

use super::postings;
use super::query::IndexKeys;
use super::records::Records;
use super::{codec, Entry, LogError, ScanError};
use std::collections::BTreeSet;

const KEY: &[u8] = b"tip";

/// The tip, if the log has one.
pub(super) fn read(db: &sled::Db) -> Result<Option<u64>, LogError> {
    let value = db.get(KEY).map_err(LogError::Storage)?;
    Ok(value
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
        .map(u64::from_be_bytes))
}

/// Marks `seq` as the last record of an append written whole: the last write of an
/// append.
pub(super) fn write(db: &sled::Db, seq: u64) -> Result<(), sled::Error> {
    db.insert(KEY, &seq.to_be_bytes()).map(|_| ())
}

/// The trees an append writes.
pub(super) struct Trees<'a> {
    pub records: &'a Records,
    pub by_command: &'a sled::Tree,
    pub by_workload: &'a sled::Tree,
    pub by_time: &'a sled::Tree,
}

/// Removes the records after `tip` and their index entries (what a crash left of an
/// append it cut short), `E` records. Returns how many records went.
pub(super) fn cut_after<E: Entry>(trees: &Trees<'_>, tip: u64) -> Result<usize, LogError> {
    let (mut commands, mut workloads, mut minutes) =
        (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut cut = 0;
    for entry in trees.records.range(tip.saturating_add(1)) {
        let (seq, value) = match entry {
            Ok(ok) => ok,
            // A chunk that does not parse names no lists; it goes below all the same.
            Err(ScanError::Corrupt(_)) => continue,
            Err(ScanError::Storage(e)) => return Err(LogError::Storage(e)),
        };
        cut += 1;
        if let Ok((record, _)) = codec::open_record::<E>(seq, &value) {
            let index = IndexKeys::of(seq, record.at_ms, &record.event);
            commands.extend(index.command);
            workloads.extend(index.workload);
            minutes.insert(index.minute);
        }
    }
    if cut == 0 {
        return Ok(0);
    }
    for key in &commands {
        postings::truncate(trees.by_command, key, 8, tip)?;
    }
    for key in &workloads {
        postings::truncate(trees.by_workload, key, 8, tip)?;
    }
    for key in &minutes {
        postings::truncate(trees.by_time, key, 16, tip)?;
    }
    trees.records.remove_after(tip)?;
    Ok(cut)
}

#[cfg(test)]
mod tests;
