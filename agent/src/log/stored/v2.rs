//! Format version 2, the current one. Records are positional bincode like format 1,
//! but the parts that evolve elsewhere are self-describing:
//! - a spec is its canonical JSON, so `#[serde(default)]` fields added to
//!   [`capstan_common::Spec`] decode from records written before they existed;
//! - error codes, outcomes and phases are their stable `snake_case` spellings, so the
//!   wire enums may gain or reorder variants freely.
//!
//! What stays positional is this file's own: the event variants (a new kind is
//! appended at the end of [`Event`]) and each variant's fields (adding one means a
//! format 3: copy this module, add the field, write `From<v2::Record> for v3::Record`).
//! Once released, this file only changes by appending event variants.

use super::{parse, spell, StoredError};
use crate::event as domain;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub at_ms: i64,
    pub prev_hash: [u8; 32],
    pub event: Event,
}

/// Why a workload started or stopped; positional, new causes appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cause {
    Command(String),
    AgentShutdown,
    AgentStartup,
    Supervisor,
}

/// `code`, `outcome` and `phase` hold spellings (`hook_failed`, `succeeded`,
/// `before_workload_start`); `spec` holds the spec's canonical JSON.
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
        cause: Cause,
        namespace: String,
        workload: String,
        revision: String,
        previous: Option<String>,
    },
    WorkloadStopped {
        cause: Cause,
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
        cause: Cause,
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
    /// `hook_started` naming the revision the call is about (appended: the records
    /// before it have [`Event::HookStarted`], decoded with no revision).
    HookStartedFor {
        command_id: String,
        phase: String,
        owner: String,
        revision: String,
    },
    /// `cancel_requested` (appended).
    CancelRequested { command_id: String, by: String },
}

impl From<&domain::Cause> for Cause {
    fn from(cause: &domain::Cause) -> Self {
        match cause {
            domain::Cause::Command(id) => Cause::Command(id.clone()),
            domain::Cause::AgentShutdown => Cause::AgentShutdown,
            domain::Cause::AgentStartup => Cause::AgentStartup,
            domain::Cause::Supervisor => Cause::Supervisor,
        }
    }
}

impl From<Cause> for domain::Cause {
    fn from(cause: Cause) -> Self {
        match cause {
            Cause::Command(id) => domain::Cause::Command(id),
            Cause::AgentShutdown => domain::Cause::AgentShutdown,
            Cause::AgentStartup => domain::Cause::AgentStartup,
            Cause::Supervisor => domain::Cause::Supervisor,
        }
    }
}

