//! Stable error codes: the part of an error that programs match on.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A stable, machine-readable reason. The `snake_case` spelling is the wire form (and
/// the form the agent's log stores) and never changes meaning once released; new codes
/// may be added anywhere, and variants may be reordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    // -- input: the command itself is unacceptable (outcome `rejected`) --
    /// The command is larger than [`crate::MAX_COMMAND_BYTES`].
    TooLarge,
    /// The line is not a JSON object.
    InvalidJson,
    /// `v` is missing or not a version this build speaks.
    UnsupportedVersion,
    /// `op` is missing or unknown.
    UnknownOp,
    /// A field is missing or has the wrong type.
    InvalidCommand,
    /// `id` is not 1–128 characters of `[A-Za-z0-9._:-]`.
    InvalidId,
    /// A host, namespace, workload or revision name breaks the DNS-label grammar.
    InvalidName,
    /// `issued_at` is not an RFC 3339 timestamp.
    InvalidTimestamp,
    /// An env name breaks `^[A-Za-z_][A-Za-z0-9_]*$` or a value holds NUL.
    InvalidEnv,
    /// The spec is unusable (bad image reference, NUL in argv, wrong driver, …).
    InvalidSpec,
    /// The command is for another host.
    WrongHost,
    // -- execution: the command was accepted but could not be carried out (`failed`) --
    /// The namespace has not been prepared on this host.
    NamespaceNotFound,
    /// `delete_namespace` on a namespace that still holds workloads.
    NamespaceNotEmpty,
    /// The workload is unknown on this host.
    WorkloadNotFound,
    /// The revision is unknown for this workload.
    RevisionNotFound,
    /// `prepare_revision` reused a revision name with a different spec.
    RevisionConflict,
    /// The revision was already retired.
    RevisionRetired,
    /// `start_workload` on a workload with no active revision.
    NoActiveRevision,
    /// The driver failed; the message says which operation.
    DriverFailed,
    /// The workload's backend (container, unit, pod) is gone.
    BackendMissing,
    /// The local log cannot be trusted (decode failure or broken hash chain); the agent
    /// is read-only until an operator intervenes.
    LogDegraded,
    /// The local log could not be written.
    LogFailed,
    /// The revision's image is not on the host and the pull policy forbids (or the
    /// registry refused) pulling it.
    ImageNotFound,
    /// A lifecycle hook failed, timed out or replied nonsense; the message names the
    /// phase and the owner only. Retryable: hooks are idempotent.
    HookFailed,
    /// The merged launch environment from `before_workload_start` broke the rules
    /// (count, name grammar, reserved name, value grammar, collision with spec env).
    LaunchEnvRejected,
    /// The command was cut short — by the agent's shutdown, or because its `deadline`
    /// passed — while its hooks or a readiness wait ran (completed owners were
    /// compensated), or was not begun past its deadline. Retryable.
    Cancelled,
    /// A crash interrupted the command's preparing hooks; on restart the owners that
    /// had begun were compensated. Retryable.
    Interrupted,
    // -- authorisation: the command is not trusted (outcome `rejected`) --
    /// The command carries no `sig` and this agent requires signed commands.
    Unsigned,
    /// `sig` is malformed or does not verify against any configured public key.
    BadSignature,
    /// `issued_at` is older than the agent's configured maximum command age.
    Expired,
    /// `issued_at` lies further in the future than the allowed clock skew.
    IssuedInFuture,
    // Execution (`failed`), appended after the authorisation codes for the same reason.
    /// The backend has given up on the workload's revision and will not start it by
    /// itself (systemd's `start-limit-hit`, a crash loop); the agent reports it instead
    /// of starting it. The message carries the backend's reason.
    BackendFailed,
    /// The spec names a driver other than the one this agent runs; nothing was done.
    DriverMismatch,
    // Input (`rejected`), appended at the end so that no existing variant moves.
    /// The command's id was already used for a command with different content (another
    /// host, op or field; `issued_at` and `sig` do not count). Not retryable: send the
    /// new content under a new id.
    IdConflict,
    // Execution (`failed`), appended at the end so that no existing variant moves.
    /// The backend holds an object under the name this host's would have (a network
    /// of another host's agent on a shared engine, or one made outside capstan): it is
    /// neither adopted nor deleted. Not retryable: someone must remove or rename it.
    NotOwned,
    // Per hook call (the `code` of a `hook_failed` record), appended at the end. The
    // command itself completes `hook_failed`; these say the owner may have granted.
    /// The hook call ran past its timeout and was killed: it may have granted, so it
    /// is compensated (also after a crash). Retryable.
    HookTimeout,
    /// The hook exited 0 but its reply was not valid: it believes it granted, so it is
    /// compensated (also after a crash). Retryable.
    HookInvalidReply,
    // Execution (`failed`), appended at the end so that no existing variant moves.
    /// An external driver could not be reached, or its connection broke while the
    /// operation was in flight (the driver process went away). The agent reconnects
    /// on the next operation. Retryable: driver operations are idempotent.
    DriverUnavailable,
    // Execution (`failed`), appended at the end so that no existing variant moves.
    /// The backend's authorization refused the operation (Kubernetes RBAC: a verb
    /// missing from the agent's role). The message names the operation and the object.
    /// Not retryable: someone must grant the permission.
    Forbidden,
    /// Another field manager owns a field the driver sets (Kubernetes server-side
    /// apply); nothing was changed. Not retryable: someone must give the field up.
    FieldConflict,
    /// The rollout did not complete within the driver's bounded wait; it goes on in
    /// the backend. Retryable: the same command converges.
    RolloutTimeout,
    /// The started revision did not pass its readiness check (`spec.readiness`) by its
    /// deadline: it was stopped and its grants revoked, and the revision that ran
    /// before runs on. Retryable.
    NotReady,
}

