//! Audit queries through the log's indexes (posting lists, see [`super::postings`]):
//! by command id (`by_command`: the id's seqs), by workload (`by_workload`: the
//! `namespace/workload`'s seqs) and by time range (`by_time`: for each minute, the
//! seq and time of every record appended in it), alone or combined, each from a seq.
//!
//! Record time is not monotone in seq (a wall clock may step back), so a time range is
//! answered from `by_time`, never by bisecting seqs: each record is listed under the
//! minute of its own time, whatever came before.
//!
//! A query picks one index: the command's or the workload's when it names one (their
//! records are few; a time range then filters them), else the time index when it has a
//! range, else it scans from `since`. Records come back in seq order, so a caller can
//! page by passing the last seq back as `since`.

use super::records::Records;
use super::{postings, Entry, Fold, Log, LogError, Record};
use capstan_common::answers::LogRequest;

/// A time bucket of `by_time`: one minute.
const MINUTE_MS: i64 = 60_000;

/// An `i64` as 8 bytes that sort as the numbers do.
fn sortable(n: i64) -> [u8; 8] {
    ((n as u64) ^ (1 << 63)).to_be_bytes()
}

fn unsortable(b: &[u8]) -> i64 {
    (u64::from_be_bytes(b.try_into().unwrap_or_default()) ^ (1 << 63)) as i64
}

/// The `by_time` key of the minute holding `at_ms`.
fn minute_key(at_ms: i64) -> [u8; 8] {
    sortable(at_ms.div_euclid(MINUTE_MS))
}

/// What a record adds to each index (what [`Log::append`] writes with it and a prune
/// (`retention.rs`) removes): its command id's list, its workload's list, and its
/// minute's list in `by_time`, whose entries are `[seq][at_ms, sortable]`.
pub(super) struct IndexKeys {
    pub command: Option<Vec<u8>>,
    pub workload: Option<Vec<u8>>,
    pub minute: [u8; 8],
    pub time_entry: [u8; 16],
}

impl IndexKeys {
    pub fn of(seq: u64, at_ms: i64, event: &impl Entry) -> IndexKeys {
        let mut time_entry = [0u8; 16];
        time_entry[..8].copy_from_slice(&seq.to_be_bytes());
        time_entry[8..].copy_from_slice(&sortable(at_ms));
        IndexKeys {
            command: event.command_id().map(|id| id.as_bytes().to_vec()),
            workload: match (event.namespace(), event.workload()) {
                (Some(ns), Some(wl)) => Some(capstan_common::workload_key(ns, wl).into_bytes()),
                _ => None,
            },
            minute: minute_key(at_ms),
            time_entry,
        }
    }
}

/// Whether `request` is answered from an index (else by a scan from `since`).
pub fn uses_index(request: &LogRequest) -> bool {
    request.command.is_some()
        || (request.namespace.is_some() && request.workload.is_some())
        || request.since_time.is_some()
        || request.until_time.is_some()
}

/// The trees a query reads: an open log's or a [`super::LogReader`]'s.
pub(super) struct Indexes<'a> {
    pub records: &'a Records,
    pub by_command: &'a sled::Tree,
    pub by_workload: &'a sled::Tree,
    pub by_time: &'a sled::Tree,
}

impl Indexes<'_> {
    /// The records `request` asks for (see [`Record::matches`]), in seq order, at most
    /// `request.limit` of them, through the narrowest index (module docs). A record
    /// that fails its hash is an error.
    pub fn query<E: Entry>(&self, request: &LogRequest) -> Result<Vec<Record<E>>, LogError> {
        let limit = request.limit.unwrap_or(usize::MAX);
        let since = request.since;
        let timed = request.since_time.is_some() || request.until_time.is_some();
        let seqs = match (&request.command, &request.namespace, &request.workload) {
            (Some(id), _, _) => listed_after(self.by_command, id.as_bytes(), since)?,
            (None, Some(ns), Some(wl)) => listed_after(
                self.by_workload,
                capstan_common::workload_key(ns, wl).as_bytes(),
                since,
            )?,
            _ if timed => in_time_range(self.by_time, request)?,
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
            if let Some(record) = super::get_record(self.records, seq)? {
                if record.matches(request) {
                    out.push(record);
                }
            }
        }
        Ok(out)
    }
}

/// The seqs after `since` in `key`'s list in `tree`, in order.
fn listed_after(tree: &sled::Tree, key: &[u8], since: u64) -> Result<Vec<u64>, LogError> {
    let entries = postings::read(tree, key)?;
    Ok(entries
        .chunks_exact(8)
        .map(|e| u64::from_be_bytes(e.try_into().expect("8 bytes")))
        .filter(|seq| *seq > since)
        .collect())
}

/// The seqs after `request.since` whose time is in the request's range, in seq
/// order: the minutes of the range read from `by_time`, their entries filtered by
/// exact time.
fn in_time_range(by_time: &sled::Tree, request: &LogRequest) -> Result<Vec<u64>, LogError> {
    let from = request
        .since_time
        .map_or(i64::MIN, |t| t.timestamp_millis());
    // Up to and including the until-time's millisecond; matches() is exact.
    let until = request
        .until_time
        .map_or(i64::MAX, |t| t.timestamp_millis());
    let (first, last) = (from.div_euclid(MINUTE_MS), until.div_euclid(MINUTE_MS));
    let end = match last.checked_add(1) {
        Some(next) => sortable(next).to_vec(),
        None => vec![0xff; 9],
    };
    let mut seqs = Vec::new();
    for (_, entries) in postings::read_range(by_time, 8, &sortable(first), &end)? {
        for e in entries.chunks_exact(16) {
            let seq = u64::from_be_bytes(e[..8].try_into().expect("8 bytes"));
            let at = unsortable(&e[8..]);
            if seq > request.since && (from..=until).contains(&at) {
                seqs.push(seq);
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

impl<F: Fold> Log<F> {
    /// The records `request` asks for: [`Indexes::query`] on this log's trees.
    /// Records at or below the anchor are not shown, even while a prune is still
    /// removing them.
    pub fn query(&self, request: &LogRequest) -> Result<Vec<Record<F::Entry>>, LogError> {
        let request = LogRequest {
            since: request.since.max(self.pruned_through()),
            ..request.clone()
        };
        Indexes {
            records: &self.records,
            by_command: &self.by_command,
            by_workload: &self.by_workload,
            by_time: &self.by_time,
        }
        .query(&request)
    }
}

#[cfg(test)]
pub(super) mod tests;
