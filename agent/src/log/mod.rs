//! The agent's log: [`capstan_log`]'s durable, hash-chained log of [`Event`] records,
//! folded into the [`Intent`]. This module says what the log needs of them — how an
//! event is stored ([`stored`]: one shape per format version, upcast on read), the
//! ids it is indexed by, the commands it receives and completes, and how the intent
//! folds and weighs — and names the log's types for the agent. Everything about
//! storage (sled, the chain, snapshots, retention) is `capstan_log`'s.

mod stored;

pub use capstan_log::{
    anchor, current_layout, export, layout_of, retention, uses_index, wait_until_released,
    write_future_layout, Corruption, Defect, LogError, LogOptions, Pace, PrunedCommand, BUILD,
    LAYOUTS, RECORDS_TREE,
};

/// One event of every kind (tests of the events' JSON).
#[cfg(test)]
pub(crate) use stored::samples;

use crate::event::{Event, Record};
use crate::intent::Intent;
use capstan_log::{CommandMark, StoredError};

/// The agent's log: events, folded into the intent.
pub type Log = capstan_log::Log<Intent>;
/// The agent's log opened for reading only (`capstan-agent log` without a daemon).
pub type LogReader = capstan_log::LogReader<Event>;

impl capstan_log::Entry for Event {
    fn encode(&self, seq: u64, at_ms: i64, prev_hash: [u8; 32]) -> Result<Vec<u8>, StoredError> {
        stored::encode(seq, at_ms, prev_hash, self)
    }

    fn decode(content: &[u8]) -> Result<Record, StoredError> {
        stored::decode(content)
    }

    fn kind(&self) -> &'static str {
        Event::kind(self)
    }

    fn command_id(&self) -> Option<&str> {
        Event::command_id(self)
    }

    fn namespace(&self) -> Option<&str> {
        Event::namespace(self)
    }

    fn workload(&self) -> Option<&str> {
        Event::workload(self)
    }

    fn command_mark(&self) -> Option<CommandMark<'_>> {
        match self {
            Event::CommandReceived {
                command_id,
                command,
                ..
            } => Some(CommandMark::Received {
                id: command_id,
                command,
            }),
            Event::CommandCompleted {
                command_id,
                outcome,
                code,
                message,
            } => Some(CommandMark::Completed {
                id: command_id,
                outcome: *outcome,
                code: *code,
                message: message.as_deref(),
            }),
            _ => None,
        }
    }
}

impl capstan_log::Fold for Intent {
    type Entry = Event;

    fn apply(&mut self, seq: u64, event: &Event) {
        Intent::apply(self, seq, event);
    }

    /// Its workloads: a snapshot costs as much as the intent is large.
    fn weight(&self) -> u64 {
        self.workloads.len() as u64
    }

    /// The oldest in-flight command's `command_received`: what recovery resumes it
    /// from, and what a duplicate is told apart by.
    fn oldest_needed(&self) -> Option<u64> {
        self.in_flight.values().min().copied()
    }
}

/// Decodes `content` (`[format version][body]`) as a stored record, as the log does
/// once a record's hash checks out: the record, or the defect found. Never panics and
/// never allocates what a length field claims, whatever the bytes (the fuzz target
/// `record`, `fuzz/`, holds it to that).
pub fn decode_record(seq: u64, content: &[u8]) -> Result<Record, Corruption> {
    capstan_log::decode_record(seq, content)
}

/// Test support (feature `testing`): flips one byte of a stored record in the log at
/// `dir`, bypassing the chain, the way an attacker editing the database would. The log
/// must not be open.
#[cfg(any(test, feature = "testing"))]
pub fn tamper_flip_byte(dir: &std::path::Path, seq: u64, offset: usize) -> Result<(), LogError> {
    capstan_log::tamper_flip_byte::<Event>(dir, seq, offset)
}

#[cfg(test)]
mod fixtures;
