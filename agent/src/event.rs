//! Events: what the log records, in the past tense. The log is the fold's only input
//! and the host's audit record, so an event says what was decided or what happened,
//! never what to do. Events never carry hook values or secrets.

use capstan_common::Phase;
use capstan_common::{ErrorCode, Outcome, Spec};
use serde::{Deserialize, Serialize};

/// Why a workload started or stopped. Only [`Cause::Command`] changes running intent:
/// an agent shutdown or a supervisor restart is infrastructure, not a user's wish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A controller command, by id.
    Command(String),
    /// The agent's graceful-shutdown sweep.
    AgentShutdown,
    /// The agent's startup reconciliation.
    AgentStartup,
    /// The agent's supervision: the supervisor acting on an exit, or the reconciler's
    /// look finding the host away from intent while the agent runs.
    Supervisor,
}

impl Cause {
    pub fn command_id(&self) -> Option<&str> {
        match self {
            Cause::Command(id) => Some(id),
            _ => None,
        }
    }
}

/// One thing that happened on this host. Its JSON is the wire form (the event stream,
/// `log --json`). How the log stores it is the log's business (`log/stored/`): see
/// "How to add an event kind" and "How to add a field" in `docs/architecture.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// `RevisionPrepared` carries a whole spec (~400 bytes): events live a page of records
// at a time, and boxing it would touch every use for nothing measurable.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// A valid command arrived and was written down before anything was done about it.
    /// `command` is its canonical JSON: the exact thing that was asked.
    CommandReceived {
        command_id: String,
        op: String,
        namespace: String,
        workload: Option<String>,
        revision: Option<String>,
        command: String,
    },
    /// Input that was not accepted: malformed, invalid or unauthorised.
    CommandRejected {
        command_id: Option<String>,
        code: ErrorCode,
        message: String,
    },
    /// The command is finished; nothing more will be done for it.
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
    /// `revision` runs; `previous`, if any, was stopped in favour of it.
    WorkloadStarted {
        cause: Cause,
        namespace: String,
        workload: String,
        revision: String,
        previous: Option<String>,
    },
    /// The workload's `revision` (if it had one running) was stopped.
    WorkloadStopped {
        cause: Cause,
        namespace: String,
        workload: String,
        revision: Option<String>,
    },
    /// The revision's runtime was removed; it can never run again.
    RevisionRetired {
        command_id: String,
        namespace: String,
        workload: String,
        revision: String,
    },
    /// The workload could not be brought to its intent (its backend is gone, a start
    /// failed). Intent is unchanged; the failure is visible until the next start.
    WorkloadFailed {
        cause: Cause,
        namespace: String,
        workload: String,
        code: ErrorCode,
        message: String,
    },
    /// A revision's process ended; `exit_code` when the backend knows it. Exits the
    /// agent caused (stops, activations) are recorded too: this is the audit of what
    /// the backend reported. Intent is unchanged.
    WorkloadExited {
        namespace: String,
        workload: String,
        revision: String,
        exit_code: Option<i64>,
    },
    /// The backend holds something labelled as this host's that intent does not know
    /// (or knows as retired); `reaped` when the agent removed it (`reap_orphans`).
    DriftDetected {
        namespace: String,
        workload: String,
        revision: String,
        reaped: bool,
    },
    /// A hook owner is about to be called for one of the command's phases (durable
    /// before the call, so a crash leaves a trace of every call that may have begun).
    /// `revision`: the revision the call grants or revokes access for (a workload
    /// phase), which is not always the command's own (an activation revokes the
    /// revision it replaced). `None` for namespace phases, and in records written
    /// before the field existed, where it is the command's revision (see
    /// [`crate::grants`]).
    HookStarted {
        command_id: String,
        phase: Phase,
        owner: String,
        /// The revision the call is about (workload phases); absent in records
        /// written before the agent named it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<String>,
    },
    HookSucceeded {
        command_id: String,
        phase: Phase,
        owner: String,
    },
    /// The call failed, timed out or was cancelled (`code`); never the hook's message.
    HookFailed {
        command_id: String,
        phase: Phase,
        owner: String,
        code: ErrorCode,
    },
    /// The controller asked (command `by`, a `cancel_command`) to cut `command_id`
    /// short: recorded under that command, durable before anything is cancelled, so
    /// that it is not begun when it arrives later, or again after a restart.
    CancelRequested { command_id: String, by: String },
}

