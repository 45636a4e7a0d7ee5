//! What the log keeps of commands whose records retention pruned, so that an id
//! answered once is never carried out again, however old: a coordinator's re-post of
//! the same id and content (re-signed, with a fresh `issued_at`) or a JetStream
//! redelivery is answered as a duplicate, and the id with other content is
//! `id_conflict`, as when the records are still in the log.
//!
//! Written by a prune before its anchor (see [`super::retention`]: sled recovers a
//! prefix of its writes, so once the anchor is there, so are these, and a crash never
//! leaves an id neither in the log nor here):
//!
//! - `pruned_ids`: command id → [`stored::Entry`]: the seq of its `command_received`,
//!   when it was pruned (the agent's wall clock: shown, never used to expire it), the
//!   SHA-256 of its content (`Command::content`: what `id_conflict` compares), and the
//!   outcome, code and message it completed with;
//! - `pruned_expiry`: `[retention clock, ms, BE][last pruned seq, BE]` →
//!   [`stored::Batch`], the ids that prune added, so that they expire together: a
//!   prune removes the batches kept longer than `pruned_ids_max_age_secs` by the
//!   retention clock ([`PrunedIds::expire`]), which bounds the set by the window;
//! - the default tree's `retention_clock` key: the [`RetentionClock`], ms, BE.
//!
//! **The retention clock** is how long retention has been running over the log's
//! life: the monotonic clock's time (`CLOCK_MONOTONIC`, which neither setting the
//! time nor an NTP step moves) summed over the agent's runs, stored at every prune.
//! Not the wall clock: a clock set forward by a year would have made the next prune
//! forget every kept id, and a command re-posted once the clock was put right would
//! have been carried out twice. It counts only time the agent ran (and a crash loses
//! what passed since the last prune), never more than the real time that passed: a
//! kept id stays at least its window, longer when the agent was down.
//!
//! `pruned_batches` (`[pruned at, wall ms, sign bit flipped, BE][last seq, BE]` →
//! [`stored::Batch`]) is where builds before this one kept their batches: the first
//! prune of this build moves each to `pruned_expiry` at the retention clock's time
//! then, so what an earlier build kept stays a whole window from the upgrade.

use super::codec::Hash;
use super::stored::pruned as stored;
use super::stored::{parse, spell};
use super::{CommandMark, Entry, LogError, Record};
use capstan_common::{Command, ErrorCode, Outcome};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The trees.
pub const IDS: &str = "pruned_ids";
pub const EXPIRY: &str = "pruned_expiry";
/// Where builds before the retention clock kept their batches (wall-clock keys).
pub const OLD_BATCHES: &str = "pruned_batches";
/// The default tree's key holding the retention clock.
const CLOCK_KEY: &[u8] = b"retention_clock";

/// What the log keeps of one command whose records were pruned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedCommand {
    /// The seq its `command_received` had.
    pub received_seq: u64,
    /// When it was pruned (ms since the epoch).
    pub pruned_at_ms: i64,
    /// SHA-256 of its content; `None` when the stored command did not parse.
    content: Option<Hash>,
    pub outcome: Outcome,
    pub code: Option<ErrorCode>,
    pub message: Option<String>,
}

impl PrunedCommand {
    /// What is kept of a command received at `received_seq` as `command` (the JSON
    /// its `command_received` stores) that completed as `outcome`, `code` and
    /// `message`, once pruned at `pruned_at_ms`.
    pub fn new(
        received_seq: u64,
        pruned_at_ms: i64,
        command: &str,
        outcome: Outcome,
        code: Option<ErrorCode>,
        message: Option<String>,
    ) -> PrunedCommand {
        PrunedCommand {
            received_seq,
            pruned_at_ms,
            content: stored_content(command),
            outcome,
            code,
            message,
        }
    }

    /// Whether `command` is what this id was received as (everything but `issued_at`
    /// and `sig`, [`Command::content`]); `None` when that cannot be told.
    pub fn same_content(&self, command: &Command) -> Option<bool> {
        self.content.map(|c| c == content_hash(command))
    }

    fn to_stored(&self) -> stored::Entry {
        stored::Entry {
            received_seq: self.received_seq,
            pruned_at_ms: self.pruned_at_ms,
            content: self.content,
            outcome: spell(&self.outcome),
            code: self.code.as_ref().map(spell),
            message: self.message.clone(),
        }
    }

