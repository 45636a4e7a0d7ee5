//! Audit queries through the log's indexes: by command id (`by_command`), by workload
//! (`by_workload`) and by time range (`by_time`), alone or combined, each from a seq.
//!
//! `by_time`: `[at_ms with its sign bit flipped, big-endian][seq, big-endian]` → ∅ for
//! every record, so keys sort by time, then seq. Record time is not monotone in seq (a
//! wall clock may step back), so a time range is answered from this index, never by
//! bisecting seqs: the index holds each record under its own time, whatever came
//! before. A log written before this index existed has no `by_time` tree (or one whose
//! build was interrupted): [`Log::open`] builds it from the records, then writes the
//! [`COMPLETE`] marker, so a crash mid-build only means building again. A
//! [`super::LogReader`] never builds it: until it is complete, it answers a time
//! range by a scan.
//!
//! A query picks one index: the command's or the workload's when it names one (their
//! records are few; a time range then filters them), else the time index when it has a
//! range, else it scans from `since`. Records come back in seq order, so a caller can
//! page by passing the last seq back as `since`.

use super::{codec, index_key, key_seq, seq_key, seq_of_index, Log, LogError};
use crate::event::{Event, Record};
use capstan_common::wire::LogRequest;

/// The key in `by_time` that says the index covers every record (any other key is 16
/// bytes long).
const COMPLETE: &[u8] = b"";

/// Records indexed per batch while building `by_time` on open.
const BUILD_BATCH: usize = 10_000;

/// The `by_time` key of the record `seq` appended at `at_ms`.
pub(super) fn time_key(at_ms: i64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&((at_ms as u64) ^ (1 << 63)).to_be_bytes());
    k[8..].copy_from_slice(&seq_key(seq));
    k
}

fn seq_of_time_key(key: &[u8]) -> Option<u64> {
    (key.len() == 16).then(|| seq_of_index(key))
}

/// Every index key of one record: what [`Log::append`] writes with it and a prune
/// (`retention.rs`) removes.
pub(super) struct IndexKeys {
    pub command: Option<Vec<u8>>,
    pub workload: Option<Vec<u8>>,
    pub time: [u8; 16],
}

impl IndexKeys {
    pub fn of(seq: u64, at_ms: i64, event: &Event) -> IndexKeys {
        IndexKeys {
            command: event.command_id().map(|id| index_key(id, seq)),
            workload: match (event.namespace(), event.workload()) {
                (Some(ns), Some(wl)) => Some(index_key(&capstan_common::workload_key(ns, wl), seq)),
                _ => None,
            },
            time: time_key(at_ms, seq),
        }
    }
}

/// Opens `by_time` in `db`, building it from `records` when it is missing or its build
/// was interrupted.
pub(super) fn open_time_index(db: &sled::Db, records: &sled::Tree) -> Result<sled::Tree, LogError> {
    let tree = db.open_tree("by_time").map_err(LogError::Storage)?;
    if time_index_complete(&tree)? {
        return Ok(tree);
    }
    let started = std::time::Instant::now();
    let mut batch = sled::Batch::default();
    let (mut pending, mut indexed) = (0, 0u64);
    for entry in records.iter() {
        let (key, value) = entry.map_err(LogError::Storage)?;
        let seq = key_seq(&key).unwrap_or(0);
        // A record that fails its hash has no time to trust; verification reports it.
        let Ok((record, _)) = codec::open_record(seq, &value) else {
            continue;
        };
        batch.insert(&time_key(record.at_ms, seq), &[] as &[u8]);
        pending += 1;
        indexed += 1;
        if pending == BUILD_BATCH {
            tree.apply_batch(std::mem::take(&mut batch))
                .map_err(LogError::Storage)?;
            pending = 0;
        }
    }
    tree.apply_batch(batch).map_err(LogError::Storage)?;
    db.flush().map_err(LogError::Storage)?;
    tree.insert(COMPLETE, &[] as &[u8])
        .map_err(LogError::Storage)?;
    if indexed > 0 {
        tracing::info!(
            records = indexed,
            ms = started.elapsed().as_millis() as u64,
            "log: built the time index (a log written before it existed)"
        );
    }
    Ok(tree)
}

/// Whether `request` is answered from an index (else by a scan from `since`).
pub fn uses_index(request: &LogRequest) -> bool {
    request.command.is_some()
        || (request.namespace.is_some() && request.workload.is_some())
        || request.since_time.is_some()
        || request.until_time.is_some()
}

