//! How the log sits in sled, and converting a log written in an earlier layout.
//!
//! - Layout 1 (builds before 2026-12): a key per record (`records`: seq → sealed
//!   record) and per index entry (`by_command`, `by_workload`, `by_time`).
//! - Layout 2 (this build): the records [`super::records::PER_CHUNK`] to a key
//!   (`record_chunks`), the indexes as posting lists (`command_index`,
//!   `workload_index`, `time_index`, see [`super::postings`]). The default tree's
//!   `layout` key holds `2`.
//!
//! The sealed records themselves (their bytes and hashes) are the same in both: a
//! conversion moves them, it never re-encodes them. [`prepare`] converts a layout-1
//! log in `dir` into a **new database** beside it, `<dir>.converting`: the records
//! copied in seq order, the indexes built from them, every other tree (snapshots,
//! anchor) copied as it is, then the marker set and flushed. Then `dir` is renamed
//! `<dir>.layout1`, the new one renamed `dir`, and the old copy removed. Why a new
//! database and not new trees in the old one: sled keeps the page ids of dropped
//! trees in its page table, which it reads whole on every open, so a log converted
//! in place opened no faster than before (docs/benchmarks.md). A crash at any point
//! is finished or undone by the next [`prepare`]: a `.converting` beside a `dir` is
//! an unfinished copy (removed, and the conversion starts again); a `.converting`
//! without `dir` is a finished one (renamed into place); a `.layout1` is the old
//! copy (removed once `dir` is in layout 2).

use super::records::{self, PER_CHUNK};
use super::{codec, key_seq, postings, query, release, LogError};
use std::path::{Path, PathBuf};

/// The default tree's key naming the layout, and this build's.
const KEY: &[u8] = b"layout";
const CURRENT: &[u8] = b"2";
/// Layout 2's trees: the records' and the three indexes'.
pub(super) const TREES: [&str; 4] = [
    records::TREE,
    "command_index",
    "workload_index",
    "time_index",
];
/// Layout 1's trees.
const OLD_TREES: [&str; 4] = ["records", "by_command", "by_workload", "by_time"];
/// Records written a batch while converting.
const BATCH: u64 = 10_000;
/// Progress is logged every this many records.
const PROGRESS: u64 = 100_000;

/// What a database holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Layout 2.
    Current,
    /// A layout-1 log, not (completely) converted.
    Old,
    /// No log.
    Empty,
}

fn has_tree(db: &sled::Db, name: &str) -> bool {
    db.tree_names()
        .iter()
        .any(|n| n.as_ref() == name.as_bytes())
}

/// Which layout the database in `db` is in.
pub(super) fn found(db: &sled::Db) -> Result<Found, LogError> {
    if db.get(KEY).map_err(LogError::Storage)?.as_deref() == Some(CURRENT) {
        return Ok(Found::Current);
    }
    if has_tree(db, OLD_TREES[0]) {
        return Ok(Found::Old);
    }
    Ok(Found::Empty)
}

/// `<dir>.<what>`, beside `dir`.
pub(super) fn sibling(dir: &Path, what: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(what);
    dir.with_file_name(name)
}

/// Opens the sled database in `dir` as it is, sled's own periodic flush off.
pub(super) fn open_raw(dir: &Path) -> Result<sled::Db, LogError> {
    sled::Config::new()
        .path(dir)
        .flush_every_ms(None)
        .open()
        .map_err(|source| LogError::Open {
            path: dir.to_path_buf(),
            source,
        })
}

/// Closes `db` and waits until sled has let go of its files.
fn close(db: sled::Db, dir: &Path) -> Result<(), LogError> {
    db.flush().map_err(LogError::Storage)?;
    drop(db);
    release::wait_until_released(&dir.join("db"));
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Convert {
        path: path.to_path_buf(),
        source,
    }
}

/// Renames `from` to `to` and makes the rename durable.
fn rename(from: &Path, to: &Path) -> Result<(), LogError> {
    std::fs::rename(from, to).map_err(io(from))?;
    let parent = to.parent().unwrap_or(Path::new("."));
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(io(parent))
}

fn remove(dir: &Path) -> Result<(), LogError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(dir)(e)),
        _ => Ok(()),
    }
}

/// Makes the log in `dir` (if any) a layout-2 log before it is opened: finishes or
/// undoes what an interrupted conversion left (see the module), and converts a
/// layout-1 log.
pub(super) fn prepare(dir: &Path) -> Result<(), LogError> {
    let (converting, old) = (sibling(dir, "converting"), sibling(dir, "layout1"));
    if converting.exists() {
        if dir.join("db").exists() {
            remove(&converting)?;
        } else {
            tracing::info!(log = %dir.display(), "log: putting the converted log in place (a conversion was interrupted)");
            rename(&converting, dir)?;
        }
    }
    if !dir.join("db").exists() {
        return Ok(());
    }
    let db = open_raw(dir)?;
    if found(&db)? != Found::Old {
        close(db, dir)?;
        return remove(&old);
    }
    remove(&old)?;
    let copy = open_raw(&converting)?;
    convert(&db, &copy)?;
    copy.insert(KEY, CURRENT).map_err(LogError::Storage)?;
    close(copy, &converting)?;
    close(db, dir)?;
    rename(dir, &old)?;
    rename(&converting, dir)?;
    remove(&old)
}

