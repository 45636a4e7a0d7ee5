//! Commands: the unit of work the coordinator sends and an agent carries out.

use crate::validate;
use crate::{ErrorCode, Rejection};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

mod driver_kind;
mod sections;
mod spec;
pub use driver_kind::{is_kind_name, BadKind, DriverKind, MAX_KIND_LEN};
pub use sections::{Section, Sections, Settings};
pub use spec::{Mount, PortMapping, Protocol, Spec, Strategy};

/// The protocol version this build speaks (`"v"` in every command).
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest command accepted, in bytes of JSON.
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// One lifecycle command: `{"v":1,"id":…,"host":…,"issued_at":…,"op":…, …op fields}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub v: u32,
    /// The idempotency key: a command with an id already in the log is answered from
    /// the log and never carried out twice.
    pub id: String,
    pub host: String,
    pub issued_at: DateTime<Utc>,
    /// When the controller stops waiting for it: from then on the agent cuts what is
    /// in flight short as its own stop does (`cancelled`, retryable), and a command not
    /// yet begun is not begun. Absent (and left out of the JSON): no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub op: Op,
}

/// The operation and its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // few and short-lived: boxing the spec buys nothing
pub enum Op {
    EnsureNamespace {
        namespace: String,
    },
    DeleteNamespace {
        namespace: String,
    },
    PrepareRevision {
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
    },
    ActivateRevision {
        namespace: String,
        workload: String,
        revision: String,
    },
    StopWorkload {
        namespace: String,
        workload: String,
    },
    StartWorkload {
        namespace: String,
        workload: String,
    },
    RetireRevision {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// Cuts the command `target` (same host) short as the agent's stop does, or keeps
    /// it from beginning; a finished one is left as it is. Addresses no namespace.
    CancelCommand {
        target: String,
    },
}

/// The ops this version knows, in their wire spelling ([`Op::name`]).
pub const KNOWN_OPS: [&str; 8] = [
    "ensure_namespace",
    "delete_namespace",
    "prepare_revision",
    "activate_revision",
    "stop_workload",
    "start_workload",
    "retire_revision",
    "cancel_command",
];

/// The key of a workload in per-host maps and indexes: `namespace/workload`.
pub fn workload_key(namespace: &str, workload: &str) -> String {
    format!("{namespace}/{workload}")
}

/// The `id` of a line that failed to parse, when it has a valid one, so that a
/// rejection can still name the command it rejects.
pub fn salvage_id(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let id = value.get("id")?.as_str()?;
    validate::command_id(id).ok()?;
    Some(id.to_string())
}

/// A workload's address on a host: `namespace/workload`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadRef {
    pub namespace: String,
    pub workload: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.workload)
    }
}

impl Op {
    /// The wire spelling of this op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::EnsureNamespace { .. } => "ensure_namespace",
            Op::DeleteNamespace { .. } => "delete_namespace",
            Op::PrepareRevision { .. } => "prepare_revision",
            Op::ActivateRevision { .. } => "activate_revision",
            Op::StopWorkload { .. } => "stop_workload",
            Op::StartWorkload { .. } => "start_workload",
            Op::RetireRevision { .. } => "retire_revision",
            Op::CancelCommand { .. } => "cancel_command",
        }
    }

    /// The namespace the op addresses: every op's but a cancel's.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Op::EnsureNamespace { namespace }
            | Op::DeleteNamespace { namespace }
            | Op::PrepareRevision { namespace, .. }
            | Op::ActivateRevision { namespace, .. }
            | Op::StopWorkload { namespace, .. }
            | Op::StartWorkload { namespace, .. }
            | Op::RetireRevision { namespace, .. } => Some(namespace),
            Op::CancelCommand { .. } => None,
        }
    }

    /// Whether the op starts a revision (an activation, a start): after a crash
    /// that logged its effect, what a replaced revision still holds is revoked before
    /// it completes. Every op is named, so a new one is classified where it is added.
    pub fn starts(&self) -> bool {
        match self {
            Op::ActivateRevision { .. } | Op::StartWorkload { .. } => true,
            Op::EnsureNamespace { .. }
            | Op::DeleteNamespace { .. }
            | Op::PrepareRevision { .. }
            | Op::StopWorkload { .. }
            | Op::RetireRevision { .. }
            | Op::CancelCommand { .. } => false,
        }
    }

    /// The command a cancel is for.
    pub fn cancels(&self) -> Option<&str> {
        match self {
            Op::CancelCommand { target } => Some(target),
            _ => None,
        }
    }

    /// The workload, for ops that address one.
    pub fn workload(&self) -> Option<WorkloadRef> {
        match self {
            Op::EnsureNamespace { .. } | Op::DeleteNamespace { .. } | Op::CancelCommand { .. } => {
                None
            }
            Op::PrepareRevision {
                namespace,
                workload,
                ..
            }
            | Op::ActivateRevision {
                namespace,
                workload,
                ..
            }
            | Op::StopWorkload {
                namespace,
                workload,
            }
            | Op::StartWorkload {
                namespace,
                workload,
            }
            | Op::RetireRevision {
                namespace,
                workload,
                ..
            } => Some(WorkloadRef {
                namespace: namespace.clone(),
                workload: workload.clone(),
            }),
        }
    }

    /// The revision, for ops that address one.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Op::PrepareRevision { revision, .. }
            | Op::ActivateRevision { revision, .. }
            | Op::RetireRevision { revision, .. } => Some(revision),
            _ => None,
        }
    }
}

