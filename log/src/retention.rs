//! Retention: pruning old records once they are safe elsewhere. `[log.retention]` in
//! `agent.toml` ([`RetentionConfig`], off by default) asks for at most `max_records`
//! records and/or none older than `max_age_secs`; every `interval_secs` the agent
//! prunes what the policy asks for and the rules allow ([`prunable`]):
//!
//! - only records already published to `CAPSTAN_EVT` (the outbox's acknowledged seq;
//!   without `[nats]`, only durable records);
//! - only records before the newest snapshot (the snapshot and everything after it
//!   stay, so opening rebuilds the intent as before);
//! - at most [`MAX_BATCH`] records a prune (memory stays bounded; the next prune
//!   goes on at once);
//! - nothing from the oldest command still in flight on (its `command_received` is
//!   what recovery resumes it from, and what a duplicate is told apart by).
//!
//! A prune ([`Log::prune`]) first exports the records, checked link by link, as
//! [`super::export`] lines to `capstan-log-<first>-<last>.jsonl` in `export_dir`,
//! fsync'd; then writes what [`super::pruned`] keeps of the commands received in them
//! (id, content hash, outcome: so an id is answered once, however old), then writes
//! and flushes the [`Anchor`] (the last pruned record's seq and hash, the count, the
//! file, the intent at that seq); only then removes the records, their index entries
//! and the snapshots at or before the anchor. A crash before the
//! anchor is written leaves a file that the next prune rewrites (same name, same
//! lines) or removes (another last seq); a crash after it leaves records at or below
//! the anchor, which opening, reading and verification ignore and the next prune
//! removes. Nothing is lost, nothing exported twice. Each prune also expires the
//! pruned commands kept longer than `pruned_ids_max_age_secs` by the retention clock
//! (the agent's running time, monotonic: see [`super::pruned`]).

use super::anchor::{self, Anchor};
use super::export::{self, ExportError};
use super::{postings, pruned, seq_key, snapshot, Fold, Log, LogError, ScanError};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The most records one prune removes.
pub const MAX_BATCH: u64 = 10_000;
/// The default `interval_secs`.
const DEFAULT_INTERVAL: u64 = 60;
/// The default `pruned_ids_max_age_secs`: 30 days.
pub const DEFAULT_PRUNED_IDS_MAX_AGE: u64 = 30 * 86_400;
/// How long the coordinator accepts a re-post of a command id (its
/// `commands_max_age`): the least a pruned id is kept, plus `[signing] max_age_secs`.
pub const REPOST_WINDOW: u64 = 7 * 86_400;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("invalid config: `[log.retention]` {0}")]
    Config(String),
    #[error("cannot prune the log")]
    Log(#[from] LogError),
    #[error("cannot export the records to prune")]
    Export(#[from] ExportError),
}

/// `[log.retention]`. Off unless `max_records` or `max_age_secs` is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Keep at most this many records (at least 1).
    pub max_records: Option<u64>,
    /// Prune records older than this (at least 1 s).
    pub max_age_secs: Option<u64>,
    /// Where pruned records are exported; required with a limit.
    pub export_dir: Option<PathBuf>,
    /// How often the agent prunes (1 to 86400 s, default 60).
    pub interval_secs: Option<u64>,
    /// How long what is kept of a pruned command stays (default 30 days; at least
    /// [`REPOST_WINDOW`] plus `[signing] max_age_secs`).
    pub pruned_ids_max_age_secs: Option<u64>,
}

/// A checked [`RetentionConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub max_records: Option<u64>,
    pub max_age: Option<Duration>,
    pub export_dir: PathBuf,
    pub interval: Duration,
    /// How long what is kept of a pruned command stays.
    pub pruned_ids_max_age: Duration,
}

impl RetentionConfig {
    /// The policy, `None` when retention is off, or what is wrong with it.
    /// `signing_max_age_secs`: `[signing] max_age_secs`, how long a re-posted
    /// command may wait for this host (part of the least `pruned_ids_max_age_secs`).
    pub fn policy(&self, signing_max_age_secs: u64) -> Result<Option<Policy>, RetentionError> {
        let bad = |what: &str| Err(RetentionError::Config(what.to_string()));
        if self.max_records == Some(0) {
            return bad("`max_records` must be at least 1");
        }
        if self.max_age_secs == Some(0) {
            return bad("`max_age_secs` must be at least 1");
        }
        let interval = self.interval_secs.unwrap_or(DEFAULT_INTERVAL);
        if !(1..=86_400).contains(&interval) {
            return bad("`interval_secs` must be 1 to 86400");
        }
        let least = REPOST_WINDOW.saturating_add(signing_max_age_secs);
        let ids_max_age = self
            .pruned_ids_max_age_secs
            .unwrap_or(DEFAULT_PRUNED_IDS_MAX_AGE.max(least));
        if ids_max_age < least {
            return Err(RetentionError::Config(format!(
                "`pruned_ids_max_age_secs` must be at least {least}: the coordinator's \
                 re-post window ({REPOST_WINDOW} s, 7 days) plus `[signing] max_age_secs` \
                 ({signing_max_age_secs})"
            )));
        }
        if self.max_records.is_none() && self.max_age_secs.is_none() {
            return Ok(None);
        }
        let Some(export_dir) = self.export_dir.clone() else {
            return bad("`export_dir` is required with `max_records` or `max_age_secs`");
        };
        if !export_dir.is_absolute() {
            return bad("`export_dir` must be an absolute path");
        }
        Ok(Some(Policy {
            max_records: self.max_records,
            max_age: self.max_age_secs.map(Duration::from_secs),
            export_dir,
            interval: Duration::from_secs(interval),
            pruned_ids_max_age: Duration::from_secs(ids_max_age),
        }))
    }
}

