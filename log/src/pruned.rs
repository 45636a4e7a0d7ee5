//! What the log keeps of commands whose records retention pruned, so that an id
//! answered once is never carried out again, however old: a coordinator's re-post of
//! the same id and content (re-signed, with a fresh `issued_at`) or a JetStream
//! redelivery is answered as a duplicate, and the id with other content is
//! `id_conflict`, as when the records are still in the log.
//!
//! Two trees, written by a prune before its anchor (see [`super::retention`]: sled
//! recovers a prefix of its writes, so once the anchor is there, so are these, and a
//! crash never leaves an id neither in the log nor here):
//!
//! - `pruned_ids`: command id → [`stored::Entry`]: the seq of its `command_received`,
//!   when it was pruned, the SHA-256 of its content (`Command::content`: what
//!   `id_conflict` compares), and the outcome, code and message it completed with;
//! - `pruned_batches`: `[pruned at, ms, sign bit flipped, BE][last pruned seq, BE]` →
//!   [`stored::Batch`], the ids that prune added, so that they expire together: a
//!   prune removes the entries pruned longer ago than `pruned_ids_max_age_secs`
//!   ([`PrunedIds::expire`]), which bounds the set by the window.

use super::codec::Hash;
use super::stored::pruned as stored;
use super::stored::{parse, spell};
use super::{CommandMark, Entry, LogError, Record};
use capstan_common::{Command, ErrorCode, Outcome};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The trees.
pub const IDS: &str = "pruned_ids";
pub const BATCHES: &str = "pruned_batches";

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
            let content = Command::parse(command).ok().map(|c| content_hash(&c));
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

/// The batch key of a prune at `at_ms` whose last pruned seq is `last`.
fn batch_key(at_ms: i64, last: u64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&((at_ms as u64) ^ (1 << 63)).to_be_bytes());
    key[8..].copy_from_slice(&last.to_be_bytes());
    key
}

/// The two trees.
pub(super) struct PrunedIds {
    pub ids: sled::Tree,
    pub batches: sled::Tree,
}

impl PrunedIds {
    pub fn open(db: &sled::Db) -> Result<PrunedIds, LogError> {
        let tree = |name| db.open_tree(name).map_err(LogError::Storage);
        Ok(PrunedIds {
            ids: tree(IDS)?,
            batches: tree(BATCHES)?,
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

    /// Stores `entries` (not yet flushed), and their batch under `at_ms` and `last`.
    /// An id already here (a prune a crash interrupted, done again) is overwritten.
    pub fn write(
        &self,
        entries: &[(String, PrunedCommand)],
        at_ms: i64,
        last: u64,
    ) -> Result<(), LogError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (id, entry) in entries {
            let bytes = stored::encode(&entry.to_stored()).map_err(LogError::Encode)?;
            batch.insert(id.as_bytes(), bytes);
        }
        self.ids.apply_batch(batch).map_err(LogError::Storage)?;
        let ids = stored::Batch {
            ids: entries.iter().map(|(id, _)| id.clone()).collect(),
        };
        let bytes = stored::encode(&ids).map_err(LogError::Encode)?;
        self.batches
            .insert(batch_key(at_ms, last), bytes)
            .map_err(LogError::Storage)?;
        Ok(())
    }

    /// Removes the entries pruned before `cutoff_ms`, batch by batch; how many went.
    /// An entry written again by a later prune (a newer `pruned_at_ms`) stays.
    pub fn expire(&self, cutoff_ms: i64) -> Result<usize, LogError> {
        let mut removed = 0;
        for item in self.batches.range(..batch_key(cutoff_ms, 0)) {
            let (key, bytes) = item.map_err(LogError::Storage)?;
            // An unreadable batch cannot name its ids: it goes, and they stay.
            let ids =
                stored::decode::<stored::Batch>(&bytes).map_or_else(|_| Vec::new(), |b| b.ids);
            for id in ids {
                let due = match self.get(&id) {
                    Ok(Some(entry)) => entry.pruned_at_ms < cutoff_ms,
                    Ok(None) => false,
                    // Unreadable: never answered anyway, nothing to keep it for.
                    Err(LogError::PrunedIds(_)) => true,
                    Err(e) => return Err(e),
                };
                if due {
                    self.ids.remove(id.as_bytes()).map_err(LogError::Storage)?;
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