/// `e`, a JSON error in text that begins on line `first_line` of a file, with its
/// position counted in the file's lines (serde_json counts from the text's start).
pub fn json_error_at(e: &serde_json::Error, first_line: usize) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(what) if e.line() > 0 => format!(
            "{what} at line {} column {}",
            first_line + e.line() - 1,
            e.column()
        ),
        _ => text,
    }
}

impl Command {
    /// Parses and validates one command from its JSON text.
    ///
    /// Checks run from the outside in, so that the code names the first thing wrong:
    /// size, JSON, version, op, field shapes, then every value's grammar.
    pub fn parse(text: &str) -> Result<Command, Rejection> {
        Command::parse_at(text, 1)
    }

    /// [`Command::parse`] of the text that begins on line `line` (from 1) of a file,
    /// as `capstan-agent apply` reads one command a line: a JSON error names the
    /// file's line and column, not the text's own (always "line 1" for one line).
    pub fn parse_at(text: &str, line: usize) -> Result<Command, Rejection> {
        if text.len() > MAX_COMMAND_BYTES {
            return Err(Rejection::new(
                ErrorCode::TooLarge,
                format!(
                    "command is {} bytes; the limit is {MAX_COMMAND_BYTES}",
                    text.len()
                ),
            ));
        }
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            Rejection::new(
                ErrorCode::InvalidJson,
                format!("not JSON: {}", json_error_at(&e, line)),
            )
        })?;
        let object = value
            .as_object()
            .ok_or_else(|| Rejection::new(ErrorCode::InvalidJson, "a command is a JSON object"))?;
        match object.get("v").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
            Some(v) => {
                return Err(Rejection::new(
                    ErrorCode::UnsupportedVersion,
                    format!(
                    "protocol version {v} is not supported; this agent speaks {PROTOCOL_VERSION}"
                ),
                ))
            }
            None => {
                return Err(Rejection::new(
                    ErrorCode::UnsupportedVersion,
                    "missing numeric field `v`",
                ))
            }
        }
        match object.get("op").and_then(serde_json::Value::as_str) {
            Some(op) if KNOWN_OPS.contains(&op) => {}
            Some(op) => {
                let shown: String = op.chars().take(64).collect();
                return Err(Rejection::new(
                    ErrorCode::UnknownOp,
                    format!("unknown op {shown:?}"),
                ));
            }
            None => {
                return Err(Rejection::new(
                    ErrorCode::UnknownOp,
                    "missing string field `op`",
                ))
            }
        }
        for field in ["issued_at", "deadline"] {
            if let Some(stamp) = object.get(field).and_then(serde_json::Value::as_str) {
                if DateTime::parse_from_rfc3339(stamp).is_err() {
                    return Err(Rejection::new(
                        ErrorCode::InvalidTimestamp,
                        format!("`{field}` is not an RFC 3339 timestamp"),
                    ));
                }
            }
        }
        // From the text, not the value: a JSON value keeps an object's members sorted,
        // and a driver's section is kept in the order it was written (what the
        // coordinator signed; `Section`). A member twice is refused here, not the last
        // one taken.
        let command: Command = serde_json::from_str(text)
            .map_err(|e| Rejection::new(ErrorCode::InvalidCommand, e.to_string()))?;
        command.validate()?;
        Ok(command)
    }

    /// Checks every value's grammar. [`Command::parse`] calls this; call it again on
    /// commands built in code before sending them.
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.v != PROTOCOL_VERSION {
            return Err(Rejection::new(
                ErrorCode::UnsupportedVersion,
                format!("protocol version {}", self.v),
            ));
        }
        validate::command_id(&self.id)?;
        validate::name("host", &self.host)?;
        if let Some(namespace) = self.op.namespace() {
            validate::name("namespace", namespace)?;
        }
        if let Some(target) = self.op.cancels() {
            validate::command_id(target)
                .map_err(|e| Rejection::new(e.code, format!("`target`: {}", e.message)))?;
            if target == self.id {
                return Err(Rejection::new(
                    ErrorCode::InvalidCommand,
                    "a cancel cannot be for itself (`target` is its own `id`)",
                ));
            }
        }
        if let Some(w) = self.op.workload() {
            validate::name("workload", &w.workload)?;
        }
        if let Some(r) = self.op.revision() {
            validate::name("revision", r)?;
        }
        if let Op::PrepareRevision { spec, .. } = &self.op {
            validate::spec(spec)?;
        }
        Ok(())
    }

    /// The canonical JSON text of this command (field order fixed by the types).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a Command always serialises")
    }

    /// What an id is bound to: the canonical JSON without `issued_at` (and, like
    /// [`Command::to_json`], without `sig`). A re-send of the same command may carry a
    /// new `issued_at` and signature; any other difference is another command, and
    /// reusing the id for it is `id_conflict`.
    pub fn content(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a Command always serialises");
        if let Some(object) = value.as_object_mut() {
            object.remove("issued_at");
        }
        value.to_string()
    }
}

#[cfg(test)]
mod tests;