impl Event {
    /// Whether this event records a command's effect on the host: the kinds
    /// [`crate::plan::Step::effect`] returns (whatever the cause of a start or stop).
    pub fn is_effect(&self) -> bool {
        match self {
            Event::NamespaceReady { .. }
            | Event::NamespaceDeleted { .. }
            | Event::RevisionPrepared { .. }
            | Event::WorkloadStarted { .. }
            | Event::WorkloadStopped { .. }
            | Event::RevisionRetired { .. } => true,
            Event::CommandReceived { .. }
            | Event::CommandRejected { .. }
            | Event::CommandCompleted { .. }
            | Event::WorkloadFailed { .. }
            | Event::WorkloadExited { .. }
            | Event::DriftDetected { .. }
            | Event::HookStarted { .. }
            | Event::HookSucceeded { .. }
            | Event::HookFailed { .. }
            | Event::CancelRequested { .. } => false,
        }
    }

    /// The short name shown in logs and `--json` output (`command_received`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::CommandReceived { .. } => "command_received",
            Event::CommandRejected { .. } => "command_rejected",
            Event::CommandCompleted { .. } => "command_completed",
            Event::NamespaceReady { .. } => "namespace_ready",
            Event::NamespaceDeleted { .. } => "namespace_deleted",
            Event::RevisionPrepared { .. } => "revision_prepared",
            Event::WorkloadStarted { .. } => "workload_started",
            Event::WorkloadStopped { .. } => "workload_stopped",
            Event::RevisionRetired { .. } => "revision_retired",
            Event::WorkloadFailed { .. } => "workload_failed",
            Event::WorkloadExited { .. } => "workload_exited",
            Event::DriftDetected { .. } => "drift_detected",
            Event::HookStarted { .. } => "hook_started",
            Event::HookSucceeded { .. } => "hook_succeeded",
            Event::HookFailed { .. } => "hook_failed",
            Event::CancelRequested { .. } => "cancel_requested",
        }
    }

    /// The command this event belongs to, if any.
    pub fn command_id(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { command_id, .. }
            | Event::CommandCompleted { command_id, .. }
            | Event::NamespaceReady { command_id, .. }
            | Event::NamespaceDeleted { command_id, .. }
            | Event::RevisionPrepared { command_id, .. }
            | Event::RevisionRetired { command_id, .. }
            | Event::HookStarted { command_id, .. }
            | Event::HookSucceeded { command_id, .. }
            | Event::HookFailed { command_id, .. }
            | Event::CancelRequested { command_id, .. } => Some(command_id),
            Event::CommandRejected { command_id, .. } => command_id.as_deref(),
            Event::WorkloadExited { .. } | Event::DriftDetected { .. } => None,
            Event::WorkloadStarted { cause, .. }
            | Event::WorkloadStopped { cause, .. }
            | Event::WorkloadFailed { cause, .. } => cause.command_id(),
        }
    }

    /// The namespace this event concerns, if any.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            // A cancel addresses no namespace: recorded as "".
            Event::CommandReceived { namespace, .. } if namespace.is_empty() => None,
            Event::CommandReceived { namespace, .. }
            | Event::NamespaceReady { namespace, .. }
            | Event::NamespaceDeleted { namespace, .. }
            | Event::RevisionPrepared { namespace, .. }
            | Event::WorkloadStarted { namespace, .. }
            | Event::WorkloadStopped { namespace, .. }
            | Event::RevisionRetired { namespace, .. }
            | Event::WorkloadFailed { namespace, .. }
            | Event::WorkloadExited { namespace, .. }
            | Event::DriftDetected { namespace, .. } => Some(namespace),
            Event::CommandRejected { .. }
            | Event::CommandCompleted { .. }
            | Event::HookStarted { .. }
            | Event::HookSucceeded { .. }
            | Event::HookFailed { .. }
            | Event::CancelRequested { .. } => None,
        }
    }

    /// The workload this event concerns, if any.
    pub fn workload(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { workload, .. } => workload.as_deref(),
            Event::RevisionPrepared { workload, .. }
            | Event::WorkloadStarted { workload, .. }
            | Event::WorkloadStopped { workload, .. }
            | Event::RevisionRetired { workload, .. }
            | Event::WorkloadFailed { workload, .. }
            | Event::WorkloadExited { workload, .. }
            | Event::DriftDetected { workload, .. } => Some(workload),
            _ => None,
        }
    }

    /// The revision this event concerns, if any.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Event::CommandReceived { revision, .. } | Event::WorkloadStopped { revision, .. } => {
                revision.as_deref()
            }
            Event::RevisionPrepared { revision, .. }
            | Event::WorkloadStarted { revision, .. }
            | Event::RevisionRetired { revision, .. }
            | Event::WorkloadExited { revision, .. }
            | Event::DriftDetected { revision, .. } => Some(revision),
            _ => None,
        }
    }
}