/// What [`prunable`] decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The first record still in the log (the anchor's seq + 1, or 1).
    pub first: u64,
    /// The last record.
    pub last: u64,
    /// The last record published to `CAPSTAN_EVT` (or durable, without NATS).
    pub published: u64,
    /// The newest usable snapshot's seq.
    pub snapshot: Option<u64>,
    /// The last record older than `max_age` (when there is one and a `max_age`).
    pub aged: Option<u64>,
    /// The `command_received` seq of the oldest command in flight, if any.
    pub in_flight: Option<u64>,
}

/// The last seq that may be pruned now, if any: what `max_records` or `max_age` asks
/// for, but nothing the outbox has still to send, nothing from the newest snapshot on
/// (and nothing at all without one), nothing from the oldest command in flight on,
/// and at most [`MAX_BATCH`] records.
pub fn prunable(max_records: Option<u64>, b: &Bounds) -> Option<u64> {
    let by_count = max_records.map_or(0, |keep| b.last.saturating_sub(keep));
    let wanted = by_count.max(b.aged.unwrap_or(0));
    let allowed = b
        .published
        .min(b.snapshot.map_or(0, |s| s.saturating_sub(1)))
        .min(b.in_flight.map_or(u64::MAX, |s| s.saturating_sub(1)));
    let upto = wanted
        .min(allowed)
        .min(b.first.saturating_add(MAX_BATCH - 1));
    (upto >= b.first).then_some(upto)
}

/// One prune: records `first..=last` went to `file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub first: u64,
    pub last: u64,
    pub file: PathBuf,
}

impl<F: Fold> Log<F> {
    /// The anchor, once records were pruned.
    pub fn anchor(&self) -> Result<Option<Anchor<F>>, LogError> {
        anchor::read(&self.db.open_tree(anchor::TREE).map_err(LogError::Storage)?)
    }

    /// Prunes once under `policy` (see the module), `published` being the last seq
    /// the outbox had acknowledged, at `now_ms` (the wall clock: what `max_age` is
    /// measured by, and the kept commands' `pruned_at_ms`; they expire by the
    /// retention clock, see [`super::pruned`]): what went where, or `None` when
    /// nothing may be pruned now.
    pub fn prune(
        &self,
        policy: &Policy,
        published: u64,
        now_ms: i64,
    ) -> Result<Option<Pruned>, RetentionError> {
        let anchors = self.db.open_tree(anchor::TREE).map_err(LogError::Storage)?;
        let old = anchor::read::<F>(&anchors)?;
        let first = old.as_ref().map_or(1, |a| a.seq + 1);
        // What a crash after the last anchor left behind.
        self.remove_through(first - 1)?;
        let snapshot = snapshot::newest::<F>(&self.snapshots, |seq| self.records.hash_of(seq))
            .map_err(LogError::Storage)?
            .map(|s| s.seq);
        let last = self.last_seq();
        let aged = match policy.max_age {
            Some(age) => {
                let cutoff = now_ms.saturating_sub(millis(age));
                self.aged_through(first, published.min(last), cutoff)?
            }
            None => None,
        };
        let in_flight = self.with_intent(F::oldest_needed);
        let bounds = Bounds {
            first,
            last,
            published,
            snapshot,
            aged,
            in_flight,
        };
        // Kept ids expire by the retention clock, which a clock jump cannot move
        // (`pruned`), not by `now_ms`.
        let clock = self.pruned.tick()?;
        self.pruned.expire(clock, policy.pruned_ids_max_age)?;
        let Some(upto) = prunable(policy.max_records, &bounds) else {
            return Ok(None);
        };
        let (mut intent, prev) = match &old {
            Some(a) => (a.intent.clone(), a.hash),
            None => (F::default(), [0; 32]),
        };
        let mut lines = Vec::new();
        let mut commands = pruned::Collector::default();
        let mut hash = prev;
        let count = upto - first + 1;
        for item in Self::scan(&self.records, first - 1, first, prev).take(count as usize) {
            let (record, h) = match item {
                Ok(ok) => ok,
                Err(ScanError::Corrupt(c)) => return Err(LogError::Corrupt(c).into()),
                Err(ScanError::Storage(e)) => return Err(LogError::Storage(e).into()),
            };
            let stored = self.records.get(record.seq)?.unwrap_or_default();
            lines.push(export::line(&record, &stored));
            intent.apply(record.seq, &record.event);
            commands.add(&record);
            hash = h;
        }
        if lines.len() as u64 != count {
            // The records vanished under us: nothing to anchor to.
            return Ok(None);
        }
        let file = export::file_name(&policy.export_dir, first, upto);
        export::write_durably(&file, &lines)?;
        export::remove_leftovers(&policy.export_dir, first, &file)?;
        // What an id is answered with once its records are gone, written before the
        // anchor: a crash never leaves an id neither in the log nor kept.
        let later = |id: &str| {
            let records = self.for_command(id)?;
            Ok(records.into_iter().filter(|r| r.seq > upto).collect())
        };
        let entries = commands.finish(now_ms, later)?;
        self.pruned.write(&entries, clock, first, upto)?;
        let pruned = old.as_ref().map_or(0, |a| a.pruned) + count;
        anchor::write(
            &anchors,
            &Anchor {
                seq: upto,
                hash,
                pruned,
                file: file.clone(),
                intent,
            },
        )?;
        self.flush()?;
        // From here on nothing at or below the anchor is read, while it is removed.
        self.pruned_through
            .fetch_max(upto, std::sync::atomic::Ordering::Release);
        self.remove_through(upto)?;
        Ok(Some(Pruned {
            first,
            last: upto,
            file,
        }))
    }