impl ErrorCode {
    /// Every code, in declaration order (kept complete by a test against the enum).
    pub const ALL: [ErrorCode; 42] = [
        Self::TooLarge,
        Self::InvalidJson,
        Self::UnsupportedVersion,
        Self::UnknownOp,
        Self::InvalidCommand,
        Self::InvalidId,
        Self::InvalidName,
        Self::InvalidTimestamp,
        Self::InvalidEnv,
        Self::InvalidSpec,
        Self::WrongHost,
        Self::NamespaceNotFound,
        Self::NamespaceNotEmpty,
        Self::WorkloadNotFound,
        Self::RevisionNotFound,
        Self::RevisionConflict,
        Self::RevisionRetired,
        Self::NoActiveRevision,
        Self::DriverFailed,
        Self::BackendMissing,
        Self::LogDegraded,
        Self::LogFailed,
        Self::ImageNotFound,
        Self::HookFailed,
        Self::LaunchEnvRejected,
        Self::Cancelled,
        Self::Interrupted,
        Self::Unsigned,
        Self::BadSignature,
        Self::Expired,
        Self::IssuedInFuture,
        Self::BackendFailed,
        Self::DriverMismatch,
        Self::IdConflict,
        Self::NotOwned,
        Self::HookTimeout,
        Self::HookInvalidReply,
        Self::DriverUnavailable,
        Self::Forbidden,
        Self::FieldConflict,
        Self::RolloutTimeout,
        Self::NotReady,
    ];

