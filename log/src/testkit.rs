//! The entries and fold this crate's tests log: a few events shaped like the agent's
//! (the ids they are indexed by, a command received and completed, a spec), a fold
//! that counts what they name, and a stored format of their own (version 1: bincode
//! of the record with the event as JSON text).

use crate::stored::{encode_as, from_bincode, StoredError};
use crate::{CommandMark, Entry, Fold, Record};
use capstan_common::{Command, DriverKind, ErrorCode, Op, Outcome, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The log under test.
pub type Log = crate::Log<Intent>;
/// The log under test, opened for reading.
pub type LogReader = crate::LogReader<Event>;

/// Who asked for a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Command(String),
    Supervisor,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // as the agent's: a spec is carried inline
pub enum Event {
    CommandReceived {
        command_id: String,
        op: String,
        namespace: String,
        workload: Option<String>,
        revision: Option<String>,
        command: String,
    },
    CommandCompleted {
        command_id: String,
        outcome: Outcome,
        code: Option<ErrorCode>,
        message: Option<String>,
    },
    NamespaceReady {
        command_id: String,
        namespace: String,
    },
    RevisionPrepared {
        command_id: String,
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
    },
    WorkloadStarted {
        cause: Cause,
        namespace: String,
        workload: String,
        revision: String,
        previous: Option<String>,
    },
}

/// The stored record, format 1.
#[derive(Serialize, Deserialize)]
struct Stored {
    seq: u64,
    at_ms: i64,
    prev_hash: [u8; 32],
    event: String,
}

impl Entry for Event {
    fn encode(&self, seq: u64, at_ms: i64, prev_hash: [u8; 32]) -> Result<Vec<u8>, StoredError> {
        let event = serde_json::to_string(self).map_err(StoredError::Json)?;
        encode_as(
            1,
            &Stored {
                seq,
                at_ms,
                prev_hash,
                event,
            },
        )
    }

    fn decode(content: &[u8]) -> Result<Record<Event>, StoredError> {
        match content.split_first() {
            Some((1, body)) => {
                let s: Stored = from_bincode(body)?;
                Ok(Record {
                    seq: s.seq,
                    at_ms: s.at_ms,
                    prev_hash: s.prev_hash,
                    event: serde_json::from_str(&s.event).map_err(StoredError::Json)?,
                })
            }
            Some((&v, _)) => Err(StoredError::UnknownFormat(v)),
            None => Err(StoredError::UnknownFormat(0)),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Event::CommandReceived { .. } => "command_received",
            Event::CommandCompleted { .. } => "command_completed",
            Event::NamespaceReady { .. } => "namespace_ready",
            Event::RevisionPrepared { .. } => "revision_prepared",
            Event::WorkloadStarted { .. } => "workload_started",
        }
    }

    fn command_id(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { command_id, .. }
            | Event::CommandCompleted { command_id, .. }
            | Event::NamespaceReady { command_id, .. }
            | Event::RevisionPrepared { command_id, .. } => Some(command_id),
            Event::WorkloadStarted {
                cause: Cause::Command(id),
                ..
            } => Some(id),
            Event::WorkloadStarted { .. } => None,
        }
    }

    fn namespace(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { namespace, .. }
            | Event::NamespaceReady { namespace, .. }
            | Event::RevisionPrepared { namespace, .. }
            | Event::WorkloadStarted { namespace, .. } => Some(namespace),
            Event::CommandCompleted { .. } => None,
        }
    }

    fn workload(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { workload, .. } => workload.as_deref(),
            Event::RevisionPrepared { workload, .. } | Event::WorkloadStarted { workload, .. } => {
                Some(workload)
            }
            _ => None,
        }
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

/// What the events name: the namespaces made ready, each workload's running (or
/// only prepared) revision, and the commands received and not completed, by the seq
/// of their `command_received`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub namespaces: BTreeMap<String, BTreeSet<String>>,
    pub workloads: BTreeMap<String, Option<String>>,
    pub in_flight: BTreeMap<String, u64>,
}

impl Fold for Intent {
    type Entry = Event;

    fn apply(&mut self, seq: u64, event: &Event) {
        match event {
            Event::CommandReceived { command_id, .. } => {
                self.in_flight.insert(command_id.clone(), seq);
            }
            Event::CommandCompleted { command_id, .. } => {
                self.in_flight.remove(command_id);
            }
            Event::NamespaceReady { namespace, .. } => {
                self.namespaces.entry(namespace.clone()).or_default();
            }
            Event::RevisionPrepared {
                namespace,
                workload,
                ..
            } => {
                self.namespaces
                    .entry(namespace.clone())
                    .or_default()
                    .insert(workload.clone());
                self.workloads
                    .entry(capstan_common::workload_key(namespace, workload))
                    .or_default();
            }
            Event::WorkloadStarted {
                namespace,
                workload,
                revision,
                ..
            } => {
                let key = capstan_common::workload_key(namespace, workload);
                self.workloads.insert(key, Some(revision.clone()));
            }
        }
    }

    fn weight(&self) -> u64 {
        self.workloads.len() as u64
    }

    fn oldest_needed(&self) -> Option<u64> {
        self.in_flight.values().min().copied()
    }
}

/// A sim spec.
pub fn spec() -> Spec {
    Spec {
        driver: DriverKind::SIM,
        image: Some("img".into()),
        ..Spec::default()
    }
}

/// Revision `rev` of `ns/web` prepared with `spec`.
pub fn prepared(rev: &str, spec: Spec) -> Event {
    Event::RevisionPrepared {
        command_id: format!("p-{rev}"),
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        spec,
    }
}

/// Command `id` doing `op`, for host `h1`.
pub fn command(id: &str, op: Op) -> Command {
    Command {
        v: 1,
        id: id.into(),
        host: "h1".into(),
        issued_at: chrono::Utc::now(),
        deadline: None,
        op,
    }
}