/// Marks a database that holds no log yet as layout 2.
pub(super) fn mark_new(db: &sled::Db, dir: &Path) -> Result<(), LogError> {
    match found(db)? {
        Found::Current => Ok(()),
        Found::Empty => db.insert(KEY, CURRENT).map(drop).map_err(LogError::Storage),
        Found::Old => Err(LogError::OldLayout {
            path: dir.to_path_buf(),
        }),
    }
}

/// Writes into `new` layout 2's trees from `old`'s layout-1 records, and copies every
/// other tree (and the default tree) of `old` as it is.
fn convert(old: &sled::Db, new: &sled::Db) -> Result<(), LogError> {
    let tree = |name: &str| new.open_tree(name).map_err(LogError::Storage);
    let [chunks, by_command, by_workload, by_time] = TREES.map(tree);
    let (chunks, by_command, by_workload, by_time) = (chunks?, by_command?, by_workload?, by_time?);
    let started = std::time::Instant::now();
    for name in old.tree_names() {
        if OLD_TREES.iter().any(|t| t.as_bytes() == name.as_ref()) {
            continue;
        }
        let (from, to) = (
            old.open_tree(&name).map_err(LogError::Storage)?,
            new.open_tree(&name).map_err(LogError::Storage)?,
        );
        for entry in from.iter() {
            let (k, v) = entry.map_err(LogError::Storage)?;
            to.insert(k, v).map_err(LogError::Storage)?;
        }
    }
    let records = old.open_tree(OLD_TREES[0]).map_err(LogError::Storage)?;
    let total = records.len() as u64;
    tracing::info!(
        records = total,
        "log: converting to layout 2 (records 8 to a key, in a new database); this happens once"
    );
    let mut builders: [postings::Builder; 3] = Default::default();
    let mut batch = sled::Batch::default();
    let mut chunk: Option<(u64, Vec<u8>)> = None;
    let mut done = 0u64;
    // Lists idle for this many records have their heads written as the copy goes.
    let flush_lists = |builders: &mut [postings::Builder; 3], seq: u64| -> Result<(), LogError> {
        for (b, t) in builders
            .iter_mut()
            .zip([&by_command, &by_workload, &by_time])
        {
            t.apply_batch(b.take(seq.saturating_sub(BATCH)))
                .map_err(LogError::Storage)?;
        }
        Ok(())
    };
    for entry in records.iter() {
        let (key, sealed) = entry.map_err(LogError::Storage)?;
        let seq = key_seq(&key).unwrap_or(0);
        let no = seq / PER_CHUNK;
        match &mut chunk {
            Some((n, bytes)) if *n == no => bytes.extend_from_slice(&records::entry(seq, &sealed)),
            _ => {
                if let Some((n, bytes)) = chunk.take() {
                    batch.insert(&records::chunk_key(n * PER_CHUNK)[..], bytes);
                }
                chunk = Some((no, records::entry(seq, &sealed)));
            }
        }
        // A record that fails its hash is copied as it is (verification reports it)
        // and indexed nowhere, as layout 1 could not have named its entries either.
        if let Ok((record, _)) = codec::open_record(seq, &sealed) {
            let index = query::IndexKeys::of(seq, record.at_ms, &record.event);
            let seq_bytes = seq.to_be_bytes();
            if let Some(k) = &index.command {
                builders[0].push(k, &seq_bytes, seq);
            }
            if let Some(k) = &index.workload {
                builders[1].push(k, &seq_bytes, seq);
            }
            builders[2].push(&index.minute, &index.time_entry, seq);
        }
        done += 1;
        if done.is_multiple_of(BATCH) {
            chunks
                .apply_batch(std::mem::take(&mut batch))
                .map_err(LogError::Storage)?;
            flush_lists(&mut builders, seq)?;
        }
        if done.is_multiple_of(PROGRESS) {
            tracing::info!(done, of = total, "log: converting to layout 2");
        }
    }
    if let Some((n, bytes)) = chunk {
        batch.insert(&records::chunk_key(n * PER_CHUNK)[..], bytes);
    }
    chunks.apply_batch(batch).map_err(LogError::Storage)?;
    for (b, t) in builders
        .into_iter()
        .zip([&by_command, &by_workload, &by_time])
    {
        t.apply_batch(b.finish()).map_err(LogError::Storage)?;
    }
    tracing::info!(
        records = done,
        ms = started.elapsed().as_millis() as u64,
        "log: converted to layout 2"
    );
    Ok(())
}

#[cfg(test)]
#[path = "layout_tests.rs"]
pub(super) mod tests;
