//! What the log is generic over: the [`Entry`] each record carries (its stored
//! formats, the ids it is indexed by, the command it receives or completes), and the
//! [`Fold`] the entries feed (the state a snapshot holds and opening rebuilds).
//! The agent's are its `Event` and `Intent`; the log names neither.

use crate::stored::StoredError;
use capstan_common::answers::LogRequest;
use capstan_common::{ErrorCode, Outcome};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;

/// One record of the log: an entry with its place in the hash chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<E> {
    pub seq: u64,
    /// Unix time in milliseconds when it was appended.
    pub at_ms: i64,
    /// The hash of the previous record (all zeroes for seq 1).
    pub prev_hash: [u8; 32],
    pub event: E,
}

/// What a record carries. Its JSON (`Serialize`, externally tagged: `{"<kind>":
/// {fields}}`) is the record's wire and export form; its stored form is its own
/// business, one shape per format version, written by [`Entry::encode`] and read,
/// in every version it ever had, by [`Entry::decode`].
pub trait Entry: Clone + Debug + PartialEq + Serialize + Send + Sync + 'static {
    /// `[format version][body]` of the record `(seq, at_ms, prev_hash, self)`, in the
    /// current format.
    fn encode(&self, seq: u64, at_ms: i64, prev_hash: [u8; 32]) -> Result<Vec<u8>, StoredError>;
    /// The record in `[format version][body]`, whatever version wrote it;
    /// [`StoredError::UnknownFormat`] for a version this build does not know. Must
    /// never panic, whatever the bytes.
    fn decode(content: &[u8]) -> Result<Record<Self>, StoredError>;
    /// The entry's kind, as its JSON names it.
    fn kind(&self) -> &'static str;
    /// The command it concerns, if any (indexed).
    fn command_id(&self) -> Option<&str>;
    /// The namespace it concerns, if any (indexed with the workload).
    fn namespace(&self) -> Option<&str>;
    /// The workload it concerns, if any.
    fn workload(&self) -> Option<&str>;
    /// Whether it receives or completes a command: what retention keeps of a
    /// command whose records it prunes (see `pruned`).
    fn command_mark(&self) -> Option<CommandMark<'_>>;
}

/// An entry's part in a command's life, as retention needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandMark<'a> {
    /// The command `id` was received as `command` (its JSON text).
    Received { id: &'a str, command: &'a str },
    /// The command `id` completed.
    Completed {
        id: &'a str,
        outcome: Outcome,
        code: Option<ErrorCode>,
        message: Option<&'a str>,
    },
}

/// The state the entries fold into. Opening rebuilds it (from a snapshot, which is
/// its JSON, and the records after), and every append folds into it in place.
pub trait Fold:
    Default + Clone + PartialEq + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    type Entry: Entry;
    /// Folds the record `seq`'s entry in. Pure, and total: every entry folds.
    fn apply(&mut self, seq: u64, entry: &Self::Entry);
    /// How large the state is, in units a snapshot's cost scales with (the agent:
    /// its workloads; see `LogOptions::snapshot_per_workload`).
    fn weight(&self) -> u64;
    /// The seq of the oldest record an unfinished command needs (the agent: the
    /// oldest in-flight command's `command_received`); retention keeps it and after.
    fn oldest_needed(&self) -> Option<u64>;
}

impl<E: Entry> Record<E> {
    /// Whether this record is one a `log` request asks for: after its `since`, of its
    /// command, namespace and workload when it names them, appended at or after its
    /// `since_time` and before its `until_time` when it gives them.
    pub fn matches(&self, request: &LogRequest) -> bool {
        let at = chrono::DateTime::from_timestamp_millis(self.at_ms);
        self.seq > request.since
            && request
                .since_time
                .is_none_or(|t| at.is_some_and(|at| at >= t))
            && request
                .until_time
                .is_none_or(|t| at.is_some_and(|at| at < t))
            && request
                .namespace
                .as_deref()
                .is_none_or(|n| self.event.namespace() == Some(n))
            && request
                .workload
                .as_deref()
                .is_none_or(|w| self.event.workload() == Some(w))
            && request
                .command
                .as_deref()
                .is_none_or(|c| self.event.command_id() == Some(c))
    }

    /// The JSON form used by `capstan-agent log --json` and the event stream:
    /// `seq`, `at`, `kind`, the ids it concerns, and the entry's own fields.
    pub fn to_json(&self) -> serde_json::Value {
        let at = chrono::DateTime::from_timestamp_millis(self.at_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default();
        let mut out = serde_json::json!({
            "seq": self.seq,
            "at": at,
            "kind": self.event.kind(),
            "prev_hash": hex(&self.prev_hash),
        });
        let fields = serde_json::to_value(&self.event).expect("entries serialise");
        if let Some(obj) = fields
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_object())
        {
            for (k, v) in obj {
                out[k] = v.clone();
            }
        }
        if let Some(id) = self.event.command_id() {
            out["command_id"] = id.into();
        }
        out
    }
}

/// Lower-case hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    capstan_common::signing::to_hex(bytes)
}
