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
//!
//! **Refuse, never empty.** A database in a layout this build does not know — a
//! `layout` marker it does not know (a newer build's), or data without a marker that
//! is not layout 1's — is refused ([`Found::Unknown`], `LogError::UnknownLayout`,
//! naming what was found and the build that last opened it for writing), never taken
//! for an empty log: an agent that did would start with empty intent, take every
//! workload for drift and remove it. Only a database holding nothing at all is new.
//! Beside the marker, the default tree's `written_by` key holds the version of the
//! last build that opened the log for writing (set when a log is created, converted,
//! or opened by [`super::Log::open`]).
//!
//! What changes the layout number: anything an older build of the same layout would
//! misread or take for missing (records or indexes moved or re-encoded). Trees added
//! beside the others (`pruned_ids`, `pruned_batches`, `pruned_expiry`) are ignored by
//! the builds that do not know them, so they are not a new layout.

use super::records::{self, PER_CHUNK};
use super::{codec, db_lock, key_seq, postings, query, Entry, LogError};
use std::path::{Path, PathBuf};

/// The default tree's key naming the layout, and this build's.
const KEY: &[u8] = b"layout";
const CURRENT: &[u8] = b"2";
/// The layouts this build reads: 1 (converted when the agent opens it) and 2.
pub const READS: [u32; 2] = [1, 2];
/// The default tree's key holding the version of the last build that opened the log
/// for writing.
const WRITTEN_BY: &[u8] = b"written_by";
/// This build's version, as `capstan-agent --version` gives it.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");
/// [`READS`] as the error says it: `1, 2`.
pub(super) fn reads() -> String {
    READS.map(|l| l.to_string()).join(", ")
}

/// sled's own default tree, in every database.
const DEFAULT_TREE: &[u8] = b"__sled__default";
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Found {
    /// Layout 2.
    Current,
    /// A layout-1 log, not (completely) converted.
    Old,
    /// No log.
    Empty,
    /// Something this build cannot read: refused.
    Unknown(Unknown),
}

/// A database in no layout this build reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// Its `layout` marker, if it has one.
    pub layout: Option<String>,
    /// The version of the last build that opened it for writing, if it says.
    pub written_by: Option<String>,
    /// Its trees (sled's default one left out).
    pub trees: Vec<String>,
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.layout {
            Some(layout) => write!(f, "in storage layout {layout}")?,
            None => write!(
                f,
                "in no storage layout this build knows (no layout marker; its trees: {})",
                self.trees.join(", ")
            )?,
        }
        match &self.written_by {
            Some(v) => write!(f, ", last opened for writing by capstan-agent {v}"),
            None => write!(f, ", by a build that does not say which"),
        }
    }
}

fn has_tree(db: &sled::Db, name: &str) -> bool {
    db.tree_names()
        .iter()
        .any(|n| n.as_ref() == name.as_bytes())
}

fn text(db: &sled::Db, key: &[u8]) -> Result<Option<String>, LogError> {
    let value = db.get(key).map_err(LogError::Storage)?;
    Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
}

/// Which layout the database in `db` is in.
pub(super) fn found(db: &sled::Db) -> Result<Found, LogError> {
    let marker = db.get(KEY).map_err(LogError::Storage)?;
    if marker.as_deref() == Some(CURRENT) {
        return Ok(Found::Current);
    }
    if marker.is_none() && has_tree(db, OLD_TREES[0]) {
        return Ok(Found::Old);
    }
    let trees: Vec<String> = db
        .tree_names()
        .iter()
        .filter(|n| n.as_ref() != DEFAULT_TREE)
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    // Nothing at all: a new database. Anything else without a marker this build
    // knows is not taken for empty.
    if marker.is_none() && trees.is_empty() && db.is_empty() {
        return Ok(Found::Empty);
    }
    Ok(Found::Unknown(Unknown {
        layout: marker.map(|m| String::from_utf8_lossy(&m).into_owned()),
        written_by: text(db, WRITTEN_BY)?,
        trees,
    }))
}

/// The layout of the log in `dir` as `capstan-agent log layout` reports it, read
/// without converting or writing anything of the log: `Some` of its marker (`1` for
/// a layout-1 log, which has none), `None` when there is no log.
pub(super) fn of(dir: &Path) -> Result<Option<String>, LogError> {
    if !dir.join("db").exists() {
        // A converted copy not yet put in place is what the next open puts there.
        let converted = sibling(dir, "converting").exists();
        return Ok(converted.then(|| current().to_string()));
    }
    let db = open_raw(dir)?;
    let layout = match found(&db)? {
        Found::Current => Some(current().to_string()),
        Found::Old => Some("1".to_string()),
        Found::Empty => None,
        Found::Unknown(u) => Some(u.layout.unwrap_or_else(|| "unknown".to_string())),
    };
    drop(db);
    db_lock::wait_until_released(&dir.join("db"));
    Ok(layout)
}