    /// The wire spelling, e.g. `invalid_name`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::InvalidJson => "invalid_json",
            Self::UnsupportedVersion => "unsupported_version",
            Self::UnknownOp => "unknown_op",
            Self::InvalidCommand => "invalid_command",
            Self::InvalidId => "invalid_id",
            Self::InvalidName => "invalid_name",
            Self::InvalidTimestamp => "invalid_timestamp",
            Self::InvalidEnv => "invalid_env",
            Self::InvalidSpec => "invalid_spec",
            Self::WrongHost => "wrong_host",
            Self::NamespaceNotFound => "namespace_not_found",
            Self::NamespaceNotEmpty => "namespace_not_empty",
            Self::WorkloadNotFound => "workload_not_found",
            Self::RevisionNotFound => "revision_not_found",
            Self::RevisionConflict => "revision_conflict",
            Self::RevisionRetired => "revision_retired",
            Self::NoActiveRevision => "no_active_revision",
            Self::DriverFailed => "driver_failed",
            Self::BackendMissing => "backend_missing",
            Self::ImageNotFound => "image_not_found",
            Self::LogDegraded => "log_degraded",
            Self::LogFailed => "log_failed",
            Self::HookFailed => "hook_failed",
            Self::LaunchEnvRejected => "launch_env_rejected",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
            Self::Unsigned => "unsigned",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::IssuedInFuture => "issued_in_future",
            Self::BackendFailed => "backend_failed",
            Self::DriverMismatch => "driver_mismatch",
            Self::IdConflict => "id_conflict",
            Self::NotOwned => "not_owned",
            Self::HookTimeout => "hook_timeout",
            Self::HookInvalidReply => "hook_invalid_reply",
            Self::DriverUnavailable => "driver_unavailable",
            Self::Forbidden => "forbidden",
            Self::FieldConflict => "field_conflict",
            Self::RolloutTimeout => "rollout_timeout",
            Self::NotReady => "not_ready",
        }
    }

    /// True when the same request, sent again under a new command id, may succeed
    /// without anything else changing (a hook recovered, the agent came back).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::HookFailed
                | Self::HookTimeout
                | Self::HookInvalidReply
                | Self::Cancelled
                | Self::Interrupted
                | Self::LogFailed
                | Self::DriverUnavailable
                | Self::RolloutTimeout
                | Self::NotReady
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command that cannot be accepted, with a stable code and a human message.
/// The message names the offending field, never a secret value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Rejection {
    pub code: ErrorCode,
    pub message: String,
}

impl Rejection {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` lists every variant once: serde's derive, which sees the enum itself,
    /// names every variant in its "expected one of" list, and each is in `ALL`; and
    /// `as_str` (an exhaustive match) spells each as serde does.
    #[test]
    fn all_lists_every_code_once_as_the_enum_declares_them() {
        let refused = serde_json::from_str::<ErrorCode>("\"no_such_code\"").unwrap_err();
        let message = refused.to_string();
        let (_, expected) = message
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("{message}"));
        let declared: Vec<&str> = expected
            .split(", ")
            .map(|v| v.trim_start_matches("one of ").trim_matches('`'))
            .map(|v| v.split('`').next().unwrap())
            .collect();
        let listed: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            listed, declared,
            "ErrorCode::ALL is not the enum's variants in order"
        );
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{code}\""));
        }
    }

    #[test]
    fn the_newest_codes_are_spelt_on_the_wire_as_documented_and_final() {
        for (code, wire) in [
            (ErrorCode::BackendFailed, "backend_failed"),
            (ErrorCode::DriverMismatch, "driver_mismatch"),
            (ErrorCode::IdConflict, "id_conflict"),
            (ErrorCode::NotOwned, "not_owned"),
            (ErrorCode::Forbidden, "forbidden"),
            (ErrorCode::FieldConflict, "field_conflict"),
        ] {
            assert_eq!(code.as_str(), wire);
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{wire}\""));
            assert!(!code.is_retryable(), "{wire}");
        }
        for (code, wire) in [
            (ErrorCode::HookTimeout, "hook_timeout"),
            (ErrorCode::HookInvalidReply, "hook_invalid_reply"),
            (ErrorCode::DriverUnavailable, "driver_unavailable"),
            (ErrorCode::RolloutTimeout, "rollout_timeout"),
            (ErrorCode::NotReady, "not_ready"),
        ] {
            assert_eq!(code.as_str(), wire);
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{wire}\""));
            assert!(code.is_retryable(), "{wire}");
        }
    }
}