    fn from_stored(e: stored::Entry) -> Result<PrunedCommand, LogError> {
        Ok(PrunedCommand {
            received_seq: e.received_seq,
            pruned_at_ms: e.pruned_at_ms,
            content: e.content,
            outcome: parse(&e.outcome).map_err(LogError::PrunedIds)?,
            code: e
                .code
                .as_deref()
                .map(parse)
                .transpose()
                .map_err(LogError::PrunedIds)?,
            message: e.message,
        })
    }
}

fn content_hash(command: &Command) -> Hash {
    Sha256::digest(command.content().as_bytes()).into()
}

/// The content hash of a stored command's JSON; `None` when it does not parse.
fn stored_content(command: &str) -> Option<Hash> {
    Command::parse(command).ok().map(|c| content_hash(&c))
}

/// How a command completed.
type Completion = (Outcome, Option<ErrorCode>, Option<String>);

/// The completion `record` is, if it is one.
fn completion<E: Entry>(record: &Record<E>) -> Option<(&str, Completion)> {
    match record.event.command_mark() {
        Some(CommandMark::Completed {
            id,
            outcome,
            code,
            message,
        }) => Some((id, (outcome, code, message.map(str::to_string)))),
        _ => None,
    }
}

/// Gathers, from the records a prune removes (in seq order), the commands whose
/// `command_received` is among them.
#[derive(Default)]
pub(super) struct Collector {
    received: BTreeMap<String, (u64, Option<Hash>)>,
    completed: BTreeMap<String, Completion>,
}

impl Collector {
    pub fn add<E: Entry>(&mut self, record: &Record<E>) {
        if let Some(CommandMark::Received { id, command }) = record.event.command_mark() {
            let content = stored_content(command);
            self.received.insert(id.to_string(), (record.seq, content));
        } else if let Some((id, done)) = completion(record) {
            if self.received.contains_key(id) {
                self.completed.insert(id.to_string(), done);
            }
        }
    }

    /// The entries, pruned at `now_ms`. A command completed after the pruned records
    /// has its completion looked up in `later` (its records still in the log); one
    /// with none there (in flight: a prune never cuts through one, see
    /// [`super::retention::prunable`]) is an error, not an entry without an answer.
    pub fn finish<E: Entry>(
        self,
        now_ms: i64,
        later: impl Fn(&str) -> Result<Vec<Record<E>>, LogError>,
    ) -> Result<Vec<(String, PrunedCommand)>, LogError> {
        let Collector {
            received,
            mut completed,
        } = self;
        let mut entries = Vec::with_capacity(received.len());
        for (id, (received_seq, content)) in received {
            let done = match completed.remove(&id) {
                Some(done) => done,
                None => later(&id)?
                    .iter()
                    .find_map(|r| completion(r).map(|(_, done)| done))
                    .ok_or_else(|| LogError::InFlight { id: id.clone() })?,
            };
            let (outcome, code, message) = done;
            entries.push((
                id,
                PrunedCommand {
                    received_seq,
                    pruned_at_ms: now_ms,
                    content,
                    outcome,
                    code,
                    message,
                },
            ));
        }
        Ok(entries)
    }
}

/// The batch key of a prune at retention clock `clock_ms` whose last pruned seq is
/// `last`.
fn batch_key(clock_ms: u64, last: u64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&clock_ms.to_be_bytes());
    key[8..].copy_from_slice(&last.to_be_bytes());
    key
}

/// The last pruned seq a batch key names.
fn batch_last(key: &[u8]) -> u64 {
    key.get(8..16)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes)
}

/// The retention clock (see the module): what was stored when the log was opened,
/// plus the monotonic time since.
pub(super) struct RetentionClock {
    stored: Duration,
    opened: Instant,
    /// Test seam: time added as if the agent had run that much longer.
    #[cfg(any(test, feature = "testing"))]
    skew: std::sync::Mutex<Duration>,
}

impl RetentionClock {
    fn read(db: &sled::Db) -> Result<RetentionClock, LogError> {
        let stored = db.get(CLOCK_KEY).map_err(LogError::Storage)?;
        let ms = stored
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes);
        Ok(RetentionClock {
            stored: Duration::from_millis(ms),
            opened: Instant::now(),
            #[cfg(any(test, feature = "testing"))]
            skew: Default::default(),
        })
    }

    /// Its time now.
    pub fn now(&self) -> Duration {
        self.stored
            .saturating_add(self.opened.elapsed())
            .saturating_add(self.skew())
    }

    #[cfg(any(test, feature = "testing"))]
    fn skew(&self) -> Duration {
        *self.skew.lock().expect("clock skew lock")
    }

    #[cfg(not(any(test, feature = "testing")))]
    fn skew(&self) -> Duration {
        Duration::ZERO
    }

    /// Test seam: the clock goes `by` further at once.
    #[cfg(any(test, feature = "testing"))]
    pub fn advance(&self, by: Duration) {
        *self.skew.lock().expect("clock skew lock") += by;
    }
}

