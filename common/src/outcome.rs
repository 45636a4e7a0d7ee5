//! What happened to a command, as reported to whoever sent it.

use crate::Rejection;
use serde::{Deserialize, Serialize};

/// The final state of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Carried out.
    Succeeded,
    /// Accepted and attempted, but not carried out; `error` says why.
    Failed,
    /// Never accepted: malformed, invalid or unauthorised.
    Rejected,
}

/// One line of `capstan-agent apply` output, and the reply to a command over NATS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    /// The command id, when the input had a readable one.
    pub id: Option<String>,
    pub outcome: Outcome,
    /// True when the command id was already in the log and this answer comes from there.
    pub duplicate: bool,
    /// True when the failure is transient: the same request under a new command id may
    /// succeed (see `ErrorCode::is_retryable`).
    #[serde(default)]
    pub retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Rejection>,
}
