//! What can be wrong with the log: a bad record or snapshot ([`Corruption`]), and
//! the errors of its operations ([`LogError`]).

use super::stored;
use sled::transaction::TransactionError;
use std::path::PathBuf;

/// What is wrong with a stored record (or with the snapshot stored at its seq).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    Truncated,
    HashMismatch,
    UnknownFormat(u8),
    Undecodable,
    /// Its key and its own seq disagree, or a seq is missing.
    OutOfSequence,
    /// Its `prev_hash` is not the previous record's hash.
    ChainBroken,
    /// The snapshot stored at this seq is damaged or unreadable.
    SnapshotDamaged,
    /// The snapshot at this seq is not anchored to the record at this seq.
    SnapshotUnanchored,
    /// The snapshot at this seq holds an intent other than the fold of the records
    /// up to it (forged, or written by a faulty build).
    SnapshotForged,
    /// The anchor (where the chain starts after a prune) is damaged or unreadable.
    AnchorDamaged,
}

impl std::fmt::Display for Defect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Defect::Truncated => f.write_str("stored record is truncated"),
            Defect::HashMismatch => {
                f.write_str("content does not match its hash (modified on disk)")
            }
            Defect::UnknownFormat(v) => write!(f, "unknown format version {v}"),
            Defect::Undecodable => f.write_str("record cannot be decoded"),
            Defect::OutOfSequence => f.write_str("record is out of sequence"),
            Defect::ChainBroken => {
                f.write_str("prev_hash does not match the previous record: the chain is broken")
            }
            Defect::SnapshotDamaged => f.write_str("the snapshot here is damaged"),
            Defect::SnapshotUnanchored => {
                f.write_str("the snapshot here does not match this record's hash")
            }
            Defect::SnapshotForged => {
                f.write_str("the snapshot here does not match the records up to it (forged)")
            }
            Defect::AnchorDamaged => f.write_str("the anchor of the pruned records is damaged"),
        }
    }
}

/// The first bad record (or snapshot) found. While a log has one, it is read-only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {seq}: {defect}")]
pub struct Corruption {
    pub seq: u64,
    pub defect: Defect,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot open the log at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    /// The log's directory could not be made, or made the owner's alone (`0700`).
    #[error("cannot make the log's directory {path} (mode 0700)")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database holds records but not an index every log has: not a log this
    /// build wrote.
    #[error("the log at {path} has records but no {tree} index")]
    MissingTree { path: PathBuf, tree: &'static str },
    /// A log in an earlier storage layout, which only the agent converts (once, when
    /// it opens the log).
    #[error("the log at {path} is in an earlier storage layout: start the agent once (it converts the log when it opens it), then read it")]
    OldLayout { path: PathBuf },
    /// A log in a layout this build does not read (a newer build's, or data it cannot
    /// tell): refused, never taken for an empty log.
    #[error(
        "the log at {path} is {found}; this build (capstan-agent {build}) reads storage layouts {reads}: run a build that reads it (`capstan-agent --version` lists the layouts a build reads)",
        build = super::layout::BUILD,
        reads = super::layout::reads()
    )]
    UnknownLayout {
        path: PathBuf,
        found: super::layout::Unknown,
    },
    /// Converting a log in an earlier layout failed on the file system (the copy
    /// beside it, or the renames that put it in place).
    #[error("cannot convert the log to the current storage layout at {path}")]
    Convert {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The log failed verification (on open, or in the background); it refuses writes.
    #[error("the log is degraded and read-only")]
    Degraded(#[source] Corruption),
    /// Verification found a bad record or snapshot.
    #[error("the log failed verification")]
    Corrupt(#[source] Corruption),
    #[error("log storage failed")]
    Storage(#[source] sled::Error),
    #[error("cannot encode a log record")]
    Encode(#[source] stored::StoredError),
    #[error("cannot encode a snapshot")]
    Snapshot(#[source] serde_json::Error),
    #[error("the log could not be made durable: {0}")]
    Flush(String),
    /// What the log keeps of a pruned command cannot be read (written by a newer
    /// build, or damaged).
    #[error("a pruned command's entry cannot be read")]
    PrunedIds(#[source] stored::StoredError),
    /// A prune reached a command that has not completed (a prune never cuts through
    /// one: it stops before the oldest command in flight).
    #[error("command {id} is in the records to prune and has not completed")]
    InFlight { id: String },
}

impl From<TransactionError<()>> for LogError {
    fn from(e: TransactionError<()>) -> Self {
        match e {
            TransactionError::Storage(s) => LogError::Storage(s),
            TransactionError::Abort(()) => unreachable!("log transactions never abort"),
        }
    }
}