/// `d` in whole ms.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The trees, and the retention clock.
pub(super) struct PrunedIds {
    db: sled::Db,
    pub ids: sled::Tree,
    pub batches: sled::Tree,
    old_batches: sled::Tree,
    pub clock: RetentionClock,
}

impl PrunedIds {
    pub fn open(db: &sled::Db) -> Result<PrunedIds, LogError> {
        let tree = |name| db.open_tree(name).map_err(LogError::Storage);
        Ok(PrunedIds {
            db: db.clone(),
            ids: tree(IDS)?,
            batches: tree(EXPIRY)?,
            old_batches: tree(OLD_BATCHES)?,
            clock: RetentionClock::read(db)?,
        })
    }

    /// What is kept of command `id`, if its records were pruned.
    pub fn get(&self, id: &str) -> Result<Option<PrunedCommand>, LogError> {
        match self.ids.get(id.as_bytes()).map_err(LogError::Storage)? {
            Some(bytes) => {
                let entry = stored::decode(&bytes).map_err(LogError::PrunedIds)?;
                PrunedCommand::from_stored(entry).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Stores `entries` (not yet flushed), and their batch under the retention clock's
    /// time `clock` and `last`, for a prune of `first..=last`. An id already here (a
    /// prune a crash interrupted, done again) is overwritten, and the interrupted
    /// prune's batch (the newest, naming records from `first` on: its anchor was never
    /// written) is taken into this one, so nothing it named expires before the redo's.
    pub fn write(
        &self,
        entries: &[(String, PrunedCommand)],
        clock: Duration,
        first: u64,
        last: u64,
    ) -> Result<(), LogError> {
        let mut ids: Vec<String> = Vec::new();
        if let Some((key, bytes)) = self.batches.last().map_err(LogError::Storage)? {
            if batch_last(&key) >= first {
                // An unreadable batch cannot name its ids: they stay for ever.
                if let Ok(b) = stored::decode::<stored::Batch>(&bytes) {
                    ids = b.ids;
                }
                self.batches.remove(key).map_err(LogError::Storage)?;
            }
        }
        if entries.is_empty() && ids.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (id, entry) in entries {
            let bytes = stored::encode(&entry.to_stored()).map_err(LogError::Encode)?;
            batch.insert(id.as_bytes(), bytes);
        }
        self.ids.apply_batch(batch).map_err(LogError::Storage)?;
        for (id, _) in entries {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let bytes = stored::encode(&stored::Batch { ids }).map_err(LogError::Encode)?;
        self.batches
            .insert(batch_key(ms(clock), last), bytes)
            .map_err(LogError::Storage)?;
        Ok(())
    }

    /// Stores the retention clock's time now (not yet flushed: a crash only makes the
    /// kept ids stay longer) and returns it; first moves the batches an earlier build
    /// kept by the wall clock to that time.
    pub fn tick(&self) -> Result<Duration, LogError> {
        let now = self.clock.now();
        for item in self.old_batches.iter() {
            let (key, bytes) = item.map_err(LogError::Storage)?;
            let moved = batch_key(ms(now), batch_last(&key));
            self.batches
                .insert(moved, bytes)
                .map_err(LogError::Storage)?;
            self.old_batches.remove(key).map_err(LogError::Storage)?;
        }
        self.db
            .insert(CLOCK_KEY, &ms(now).to_be_bytes())
            .map_err(LogError::Storage)?;
        Ok(now)
    }

    /// Removes the entries of the batches written more than `max_age` ago by the
    /// retention clock at `now`, batch by batch; how many went.
    pub fn expire(&self, now: Duration, max_age: Duration) -> Result<usize, LogError> {
        let Some(cutoff) = now.checked_sub(max_age) else {
            return Ok(0);
        };
        let mut removed = 0;
        for item in self.batches.range(..batch_key(ms(cutoff), 0)) {
            let (key, bytes) = item.map_err(LogError::Storage)?;
            // An unreadable batch cannot name its ids: it goes, and they stay.
            let ids =
                stored::decode::<stored::Batch>(&bytes).map_or_else(|_| Vec::new(), |b| b.ids);
            for id in ids {
                if self
                    .ids
                    .remove(id.as_bytes())
                    .map_err(LogError::Storage)?
                    .is_some()
                {
                    removed += 1;
                }
            }
            self.batches.remove(key).map_err(LogError::Storage)?;
        }
        Ok(removed)
    }

    /// How many pruned commands are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests;
