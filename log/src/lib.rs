//! The durable, hash-chained log: the agent's memory and the host's audit record.
//! Generic over the [`Entry`] each record carries and the [`Fold`] the entries feed
//! (the agent's `Event` and `Intent`, see [`entry`]). This crate is the only one that
//! names sled or bincode.
//!
//! Layout (one sled database under `<data-dir>/log`; layout 2, see [`layout`] for the
//! earlier one and the conversion):
//! - `record_chunks`: the sealed [`Record`]s (see [`codec`]), in the stored shape of
//!   their format version (see [`stored`]), eight to a key (see [`records`]);
//! - `command_index`, `workload_index`, `time_index`: posting lists (see
//!   [`postings`]) of the seqs of every record by command id, by
//!   `namespace/workload`, and by minute (with each record's time), for audit queries
//!   (see [`query`]);
//! - `snapshots`: seq → sealed snapshot of the fold (the intent) (see [`snapshot`]), every
//!   [`LogOptions::snapshot_every`] records (more on a host with many workloads: see
//!   [`LogOptions::snapshot_per_workload`]), so opening replays only the tail;
//! - `anchor`: after retention pruned records, where the chain starts (see [`anchor`],
//!   [`retention`]);
//! - `pruned_ids`, `pruned_expiry` (and the default tree's `retention_clock`): what
//!   is kept of the commands retention pruned, so that they are answered as
//!   duplicates, never carried out again, and when it expires (see `pruned`;
//!   `pruned_batches` is where earlier builds kept their expiry);
//! - `marks`: named positions the user keeps beside its records (see `marks`).
//!
//! A batch of records and their index entries are written as plain sled writes, then
//! the batch's last seq as the tip: after a crash, open cuts the log back to the tip
//! (see [`tip`]). A due snapshot is written right after. [`Log::durable`] waits for
//! the group-commit flusher.
//!
//! [`Log::open`] is in [`open`], the write path ([`Log::append`] and the wait for it
//! to be durable) in [`append`].

pub mod anchor;
mod append;
pub mod codec;
mod combine;
mod db_lock;
pub mod entry;
mod error;
pub mod export;
mod flusher;
mod key_writes;
mod layout;
mod marks;
mod open;
mod postings;
mod pruned;
mod query;
mod reader;
mod records;
pub mod retention;
mod snapshot;
pub mod stored;
mod tip;
mod verify;

/// Waits until no sled handle holds the database file `<dir>/db` (benchmarks that
/// open a log's database raw).
#[doc(hidden)]
pub use db_lock::wait_until_released;
pub use entry::{hex, CommandMark, Entry, Fold, Record};
pub use error::{Corruption, Defect, LogError};
/// The storage layouts this build reads (`capstan-agent --version`), and this
/// build's version as the log records it.
pub use layout::{BUILD, READS as LAYOUTS};
pub use pruned::PrunedCommand;
pub use query::uses_index;
pub use reader::LogReader;
/// The sled tree that holds the records (benchmarks that read a log's database raw).
#[doc(hidden)]
pub use records::TREE as RECORDS_TREE;
/// The snapshot format this build writes (a fixture's snapshots are told by it).
#[doc(hidden)]
pub use snapshot::VERSION as SNAPSHOT_VERSION;
pub use stored::StoredError;
pub use verify::Pace;

/// Decodes `content` (`[format version][body]`) as a stored record, as the log does
/// once a record's hash checks out: the record, or the defect found. Never panics and
/// never allocates what a length field claims, whatever the bytes (the fuzz target
/// `record`, `fuzz/`, holds it to that).
pub fn decode_record<E: Entry>(seq: u64, content: &[u8]) -> Result<Record<E>, Corruption> {
    let (stored, _) = codec::seal(content.to_vec());
    codec::open_record(seq, &stored).map(|(record, _)| record)
}

use codec::Hash;
use records::Records;
use std::path::Path;
use std::sync::Mutex;

/// How the log behaves; the defaults suit production.
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    /// Write a snapshot of the intent after this many records at least…
    pub snapshot_every: u64,
    /// …and at least this many records for each workload the intent holds: a
    /// snapshot costs as much as the intent is large, so on a host with many
    /// workloads this keeps snapshots a bounded share of the appends (and the replay
    /// they save no longer than loading one). 0: `snapshot_every` alone.
    pub snapshot_per_workload: u64,
    /// The storage's page cache, in bytes; `None`: sled's default (1 GiB, filled
    /// only as pages are read). Many logs in one process (`sim-fleet`) want less.
    pub cache_bytes: Option<u64>,
}