/// The trees a query reads: an open log's (its time index always complete, see
/// [`open_time_index`]) or a [`super::LogReader`]'s.
pub(super) struct Indexes<'a> {
    pub records: &'a sled::Tree,
    pub by_command: &'a sled::Tree,
    pub by_workload: &'a sled::Tree,
    /// `None` while the time index is not complete: a time range is then answered
    /// by a scan from `since`.
    pub by_time: Option<&'a sled::Tree>,
}

impl Indexes<'_> {
    /// The records `request` asks for (see [`Record::matches`]), in seq order, at most
    /// `request.limit` of them, through the narrowest index (module docs). A record
    /// that fails its hash is an error.
    pub fn query(&self, request: &LogRequest) -> Result<Vec<Record>, LogError> {
        let limit = request.limit.unwrap_or(usize::MAX);
        let since = request.since;
        let timed = request.since_time.is_some() || request.until_time.is_some();
        let seqs: Box<dyn Iterator<Item = Result<u64, LogError>>> = match (
            &request.command,
            &request.namespace,
            &request.workload,
            self.by_time,
        ) {
            (Some(id), _, _, _) => Box::new(indexed_from(self.by_command, id, since)),
            (None, Some(ns), Some(wl), _) => Box::new(indexed_from(
                self.by_workload,
                &capstan_common::workload_key(ns, wl),
                since,
            )),
            (_, _, _, Some(by_time)) if timed => {
                Box::new(in_time_range(by_time, request)?.into_iter().map(Ok))
            }
            _ => {
                let scan = super::records_since(self.records, since).filter(|r| match r {
                    Ok(r) => r.matches(request),
                    Err(_) => true,
                });
                return scan.take(limit).collect();
            }
        };
        let mut out = Vec::new();
        for seq in seqs {
            if out.len() == limit {
                break;
            }
            if let Some(record) = super::get_record(self.records, seq?)? {
                if record.matches(request) {
                    out.push(record);
                }
            }
        }
        Ok(out)
    }
}

/// The seqs after `since` under `prefix \0` in `tree`, in order, read lazily.
fn indexed_from<'a>(
    tree: &'a sled::Tree,
    prefix: &str,
    since: u64,
) -> impl Iterator<Item = Result<u64, LogError>> + 'a {
    let start = index_key(prefix, since.saturating_add(1));
    let mut end = prefix.as_bytes().to_vec();
    end.push(1);
    let len = prefix.len() + 9;
    tree.range(start..end)
        .keys()
        .filter_map(move |key| match key {
            Ok(key) if key.len() == len => Some(Ok(seq_of_index(&key))),
            Ok(_) => None,
            Err(e) => Some(Err(LogError::Storage(e))),
        })
}

/// The seqs after `request.since` whose time is in the request's range, in seq
/// order (the index holds them in time order).
fn in_time_range(by_time: &sled::Tree, request: &LogRequest) -> Result<Vec<u64>, LogError> {
    let from = request
        .since_time
        .map_or(i64::MIN, |t| t.timestamp_millis());
    let start = time_key(from, 0);
    let keys = match request.until_time {
        // Up to and including the until-time's millisecond; matches() is exact.
        Some(t) if t.timestamp_millis() < i64::MAX => {
            by_time.range(start..time_key(t.timestamp_millis() + 1, 0))
        }
        _ => by_time.range(start..),
    };
    let mut seqs = Vec::new();
    for key in keys.keys() {
        let key = key.map_err(LogError::Storage)?;
        if let Some(seq) = seq_of_time_key(&key).filter(|s| *s > request.since) {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Whether the time index `by_time` covers every record (its build finished).
pub(super) fn time_index_complete(by_time: &sled::Tree) -> Result<bool, LogError> {
    by_time.contains_key(COMPLETE).map_err(LogError::Storage)
}

impl Log {
    /// The records `request` asks for: [`Indexes::query`] on this log's trees.
    pub fn query(&self, request: &LogRequest) -> Result<Vec<Record>, LogError> {
        Indexes {
            records: &self.records,
            by_command: &self.by_command,
            by_workload: &self.by_workload,
            by_time: Some(&self.by_time),
        }
        .query(request)
    }
}

#[cfg(test)]
#[path = "query_tests.rs"]
pub(super) mod tests;