/// This build's layout, as [`of`] names it.
pub(super) fn current() -> &'static str {
    std::str::from_utf8(CURRENT).expect("the layout marker is ASCII")
}

/// The error for a database in no layout this build reads.
pub(super) fn refused(dir: &Path, found: Unknown) -> LogError {
    LogError::UnknownLayout {
        path: dir.to_path_buf(),
        found,
    }
}

/// Records this build as the last one to open `db` for writing (no write when it is
/// already).
fn sign(db: &sled::Db) -> Result<(), LogError> {
    if db.get(WRITTEN_BY).map_err(LogError::Storage)?.as_deref() != Some(BUILD.as_bytes()) {
        db.insert(WRITTEN_BY, BUILD).map_err(LogError::Storage)?;
    }
    Ok(())
}

/// `<dir>.<what>`, beside `dir`.
pub(super) fn sibling(dir: &Path, what: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(what);
    dir.with_file_name(name)
}

/// Makes `dir`, or makes it the owner's alone: `0700`, whatever the umask. sled
/// makes its files (`db`, `conf`, `snap.*`, `blobs/`) with the umask's mode and no
/// way to ask for another; inside this directory nobody else can reach them.
pub(super) fn private(dir: &Path) -> Result<(), LogError> {
    capstan_common::files::private_dir(dir).map_err(|source| LogError::Dir {
        path: dir.to_path_buf(),
        source,
    })
}

/// Opens the sled database in `dir` (made [`private`] first) as it is, sled's own
/// periodic flush off.
pub(super) fn open_raw(dir: &Path) -> Result<sled::Db, LogError> {
    private(dir)?;
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
    db_lock::wait_until_released(&dir.join("db"));
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

/// A failure writing the copy at `converting` (no space, say), as a failed conversion.
fn copy_failed(converting: &Path) -> impl FnOnce(LogError) -> LogError + '_ {
    move |e| match e {
        LogError::Storage(source) | LogError::Open { source, .. } => LogError::Convert {
            path: converting.to_path_buf(),
            source: source.into(),
        },
        other => other,
    }
}

fn remove(dir: &Path) -> Result<(), LogError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(dir)(e)),
        _ => Ok(()),
    }
}

/// Makes the log in `dir` (if any) a layout-2 log before it is opened: finishes or
/// undoes what an interrupted conversion left (see the module), and converts a
/// layout-1 log of `E` records.
pub(super) fn prepare<E: Entry>(dir: &Path) -> Result<(), LogError> {
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
    match found(&db)? {
        Found::Old => {}
        // Untouched, and nothing beside it removed: a newer build's to deal with.
        Found::Unknown(unknown) => {
            drop(db);
            db_lock::wait_until_released(&dir.join("db"));
            return Err(refused(dir, unknown));
        }
        Found::Current | Found::Empty => {
            close(db, dir)?;
            return remove(&old);
        }
    }
    remove(&old)?;
    let copy = open_raw(&converting).map_err(copy_failed(&converting))?;
    let copied = convert::<E>(&db, &copy)
        .and_then(|()| copy.insert(KEY, CURRENT).map_err(LogError::Storage))
        .and_then(|_| sign(&copy))
        .and_then(|()| copy.flush().map_err(LogError::Storage));
    if let Err(e) = copied {
        // Not closed: after a write sled could not make (a value it keeps in a file
        // of its own, on a full disk), its flush, and so its drop, waits forever for
        // that write. The unfinished copy stays, for the next open to remove.
        std::mem::forget(copy);
        drop(db);
        db_lock::wait_until_released(&dir.join("db"));
        return Err(copy_failed(&converting)(e));
    }
    close(copy, &converting)?;
    close(db, dir)?;
    rename(dir, &old)?;
    rename(&converting, dir)?;
    remove(&old)
}

/// Marks a database that holds no log yet as layout 2, and records this build as the
/// last one to open it for writing; refuses one in another layout.
pub(super) fn mark_new(db: &sled::Db, dir: &Path) -> Result<(), LogError> {
    match found(db)? {
        Found::Current => sign(db),
        // The marker first: a crash between the two leaves a layout-2 log that does
        // not say who wrote it, never a key without a marker (which is refused).
        Found::Empty => {
            db.insert(KEY, CURRENT).map_err(LogError::Storage)?;
            sign(db)
        }
        Found::Old => Err(LogError::OldLayout {
            path: dir.to_path_buf(),
        }),
        Found::Unknown(unknown) => Err(refused(dir, unknown)),
    }
}

/// Writes into `new` layout 2's trees from `old`'s layout-1 records, and copies every
/// other tree (and the default tree) of `old` as it is.
fn convert<E: Entry>(old: &sled::Db, new: &sled::Db) -> Result<(), LogError> {
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
        if let Ok((record, _)) = codec::open_record::<E>(seq, &sealed) {
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
pub(super) mod tests;