/// One entry of the log: an event with its place in the hash chain.
pub type Record = capstan_log::Record<Event>;

pub use capstan_log::hex;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::openapi;

    /// The variants `Event` declares, as serde's derive names them (its "expected one
    /// of" list for an unknown variant).
    fn declared_kinds() -> Vec<String> {
        let refused = serde_json::from_str::<Event>("\"no_such_kind\"").unwrap_err();
        let message = refused.to_string();
        let (_, expected) = message
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("{message}"));
        expected
            .split(", ")
            .map(|v| v.trim_matches('`').split('`').next().unwrap().to_string())
            .collect()
    }

    /// One event of every kind, with every optional field both set and unset.
    fn events() -> Vec<Event> {
        let mut events: Vec<Event> = crate::log::samples::every_event()
            .into_iter()
            .map(|(event, _)| event)
            .collect();
        let s = |v: &str| v.to_string();
        events.extend([
            Event::CancelRequested {
                command_id: s("c1"),
                by: s("cancel-0123"),
            },
            Event::CommandReceived {
                command_id: s("cancel-0123"),
                op: s("cancel_command"),
                namespace: s(""),
                workload: None,
                revision: None,
                command: s("{}"),
            },
            Event::CommandRejected {
                command_id: Some(s("c2")),
                code: ErrorCode::InvalidName,
                message: s("m"),
            },
            Event::CommandCompleted {
                command_id: s("c1"),
                outcome: Outcome::Succeeded,
                code: None,
                message: None,
            },
            Event::HookStarted {
                command_id: s("c1"),
                phase: Phase::BeforeWorkloadStart,
                owner: s("iam"),
                revision: Some(s("r1")),
            },
            Event::HookStarted {
                command_id: s("c1"),
                phase: Phase::AfterNamespacePrepared,
                owner: s("iam"),
                revision: None,
            },
            Event::WorkloadStopped {
                cause: Cause::AgentShutdown,
                namespace: s("ns"),
                workload: s("web"),
                revision: None,
            },
            Event::WorkloadStarted {
                cause: Cause::Supervisor,
                namespace: s("ns"),
                workload: s("web"),
                revision: s("r2"),
                previous: Some(s("r1")),
            },
            Event::WorkloadExited {
                namespace: s("ns"),
                workload: s("web"),
                revision: s("r1"),
                exit_code: None,
            },
        ]);
        events
    }

    /// Given one record of every event kind (and each optional field set and unset), as
    /// the agent's log answers it and as its outbox publishes it (with `host`), then
    /// every key is a property `LogRecord` lists, of a type it allows, and its
    /// required ones are there; and `kind`'s enum is exactly the kinds `Event`
    /// declares, `op`'s the ops this version knows, `phase`'s every phase.
    #[test]
    fn every_record_of_every_kind_is_one_the_openapi_log_record_describes() {
        let spec = openapi::description();
        let schema = &spec["components"]["schemas"]["LogRecord"];
        let listed = |field: &str| -> Vec<String> {
            schema["properties"][field]["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("{field} has no enum"))
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let declared = declared_kinds();
        assert_eq!(
            listed("kind"),
            declared,
            "LogRecord.kind is not Event's kinds"
        );
        assert_eq!(listed("op"), capstan_common::KNOWN_OPS);
        let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(listed("phase"), phases);
        let events = events();
        let mut built: Vec<String> = events.iter().map(|e| e.kind().to_string()).collect();
        built.sort();
        built.dedup();
        let mut every = declared.clone();
        every.sort();
        assert_eq!(built, every, "a kind without a sample");
        for (seq, event) in (1..).zip(events) {
            let record = Record {
                seq,
                at_ms: 1_764_000_000_000,
                prev_hash: [7; 32],
                event,
            };
            let own = record.to_json();
            let mut published = own.clone();
            published["host"] = "h1".into();
            for json in [own, published] {
                if let Err(e) = openapi::allows(&spec, schema, &json) {
                    panic!("{json}: {e}");
                }
            }
        }
    }
}
