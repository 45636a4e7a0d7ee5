//! Reading the log without running it: what `capstan-agent log` uses when no agent
//! holds the log. [`LogReader::open`] opens the storage and the trees that queries
//! read, and nothing else: no intent is rebuilt (no snapshot is loaded, no tail
//! replayed), no index is built, no snapshot written, no interrupted prune finished.
//! Nothing of the log is written through it. (The storage itself, sled, may still
//! write its own recovery state when it opens: see `docs/benchmarks.md`.) A log in an
//! earlier layout (see [`super::layout`]) is not converted here: the reader refuses
//! it, and the agent converts it when it next starts. One in a layout this build does
//! not know (a newer build's) is refused, as [`super::Log::open`] refuses it.
//!
//! Each record read is checked against its own hash; the chain is `log verify`'s.
//! Records at or below the anchor (left by a prune that crashed before removing
//! them), and records after the tip (left by an append a crash cut short: see
//! [`super::tip`]), are not shown, as [`Log::open`] would have removed them.

use super::layout::{self, Found};
use super::query::Indexes;
use super::records::Records;
use super::{anchor, db_lock, records_since, tip, LogError};
use super::{Entry, Record};
use capstan_common::answers::LogRequest;
use std::marker::PhantomData;
use std::path::Path;

/// A log of `E` records opened for reading only.
pub struct LogReader<E> {
    records: Records,
    by_command: sled::Tree,
    by_workload: sled::Tree,
    by_time: sled::Tree,
    /// The last pruned seq (the anchor's), 0 before any prune.
    pruned_through: u64,
    /// The tip (see [`super::tip`]): records after it are what a crash left of an
    /// append cut short, which the agent removes when it next opens the log.
    tip: u64,
    _db: sled::Db,
    /// Last, as in [`super::Log`]: waits until sled has let go of the database.
    _released: db_lock::Released,
    _entries: PhantomData<fn() -> E>,
}

impl<E: Entry> LogReader<E> {
    /// Opens the log in `dir` for reading; `None` when there is none (nothing was
    /// ever written there). Fails while another process holds the log (a running
    /// agent: ask it instead, over its local socket).
    pub fn open(dir: &Path) -> Result<Option<LogReader<E>>, LogError> {
        // sled would create a missing database: look first. A converted copy without
        // the log is a conversion the agent has not finished putting in place.
        if !dir.join("db").exists() {
            if layout::sibling(dir, "converting").exists() {
                return Err(LogError::OldLayout {
                    path: dir.to_path_buf(),
                });
            }
            return Ok(None);
        }
        let db = layout::open_raw(dir)?;
        match layout::found(&db)? {
            Found::Empty => return Ok(None),
            Found::Old => {
                return Err(LogError::OldLayout {
                    path: dir.to_path_buf(),
                })
            }
            Found::Unknown(unknown) => return Err(layout::refused(dir, unknown)),
            Found::Current => {}
        }
        // `open_tree` creates a missing tree: only existing ones are opened.
        let names = db.tree_names();
        let existing = |name: &str| -> Result<Option<sled::Tree>, LogError> {
            if !names.iter().any(|n| n.as_ref() == name.as_bytes()) {
                return Ok(None);
            }
            db.open_tree(name).map(Some).map_err(LogError::Storage)
        };
        let tree = |name: &'static str| {
            existing(name)?.ok_or(LogError::MissingTree {
                path: dir.to_path_buf(),
                tree: name,
            })
        };
        let [records, by_command, by_workload, by_time] = layout::TREES.map(tree);
        let (records, by_command, by_workload, by_time) =
            (Records::new(records?), by_command?, by_workload?, by_time?);
        // Only its seq is needed: the fold it holds is skipped, not read.
        let anchor = |t: sled::Tree| anchor::read::<serde::de::IgnoredAny>(&t);
        let pruned_through = match existing(anchor::TREE)?.map(anchor) {
            Some(Ok(Some(a))) => a.seq,
            Some(Ok(None)) | None => 0,
            // Still readable: what can be trusted is shown; `log verify` says more.
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the log's anchor cannot be read");
                0
            }
        };
        let tip = tip::read(&db)?.unwrap_or(u64::MAX);
        Ok(Some(LogReader {
            tip,
            records,
            by_command,
            by_workload,
            by_time,
            pruned_through,
            _db: db,
            _released: db_lock::Released::new(dir),
            _entries: PhantomData,
        }))
    }

    /// The records `request` asks for, as [`super::Log::query`] answers them.
    pub fn query(&self, request: &LogRequest) -> Result<Vec<Record<E>>, LogError> {
        let request = LogRequest {
            since: request.since.max(self.pruned_through),
            ..request.clone()
        };
        let mut records = Indexes {
            records: &self.records,
            by_command: &self.by_command,
            by_workload: &self.by_workload,
            by_time: &self.by_time,
        }
        .query(&request)?;
        // In seq order: what is after the tip is at the end.
        records.retain(|r| r.seq <= self.tip);
        Ok(records)
    }

    /// Records with seq greater than `since`, in order, each checked against its
    /// own hash.
    pub fn read_since(&self, since: u64) -> impl Iterator<Item = Result<Record<E>, LogError>> + '_ {
        let tip = self.tip;
        records_since(&self.records, since.max(self.pruned_through))
            .take_while(move |r| !matches!(r, Ok(r) if r.seq > tip))
    }
}

#[cfg(test)]
mod tests;