impl LogOptions {
    /// The defaults, with a snapshot every `records` records exactly.
    pub fn snapshot_every(records: u64) -> LogOptions {
        LogOptions {
            snapshot_every: records,
            snapshot_per_workload: 0,
            ..LogOptions::default()
        }
    }

    /// Whether a snapshot is due after `since` records, with `state` folded.
    fn snapshot_due(&self, since: u64, state: &impl Fold) -> bool {
        let scaled = state.weight().saturating_mul(self.snapshot_per_workload);
        since >= self.snapshot_every.max(scaled)
    }
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            snapshot_every: 1024,
            snapshot_per_workload: 1,
            cache_bytes: None,
        }
    }
}

struct Tail<F> {
    next_seq: u64,
    last_hash: Hash,
    intent: F,
    since_snapshot: u64,
}

/// An open log of `F::Entry` records, folded into `F`.
pub struct Log<F: Fold> {
    db: sled::Db,
    records: Records,
    by_command: sled::Tree,
    by_workload: sled::Tree,
    by_time: sled::Tree,
    snapshots: sled::Tree,
    /// Named positions (see `marks`).
    marks: sled::Tree,
    /// What is kept of pruned commands.
    pruned: pruned::PrunedIds,
    options: LogOptions,
    tail: Mutex<Tail<F>>,
    flusher: flusher::Flusher,
    combiner: combine::Combiner<F::Entry>,
    /// Test seam: a reason here makes every flush fail with it.
    #[cfg(any(test, feature = "testing"))]
    flush_fault: std::sync::Arc<Mutex<Option<String>>>,
    /// The last appended seq, for tasks that follow the log (outbox, registry).
    appended: tokio::sync::watch::Sender<u64>,
    /// Set on open, or later by the background verification; never cleared.
    degraded: std::sync::OnceLock<Corruption>,
    /// The anchor's seq (0 before any prune): records at or below it are pruned, even
    /// while a prune is still removing them, so reads start after it.
    pruned_through: std::sync::atomic::AtomicU64,
    /// Last: dropped after every sled handle above, it waits until sled has let go of
    /// the database, so the log can be opened again as soon as this one is dropped.
    _released: db_lock::Released,
}

fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn key_seq(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

impl<F: Fold> Log<F> {
    /// Walks records after `after`, checking each one's hash, seq and link.
    fn scan(
        records: &Records,
        after: u64,
        mut expect_seq: u64,
        mut prev: Hash,
    ) -> impl Iterator<Item = Result<(Record<F::Entry>, Hash), ScanError>> + '_ {
        let mut failed = false;
        records.range(after + 1).map_while(move |entry| {
            if failed {
                return None;
            }
            let result = (|| {
                let (seq, value) = entry?;
                let corrupt = |defect| ScanError::Corrupt(Corruption { seq, defect });
                if seq != expect_seq {
                    return Err(ScanError::Corrupt(Corruption {
                        seq: expect_seq,
                        defect: Defect::OutOfSequence,
                    }));
                }
                let (record, hash) = codec::open_record(seq, &value).map_err(ScanError::Corrupt)?;
                if record.seq != seq {
                    return Err(corrupt(Defect::OutOfSequence));
                }
                if record.prev_hash != prev {
                    return Err(corrupt(Defect::ChainBroken));
                }
                expect_seq += 1;
                prev = hash;
                Ok((record, hash))
            })();
            failed = result.is_err();
            Some(result)
        })
    }

    /// Why the log is read-only, if it is.
    pub fn degraded(&self) -> Option<&Corruption> {
        self.degraded.get()
    }

    /// Why the log could not be made durable, once a flush has failed. From then on
    /// nothing is durable: appends fail (`log_failed`) until the agent restarts.
    pub fn flush_failed(&self) -> Option<String> {
        self.flusher.failed()
    }

    /// Whether the log takes writes: not degraded, and no flush has failed.
    pub fn healthy(&self) -> bool {
        self.degraded().is_none() && self.flush_failed().is_none()
    }

    /// Test support (feature `testing`): every flush from now on fails with
    /// `reason`, as when the disk fails under a running agent.
    #[cfg(any(test, feature = "testing"))]
    pub fn inject_flush_failure(&self, reason: &str) {
        *self.flush_fault.lock().expect("flush fault lock") = Some(reason.to_string());
    }

    /// Test support (feature `testing`): every stored snapshot (seq, sealed bytes:
    /// `[version][body][hash]`), in seq order.
    #[cfg(any(test, feature = "testing"))]
    pub fn stored_snapshots(&self) -> Vec<(u64, Vec<u8>)> {
        self.snapshots
            .iter()
            .map(|e| e.expect("snapshots read"))
            .map(|(k, v)| (key_seq(&k).expect("8-byte keys"), v.to_vec()))
            .collect()
    }

    /// Test support (feature `testing`): how many records were appended since the
    /// last snapshot was written (or replayed on open after the one it loaded).
    #[cfg(any(test, feature = "testing"))]
    pub fn since_snapshot(&self) -> u64 {
        self.tail.lock().expect("log lock").since_snapshot
    }

    /// Test support (feature `testing`): rewrites the snapshot at `seq` through
    /// `edit` (its JSON: `seq`, `anchor`, `intent`) and reseals it, the way an
    /// attacker who can write the database would: a valid hash over a lie.
    #[cfg(any(test, feature = "testing"))]
    pub fn reseal_snapshot(&self, seq: u64, edit: impl FnOnce(&mut serde_json::Value)) {
        let stored = self
            .snapshots
            .get(seq_key(seq))
            .expect("read")
            .expect("a snapshot at seq");
        let (content, _) = codec::unseal(seq, &stored).expect("an intact snapshot");
        let mut body: serde_json::Value = serde_json::from_slice(&content[1..]).expect("JSON");
        edit(&mut body);
        let mut forged = vec![content[0]];
        serde_json::to_writer(&mut forged, &body).expect("JSON");
        self.snapshots
            .insert(seq_key(seq), codec::seal(forged).0)
            .expect("written");
    }

    /// A copy of the current fold, the intent (for work that spans awaits).
    pub fn intent(&self) -> F {
        self.with_intent(F::clone)
    }

    /// Reads the current intent in place, without copying it (the hot path: one
    /// decision per command). `read` must not block: appends wait for it.
    pub fn with_intent<R>(&self, read: impl FnOnce(&F) -> R) -> R {
        read(&self.tail.lock().expect("log lock").intent)
    }

    /// Follows the log: the receiver sees the last appended seq change. Monotonic:
    /// it never goes back, and it ends at [`Log::last_seq`].
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.appended.subscribe()
    }

    /// The seq of the last record.
    pub fn last_seq(&self) -> u64 {
        self.tail.lock().expect("log lock").next_seq - 1
    }

    /// One record by seq (none at or below the anchor).
    pub fn get(&self, seq: u64) -> Result<Option<Record<F::Entry>>, LogError> {
        if seq <= self.pruned_through() {
            return Ok(None);
        }
        get_record(&self.records, seq)
    }

    /// The anchor's seq, 0 before any prune: every record at or below it is pruned.
    fn pruned_through(&self) -> u64 {
        self.pruned_through
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every record as stored (seq, sealed bytes), in order: what a benchmark writes
    /// raw as its baseline.
    #[doc(hidden)]
    pub fn stored_records(&self) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
        self.records
            .range(0)
            .map(|e| {
                e.map(|(seq, sealed)| (seq, sealed.to_vec()))
                    .map_err(LogError::from)
            })
            .collect()
    }

    /// Records with seq greater than `since`, in order. Each is checked against its
    /// own hash; use [`Log::verify`] for the chain.
    pub fn read_since(
        &self,
        since: u64,
    ) -> impl Iterator<Item = Result<Record<F::Entry>, LogError>> + '_ {
        records_since(&self.records, since.max(self.pruned_through()))
    }

    /// Every record that carries command id `id`, in order.
    pub fn for_command(&self, id: &str) -> Result<Vec<Record<F::Entry>>, LogError> {
        self.query(&capstan_common::answers::LogRequest {
            command: Some(id.to_string()),
            ..Default::default()
        })
    }

    /// What is kept of command `id` once retention pruned its `command_received`
    /// (kept `pruned_ids_max_age_secs`, see [`retention`]).
    pub fn pruned_command(&self, id: &str) -> Result<Option<PrunedCommand>, LogError> {
        self.pruned.get(id)
    }

    /// Test seam: the retention clock (what kept pruned commands expire by, see
    /// `pruned`) goes `by` further at once, as if the agent had run that much longer.
    #[cfg(any(test, feature = "testing"))]
    pub fn advance_retention_clock(&self, by: std::time::Duration) {
        self.pruned.clock.advance(by);
    }

    /// Whether the log has received command `id`: its `command_received` is in the
    /// log, or was pruned and is kept (an unreadable entry counts: it is known).
    pub fn knows_command(&self, id: &str) -> bool {
        let received = self.for_command(id).is_ok_and(|records| {
            records
                .iter()
                .any(|r| matches!(r.event.command_mark(), Some(CommandMark::Received { .. })))
        });
        received || !matches!(self.pruned.get(id), Ok(None))
    }

    /// Every record about `namespace/workload`, in order.
    pub fn for_workload(
        &self,
        namespace: &str,
        workload: &str,
    ) -> Result<Vec<Record<F::Entry>>, LogError> {
        self.query(&capstan_common::answers::LogRequest {
            namespace: Some(namespace.to_string()),
            workload: Some(workload.to_string()),
            ..Default::default()
        })
    }

    /// Flushes everything written so far (used on orderly shutdown).
    pub fn flush(&self) -> Result<(), LogError> {
        self.db.flush().map(|_| ()).map_err(LogError::Storage)
    }
}