impl Event {
    /// The stored form of a domain event.
    pub fn from_domain(event: &domain::Event) -> Result<Event, StoredError> {
        use domain::Event as D;
        let s = String::clone;
        Ok(match event {
            D::CommandReceived {
                command_id,
                op,
                namespace,
                workload,
                revision,
                command,
            } => Event::CommandReceived {
                command_id: s(command_id),
                op: s(op),
                namespace: s(namespace),
                workload: workload.clone(),
                revision: revision.clone(),
                command: s(command),
            },
            D::CommandRejected {
                command_id,
                code,
                message,
            } => Event::CommandRejected {
                command_id: command_id.clone(),
                code: spell(code),
                message: s(message),
            },
            D::CommandCompleted {
                command_id,
                outcome,
                code,
                message,
            } => Event::CommandCompleted {
                command_id: s(command_id),
                outcome: spell(outcome),
                code: code.as_ref().map(spell),
                message: message.clone(),
            },
            D::NamespaceReady {
                command_id,
                namespace,
            } => Event::NamespaceReady {
                command_id: s(command_id),
                namespace: s(namespace),
            },
            D::NamespaceDeleted {
                command_id,
                namespace,
            } => Event::NamespaceDeleted {
                command_id: s(command_id),
                namespace: s(namespace),
            },
            D::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec,
            } => Event::RevisionPrepared {
                command_id: s(command_id),
                namespace: s(namespace),
                workload: s(workload),
                revision: s(revision),
                spec: serde_json::to_string(spec).map_err(StoredError::Json)?,
            },
            D::WorkloadStarted {
                cause,
                namespace,
                workload,
                revision,
                previous,
            } => Event::WorkloadStarted {
                cause: cause.into(),
                namespace: s(namespace),
                workload: s(workload),
                revision: s(revision),
                previous: previous.clone(),
            },
            D::WorkloadStopped {
                cause,
                namespace,
                workload,
                revision,
            } => Event::WorkloadStopped {
                cause: cause.into(),
                namespace: s(namespace),
                workload: s(workload),
                revision: revision.clone(),
            },
            D::RevisionRetired {
                command_id,
                namespace,
                workload,
                revision,
            } => Event::RevisionRetired {
                command_id: s(command_id),
                namespace: s(namespace),
                workload: s(workload),
                revision: s(revision),
            },
            D::WorkloadFailed {
                cause,
                namespace,
                workload,
                code,
                message,
            } => Event::WorkloadFailed {
                cause: cause.into(),
                namespace: s(namespace),
                workload: s(workload),
                code: spell(code),
                message: s(message),
            },
            D::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
            } => Event::WorkloadExited {
                namespace: s(namespace),
                workload: s(workload),
                revision: s(revision),
                exit_code: *exit_code,
            },
            D::DriftDetected {
                namespace,
                workload,
                revision,
                reaped,
            } => Event::DriftDetected {
                namespace: s(namespace),
                workload: s(workload),
                revision: s(revision),
                reaped: *reaped,
            },
            D::HookStarted {
                command_id,
                phase,
                owner,
                revision: None,
            } => Event::HookStarted {
                command_id: s(command_id),
                phase: spell(phase),
                owner: s(owner),
            },
            D::HookStarted {
                command_id,
                phase,
                owner,
                revision: Some(revision),
            } => Event::HookStartedFor {
                command_id: s(command_id),
                phase: spell(phase),
                owner: s(owner),
                revision: s(revision),
            },
            D::HookSucceeded {
                command_id,
                phase,
                owner,
            } => Event::HookSucceeded {
                command_id: s(command_id),
                phase: spell(phase),
                owner: s(owner),
            },
            D::HookFailed {
                command_id,
                phase,
                owner,
                code,
            } => Event::HookFailed {
                command_id: s(command_id),
                phase: spell(phase),
                owner: s(owner),
                code: spell(code),
            },
            D::CancelRequested { command_id, by } => Event::CancelRequested {
                command_id: s(command_id),
                by: s(by),
            },
        })
    }

    /// The domain event this stored event records.
    pub fn into_domain(self) -> Result<domain::Event, StoredError> {
        use domain::Event as D;
        Ok(match self {
            Event::CommandReceived {
                command_id,
                op,
                namespace,
                workload,
                revision,
                command,
            } => D::CommandReceived {
                command_id,
                op,
                namespace,
                workload,
                revision,
                command,
            },
            Event::CommandRejected {
                command_id,
                code,
                message,
            } => D::CommandRejected {
                command_id,
                code: parse(&code)?,
                message,
            },
            Event::CommandCompleted {
                command_id,
                outcome,
                code,
                message,
            } => D::CommandCompleted {
                command_id,
                outcome: parse(&outcome)?,
                code: code.as_deref().map(parse).transpose()?,
                message,
            },
            Event::NamespaceReady {
                command_id,
                namespace,
            } => D::NamespaceReady {
                command_id,
                namespace,
            },
            Event::NamespaceDeleted {
                command_id,
                namespace,
            } => D::NamespaceDeleted {
                command_id,
                namespace,
            },
            Event::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec,
            } => D::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec: serde_json::from_str(&spec).map_err(StoredError::Json)?,
            },
            Event::WorkloadStarted {
                cause,
                namespace,
                workload,
                revision,
                previous,
            } => D::WorkloadStarted {
                cause: cause.into(),
                namespace,
                workload,
                revision,
                previous,
            },
            Event::WorkloadStopped {
                cause,
                namespace,
                workload,
                revision,
            } => D::WorkloadStopped {
                cause: cause.into(),
                namespace,
                workload,
                revision,
            },
            Event::RevisionRetired {
                command_id,
                namespace,
                workload,
                revision,
            } => D::RevisionRetired {
                command_id,
                namespace,
                workload,
                revision,
            },
            Event::WorkloadFailed {
                cause,
                namespace,
                workload,
                code,
                message,
            } => D::WorkloadFailed {
                cause: cause.into(),
                namespace,
                workload,
                code: parse(&code)?,
                message,
            },
            Event::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
            } => D::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
            },
            Event::DriftDetected {
                namespace,
                workload,
                revision,
                reaped,
            } => D::DriftDetected {
                namespace,
                workload,
                revision,
                reaped,
            },
            Event::HookStarted {
                command_id,
                phase,
                owner,
            } => D::HookStarted {
                command_id,
                phase: parse(&phase)?,
                owner,
                revision: None,
            },
            Event::HookStartedFor {
                command_id,
                phase,
                owner,
                revision,
            } => D::HookStarted {
                command_id,
                phase: parse(&phase)?,
                owner,
                revision: Some(revision),
            },
            Event::HookSucceeded {
                command_id,
                phase,
                owner,
            } => D::HookSucceeded {
                command_id,
                phase: parse(&phase)?,
                owner,
            },
            Event::HookFailed {
                command_id,
                phase,
                owner,
                code,
            } => D::HookFailed {
                command_id,
                phase: parse(&phase)?,
                owner,
                code: parse(&code)?,
            },
            Event::CancelRequested { command_id, by } => D::CancelRequested { command_id, by },
        })
    }
}
