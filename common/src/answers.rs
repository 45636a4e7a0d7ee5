//! The JSON of what agents answer and publish besides commands and results: the host
//! registry's heartbeat (with the agent's figures), the `log` request, the agent's
//! error answers (`AgentCode`, `ErrorReply`, also the coordinator's HTTP errors) and
//! its local socket's typed answers. Documented in `docs/protocol.md` and
//! `docs/nats.md`.

use serde::{Deserialize, Serialize};

mod host;
pub use host::{
    AnchorSummary, ExportAnswer, ExportRequest, GrantsAnswer, Hold, IntentAnswer, LogAnswer,
    NamespaceAnswer, PingAnswer, RevisionState, RunIntent, StatusAnswer, Verb, WorkloadAnswer,
};

/// A host's heartbeat (`capstan.v1.beat.<host>`), as its agent signs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBeat {
    pub host: String,
    /// The agent's version.
    pub version: String,
    /// The drivers it runs (`sim`, `docker`, …).
    pub drivers: Vec<String>,
    /// What those drivers declare (`manages_lifecycle`, …).
    pub capabilities: serde_json::Value,
    /// The seq of the last record in its log.
    pub last_seq: u64,
    /// False while its log takes no writes (every command is refused): `degraded` or
    /// `log_failed` says why. Entries of older agents, without it, read as true.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Why the log is degraded (read-only after a bad record), if it is.
    #[serde(default)]
    pub degraded: Option<String>,
    /// Why the log could not be made durable (a failed flush), if it could not.
    #[serde(default)]
    pub log_failed: Option<String>,
    /// The outbox's alarm, if it saw a publish ack that should not happen (a
    /// `duplicate` ack: a record of this host was suppressed). Older agents: none.
    #[serde(default)]
    pub outbox_alarm: Option<String>,
    /// The agent's key figures (`docs/metrics.md`); older agents: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    /// When the agent wrote this entry.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// An agent's key figures, as in its heartbeat and `status`: the same numbers its
/// `/metrics` endpoint shows. Counts are since `since` (the agent process's start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// When the agent process started counting.
    pub since: chrono::DateTime<chrono::Utc>,
    /// The last seq `CAPSTAN_EVT` acknowledged.
    pub published_seq: u64,
    /// Records in the log not yet in `CAPSTAN_EVT`: `last_seq - published_seq`.
    pub outbox_lag: u64,
    /// Commands answered, by outcome.
    pub commands: CommandCounts,
    /// Workloads by state, from the running intent.
    pub workloads: WorkloadCounts,
}

/// Commands answered since the agent started, by outcome; answers to a redelivered or
/// re-sent command (from the log, `duplicate: true`) are counted apart, in `duplicate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandCounts {
    pub succeeded: u64,
    pub failed: u64,
    pub rejected: u64,
    pub duplicate: u64,
}

/// Workloads in the running intent: `failed` when the last attempt to reach intent
/// failed, else by intent (`running` or `stopped`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadCounts {
    pub running: u64,
    pub stopped: u64,
    pub failed: u64,
}

/// The body of a `log` request (RPC or the agent's local socket); every field
/// optional. The filters narrow the records after `since`: `command` to one command's
/// records, `namespace` and/or `workload` to what concerns them (by the log's indexes
/// when given together), `since_time`/`until_time` (RFC 3339) to the records appended
/// at or after / before those times (by the log's time index). A field the agent does
/// not know is refused (`invalid_request`), not ignored: an older agent must not answer
/// a filter it cannot apply with the unfiltered records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRequest {
    #[serde(default)]
    pub since: u64,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_time: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_time: Option<chrono::DateTime<chrono::Utc>>,
}

/// The code of an agent's error answer, on its RPC subjects and its local socket
/// (`docs/protocol.md`, *Answers about a host*): `{"error":{"code","message"}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentCode {
    /// The request's body is not what the verb takes (a field of the wrong type, a
    /// time that does not parse, a field the agent does not know).
    InvalidRequest,
    /// No such verb.
    UnknownVerb,
    /// The agent could not read its own log.
    LogUnreadable,
}

impl AgentCode {
    /// Every code, in declaration order.
    pub const ALL: [AgentCode; 3] = [
        AgentCode::InvalidRequest,
        AgentCode::UnknownVerb,
        AgentCode::LogUnreadable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentCode::InvalidRequest => "invalid_request",
            AgentCode::UnknownVerb => "unknown_verb",
            AgentCode::LogUnreadable => "log_unreadable",
        }
    }
}

/// The agent's local-socket `verify` answer: the whole chain checked by the running
/// agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VerifyAnswer {
    /// The chain holds: `verified` records checked, from `anchor` (`null` before any
    /// prune; else `{seq, hash, pruned, file}`).
    Verified {
        verified: u64,
        anchor: Option<AnchorSummary>,
    },
    /// The first bad record.
    Bad { bad: BadRecord },
}

/// A record that fails verification, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRecord {
    pub seq: u64,
    pub defect: String,
}

/// The agent's local-socket `layout` answer: the storage layout of its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutAnswer {
    pub layout: String,
}

/// An error reply to an RPC or HTTP request: `{"error":{"code","message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

impl ErrorReply {
    /// An agent's error answer.
    pub fn agent(code: AgentCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply::new(code.as_str(), message)
    }

    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            error: ErrorBody {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}

impl ErrorBody {
    /// The code as an [`AgentCode`], if it is one (a newer agent may answer one this
    /// build does not know).
    pub fn agent_code(&self) -> Option<AgentCode> {
        AgentCode::ALL.into_iter().find(|c| c.as_str() == self.code)
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Why an agent's answer is not the `T` asked for.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The agent answered an error (`{"error":{"code","message"}}`).
    #[error("the agent refused ({0})")]
    Refused(ErrorBody),
    /// The answer is neither an error nor a `T`.
    #[error("the agent's answer is not what the verb gives")]
    Malformed(#[source] serde_json::Error),
}

/// An agent's answer read as the `T` its verb gives, or its error answer. Read in
/// place: a caller that passes the answer on keeps it, uncopied.
pub fn read_answer<T: serde::de::DeserializeOwned>(
    answer: &serde_json::Value,
) -> Result<T, AnswerError> {
    if answer.get("error").is_some() {
        if let Ok(reply) = ErrorReply::deserialize(answer) {
            return Err(AnswerError::Refused(reply.error));
        }
    }
    T::deserialize(answer).map_err(AnswerError::Malformed)
}

fn yes() -> bool {
    true
}