/// The record `seq` in `records`, checked against its own hash.
fn get_record<E: Entry>(records: &Records, seq: u64) -> Result<Option<Record<E>>, LogError> {
    match records.get(seq)? {
        Some(stored) => codec::open_record(seq, &stored)
            .map(|(r, _)| Some(r))
            .map_err(LogError::Corrupt),
        None => Ok(None),
    }
}

/// The records in `records` with seq greater than `since`, in order, each checked
/// against its own hash.
fn records_since<E: Entry>(
    records: &Records,
    since: u64,
) -> impl Iterator<Item = Result<Record<E>, LogError>> + '_ {
    records.range(since.saturating_add(1)).map(|entry| {
        let (seq, value) = entry.map_err(LogError::from)?;
        codec::open_record(seq, &value)
            .map(|(r, _)| r)
            .map_err(LogError::Corrupt)
    })
}

/// Why reading the records stopped.
#[derive(Debug)]
enum ScanError {
    Corrupt(Corruption),
    Storage(sled::Error),
}

impl From<ScanError> for LogError {
    fn from(e: ScanError) -> LogError {
        match e {
            ScanError::Corrupt(c) => LogError::Corrupt(c),
            ScanError::Storage(e) => LogError::Storage(e),
        }
    }
}

/// The storage layout of the log in `dir` (`capstan-agent log layout`), read without
/// converting or writing anything of the log: `Some("2")`, `Some("1")` for a log a
/// build before layout 2 wrote, a newer build's marker as found (`Some("3")`), or
/// `Some("unknown")` for data in no layout it can name; `None` when there is no log.
/// Fails while another process holds the log (ask the running agent instead).
pub fn layout_of(dir: &Path) -> Result<Option<String>, LogError> {
    layout::of(dir)
}

/// The layout a running agent's log is in: this build's.
pub fn current_layout() -> &'static str {
    layout::current()
}

/// Test support: writes at `dir` (where no log is) the database a later build with
/// storage layout `layout` might leave: its marker, `written_by` = `build`, and a
/// tree of records this build has no name for.
#[doc(hidden)]
pub fn write_future_layout(dir: &Path, layout: &str, build: &str) -> Result<(), LogError> {
    let db = layout::open_raw(dir)?;
    let write = || -> Result<(), sled::Error> {
        db.insert(b"layout", layout.as_bytes())?;
        db.insert(b"written_by", build.as_bytes())?;
        db.open_tree(format!("records_v{layout}"))?
            .insert(1u64.to_be_bytes(), &b"a record"[..])?;
        db.flush().map(drop)
    };
    write().map_err(LogError::Storage)?;
    drop(db);
    db_lock::wait_until_released(&dir.join("db"));
    Ok(())
}

/// Test support (feature `testing`): flips one byte of a stored record in the log at
/// `dir`, bypassing the chain, the way an attacker editing the database would. The log
/// must not be open.
#[cfg(any(test, feature = "testing"))]
pub fn tamper_flip_byte<E: Entry>(dir: &Path, seq: u64, offset: usize) -> Result<(), LogError> {
    layout::prepare::<E>(dir)?;
    let db = sled::Config::new()
        .path(dir)
        .open()
        .map_err(|source| LogError::Open {
            path: dir.to_path_buf(),
            source,
        })?;
    let records = Records::new(db.open_tree(records::TREE).map_err(LogError::Storage)?);
    let mut value = records.get(seq)?.map(|v| v.to_vec()).unwrap_or_default();
    if let Some(byte) = value.get_mut(offset) {
        *byte ^= 0x01;
    }
    records.put_raw(seq, &value)?;
    db.flush().map_err(LogError::Storage)?;
    drop((records, db));
    db_lock::wait_until_released(&dir.join("db"));
    Ok(())
}

#[cfg(test)]
mod testkit;
#[cfg(test)]
pub(crate) mod tests;
