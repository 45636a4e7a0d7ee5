//! Format version 1, FROZEN: the shapes records had when the log stored the domain
//! types themselves (commit 52ed7a3), exactly as bincode positions them. Every enum's
//! variant order and every struct's field order is part of the format: never change
//! anything here. Old records are read through these types and upcast to the current
//! format ([`From<Record> for v2::Record`](super::v2::Record)).

use super::{spell, v2};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub at_ms: i64,
    pub prev_hash: [u8; 32],
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Command(String),
    AgentShutdown,
    AgentStartup,
    Supervisor,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
        code: ErrorCode,
        message: String,
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
    NamespaceDeleted {
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
        code: ErrorCode,
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
        phase: Phase,
        owner: String,
    },
    HookSucceeded {
        command_id: String,
        phase: Phase,
        owner: String,
    },
    HookFailed {
        command_id: String,
        phase: Phase,
        owner: String,
        code: ErrorCode,
    },
}

/// The spec as it was stored: every field present, in this order. Its JSON (same
/// names, same enum spellings) is the spec's canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub driver: DriverKind,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    pub mounts: Vec<Mount>,
    pub ports: Vec<PortMapping>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub container_port: u16,
    pub host_port: u16,
    pub host_ip: Option<String>,
    pub protocol: Protocol,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    Sim,
    Docker,
    Systemd,
    Kube,
}

/// The error codes in the order format 1 numbered them (`ImageNotFound` after
/// `LogFailed`; authorisation codes last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    TooLarge,
    InvalidJson,
    UnsupportedVersion,
    UnknownOp,
    InvalidCommand,
    InvalidId,
    InvalidName,
    InvalidTimestamp,
    InvalidEnv,
    InvalidSpec,
    WrongHost,
    NamespaceNotFound,
    NamespaceNotEmpty,
    WorkloadNotFound,
    RevisionNotFound,
    RevisionConflict,
    RevisionRetired,
    NoActiveRevision,
    DriverFailed,
    BackendMissing,
    LogDegraded,
    LogFailed,
    ImageNotFound,
    HookFailed,
    LaunchEnvRejected,
    Cancelled,
    Interrupted,
    Unsigned,
    BadSignature,
    Expired,
    IssuedInFuture,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    Rejected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    AfterNamespacePrepared,
    BeforeWorkloadStart,
    BeforeWorkloadStop,
    BeforeNamespaceDelete,
}

impl From<Cause> for v2::Cause {
    fn from(cause: Cause) -> Self {
        match cause {
            Cause::Command(id) => v2::Cause::Command(id),
            Cause::AgentShutdown => v2::Cause::AgentShutdown,
            Cause::AgentStartup => v2::Cause::AgentStartup,
            Cause::Supervisor => v2::Cause::Supervisor,
        }
    }
}

/// The spec's canonical JSON: these types serialise exactly as the wire `Spec` did.
fn spec_json(spec: &Spec) -> String {
    serde_json::to_string(spec).expect("strings, lists and string maps always serialise")
}

/// The upcast: a format-1 record as format 2 holds it. Positions become spellings and
/// the spec becomes its JSON; the record's meaning (and its JSON form) is unchanged.
impl From<Record> for v2::Record {
    fn from(r: Record) -> Self {
        use v2::Event as V2;
        let event = match r.event {
            Event::CommandReceived {
                command_id,
                op,
                namespace,
                workload,
                revision,
                command,
            } => V2::CommandReceived {
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
            } => V2::CommandRejected {
                command_id,
                code: spell(&code),
                message,
            },
            Event::CommandCompleted {
                command_id,
                outcome,
                code,
                message,
            } => V2::CommandCompleted {
                command_id,
                outcome: spell(&outcome),
                code: code.as_ref().map(spell),
                message,
            },
            Event::NamespaceReady {
                command_id,
                namespace,
            } => V2::NamespaceReady {
                command_id,
                namespace,
            },
            Event::NamespaceDeleted {
                command_id,
                namespace,
            } => V2::NamespaceDeleted {
                command_id,
                namespace,
            },
            Event::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec,
            } => V2::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec: spec_json(&spec),
            },
            Event::WorkloadStarted {
                cause,
                namespace,
                workload,
                revision,
                previous,
            } => V2::WorkloadStarted {
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
            } => V2::WorkloadStopped {
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
            } => V2::RevisionRetired {
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
            } => V2::WorkloadFailed {
                cause: cause.into(),
                namespace,
                workload,
                code: spell(&code),
                message,
            },
            Event::WorkloadExited {
                namespace,
                workload,
                revision,
                exit_code,
            } => V2::WorkloadExited {
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
            } => V2::DriftDetected {
                namespace,
                workload,
                revision,
                reaped,
            },
            Event::HookStarted {
                command_id,
                phase,
                owner,
            } => V2::HookStarted {
                command_id,
                phase: spell(&phase),
                owner,
            },
            Event::HookSucceeded {
                command_id,
                phase,
                owner,
            } => V2::HookSucceeded {
                command_id,
                phase: spell(&phase),
                owner,
            },
            Event::HookFailed {
                command_id,
                phase,
                owner,
                code,
            } => V2::HookFailed {
                command_id,
                phase: spell(&phase),
                owner,
                code: spell(&code),
            },
        };
        v2::Record {
            seq: r.seq,
            at_ms: r.at_ms,
            prev_hash: r.prev_hash,
            event,
        }
    }
}