    /// The last record from `first` to `limit` appended before `cutoff_ms` (looking
    /// at most [`MAX_BATCH`] records ahead).
    fn aged_through(
        &self,
        first: u64,
        limit: u64,
        cutoff_ms: i64,
    ) -> Result<Option<u64>, LogError> {
        let mut aged = None;
        for record in self.read_since(first - 1).take(MAX_BATCH as usize) {
            let record = record?;
            if record.seq > limit || record.at_ms >= cutoff_ms {
                break;
            }
            aged = Some(record.seq);
        }
        Ok(aged)
    }

    /// Removes the records up to `seq`, their index entries, and the snapshots up to
    /// `seq` (the anchor covers them all).
    pub(super) fn remove_through(&self, seq: u64) -> Result<(), LogError> {
        // The lists the removed records are in.
        let (mut commands, mut workloads, mut minutes) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for entry in self.records.range(0) {
            let (at, value) = match entry {
                Ok(ok) => ok,
                // A chunk that does not parse names no index entries; it goes below.
                Err(ScanError::Corrupt(_)) => continue,
                Err(ScanError::Storage(e)) => return Err(LogError::Storage(e)),
            };
            if at > seq {
                break;
            }
            // A record that does not decode has no index entries we could name.
            if let Ok((record, _)) = super::codec::open_record::<F::Entry>(at, &value) {
                let index = super::query::IndexKeys::of(at, record.at_ms, &record.event);
                commands.extend(index.command);
                workloads.extend(index.workload);
                minutes.insert(index.minute);
            }
        }
        // An append writes a list's head or the newest chunk without a transaction
        // (see `tip.rs`): each one is rewritten here while holding the tail, so that
        // no append writes it in between.
        let held = || self.tail.lock().expect("log lock");
        for key in &commands {
            let _tail = held();
            postings::remove(&self.by_command, key, 8, seq)?;
        }
        for key in &workloads {
            let _tail = held();
            postings::remove(&self.by_workload, key, 8, seq)?;
        }
        for key in &minutes {
            let _tail = held();
            postings::remove(&self.by_time, key, 16, seq)?;
        }
        {
            let _tail = held();
            self.records.remove_through(seq)?;
        }
        for key in self.snapshots.range(..=seq_key(seq)).keys() {
            self.snapshots
                .remove(key.map_err(LogError::Storage)?)
                .map_err(LogError::Storage)?;
        }
        Ok(())
    }
}

/// `d` in ms, as the log's times are.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Prunes under `policy` every `policy.interval` until `stop`. `published`: the
/// outbox's acknowledged seq; `None` without NATS (then only durable records).
pub async fn run<F: Fold>(
    log: Arc<Log<F>>,
    policy: Policy,
    published: Option<watch::Receiver<u64>>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(policy.interval) => {}
            _ = stop.cancelled() => return,
        }
        let upto = match &published {
            Some(p) => *p.borrow(),
            None => {
                let last = log.last_seq();
                if log.durable(last).await.is_err() {
                    continue;
                }
                last
            }
        };
        let (l, p) = (Arc::clone(&log), policy.clone());
        let task = tokio::task::spawn_blocking(move || {
            let mut done = Vec::new();
            loop {
                let now = chrono::Utc::now().timestamp_millis();
                match l.prune(&p, upto, now) {
                    Ok(Some(pruned)) => done.push(pruned),
                    Ok(None) => return Ok(done),
                    Err(e) => return Err((done, e)),
                }
            }
        });
        let (done, error) = match task.await.expect("the prune panicked") {
            Ok(done) => (done, None),
            Err((done, e)) => (done, Some(e)),
        };
        for p in &done {
            tracing::info!(first = p.first, last = p.last, file = %p.file.display(), "log records exported and pruned");
        }
        if let Some(e) = error {
            tracing::warn!(error = %capstan_common::report(&e), "log retention failed; retrying at the next interval");
        }
    }
}

#[cfg(test)]
mod tests;
