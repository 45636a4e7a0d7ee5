//! A test-only format 3, made the way a real one would be: a copy of [`v2`] with one
//! field added to one event (`WorkloadExited` gains `signal`), an upcaster
//! `From<v2::Record>`, and a decoder that dispatches on the version and chains
//! v1 → v2 → v3.

use super::{from_bincode, v1, v2, StoredError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub at_ms: i64,
    pub prev_hash: [u8; 32],
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    CommandReceived {
        command_id: String,
        op: String,
        namespace: String,
        workload: Option<String>,
        revision: Option<String>,
        command: String,
    },
    CommandRejected {
        command_id: Option<String>,
        code: String,
        message: String,
    },
    CommandCompleted {
        command_id: String,
        outcome: String,
        code: Option<String>,
        message: Option<String>,
    },
    NamespaceReady {
        command_id: String,
        namespace: String,
    },
    NamespaceDeleted {
        command_id: String,
        namespace: String,
    },
    RevisionPrepared {
        command_id: String,
        namespace: String,
        workload: String,
        revision: String,
        spec: String,
    },
    WorkloadStarted {
        cause: v2::Cause,
        namespace: String,
        workload: String,
        revision: String,
        previous: Option<String>,
    },
    WorkloadStopped {
        cause: v2::Cause,
        namespace: String,
        workload: String,
        revision: Option<String>,
    },
    RevisionRetired {
        command_id: String,
        namespace: String,
        workload: String,
        revision: String,
    },
    WorkloadFailed {
        cause: v2::Cause,
        namespace: String,
        workload: String,
        code: String,
        message: String,
    },
    WorkloadExited {
        namespace: String,
        workload: String,
        revision: String,
        exit_code: Option<i64>,
        /// New in format 3.
        signal: Option<i32>,
    },
    DriftDetected {
        namespace: String,
        workload: String,
        revision: String,
        reaped: bool,
    },
    HookStarted {
        command_id: String,
        phase: String,
        owner: String,
    },
    HookSucceeded {
        command_id: String,
        phase: String,
        owner: String,
    },
    HookFailed {
        command_id: String,
        phase: String,
        owner: String,
        code: String,
    },
}

impl From<v2::Record> for Record {
    fn from(r: v2::Record) -> Self {
        let event = match r.event {
            v2::Event::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
            } => Event::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
                signal: None,
            },
            // The other kinds did not change: moved across by name.
            unchanged => serde_json::from_value(serde_json::to_value(unchanged).unwrap())
                .expect("an unchanged kind has the same fields"),
        };
        Record {
            seq: r.seq,
            at_ms: r.at_ms,
            prev_hash: r.prev_hash,
            event,
        }
    }
}

/// What `stored::decode` would become with format 3 current.
pub fn decode(stored: &[u8]) -> Result<Record, StoredError> {
    let (&version, body) = stored.split_first().ok_or(StoredError::UnknownFormat(0))?;
    Ok(match version {
        1 => Record::from(v2::Record::from(from_bincode::<v1::Record>(body)?)),
        2 => Record::from(from_bincode::<v2::Record>(body)?),
        3 => from_bincode::<Record>(body)?,
        v => return Err(StoredError::UnknownFormat(v)),
    })
}
