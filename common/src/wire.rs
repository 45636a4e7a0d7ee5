//! The NATS layout of protocol v1: subjects, streams and buckets, and the JSON of the
//! host registry. Pure names and types; the connection code is in `nats` (feature
//! `nats`). Documented in `docs/nats.md`.

use serde::{Deserialize, Serialize};

/// The JetStream stream holding every host's commands (work-queue retention).
pub const CMD_STREAM: &str = "CAPSTAN_CMD";
/// The JetStream stream holding every host's log records: the central audit copy.
pub const EVT_STREAM: &str = "CAPSTAN_EVT";
/// The KV bucket of host heartbeats.
pub const HOSTS_BUCKET: &str = "capstan_hosts";
/// The KV bucket the coordinators share to find a command's host by id.
pub const COMMANDS_BUCKET: &str = "capstan_commands";
/// The KV bucket of command results: what happened to each command, written by its
/// host's agent (key [`result_key`]), read by the coordinators in one get.
pub const RESULTS_BUCKET: &str = "capstan_results";
/// The KV bucket of the hosts' registered public keys (`capstan_host_keys`, key =
/// host): written by the coordinators only, what host signatures are checked against.
pub const HOST_KEYS_BUCKET: &str = "capstan_host_keys";
/// How often an agent refreshes its registry entry.
pub const HEARTBEAT_SECS: u64 = 5;

/// `capstan.v1.cmd.<host>`: the host's commands.
pub fn cmd_subject(host: &str) -> String {
    format!("capstan.v1.cmd.{host}")
}

/// `capstan.v1.evt.<host>`: the host's log records, in seq order.
pub fn evt_subject(host: &str) -> String {
    format!("capstan.v1.evt.{host}")
}

/// `capstan.v1.rpc.<host>.<verb>`: request/reply to the agent.
pub fn rpc_subject(host: &str, verb: &str) -> String {
    format!("capstan.v1.rpc.{host}.{verb}")
}

/// The durable consumer an agent reads its commands through.
pub fn consumer_name(host: &str) -> String {
    format!("agent-{host}")
}

/// The key of a command's entry in [`RESULTS_BUCKET`]: `<host>.<hex of the id>`, so
/// that permissions can give each agent `$KV.capstan_results.<host>.>` and nothing else.
pub fn result_key(host: &str, id: &str) -> String {
    format!("{host}.{}", crate::signing::to_hex(id.as_bytes()))
}

/// The subject a put of [`result_key`] is published on (and can be subscribed to).
pub fn result_subject(host: &str, id: &str) -> String {
    format!("$KV.{RESULTS_BUCKET}.{}", result_key(host, id))
}

/// `capstan.v1.res.<host>.<hex of the id>`: a notice of each result put, carrying the
/// same bytes and signature, for a coordinator's `wait` to follow (on per-host
/// accounts a put into the host's storage is not seen by a subscription of the
/// coordinator's account; a plain publish of the host's is).
pub fn result_notice_subject(host: &str, id: &str) -> String {
    format!(
        "capstan.v1.res.{host}.{}",
        crate::signing::to_hex(id.as_bytes())
    )
}

/// On per-host accounts (`[nats] host_accounts`), the prefix of the JetStream API an
/// agent uses: its account imports the API subjects it may use from the fleet's
/// account and its storage account under this prefix (its own account has no
/// JetStream, and the server answers `$JS.API` there with "not enabled").
pub const HOST_API_PREFIX: &str = "capstan.js.API";

/// On per-host accounts, the prefix under which the coordinators' account imports
/// the JetStream API of host `host`'s storage account (its event stream and results).
pub fn store_api_prefix(host: &str) -> String {
    format!("capstan.store.{host}.API")
}

/// The inbox prefix an agent uses for its own requests, so that permissions can give
/// each agent its own replies and nobody else's.
pub fn inbox_prefix(host: &str) -> String {
    format!("_INBOX_{host}")
}

/// How far in the future a heartbeat's `at` may be (clock skew) and still count as
/// alive; a beat further ahead is `stale`.
pub const BEAT_SKEW_SECS: u64 = 10;

/// The RPC verbs an agent answers.
pub const RPC_VERBS: &[&str] = &["ping", "status", "intent", "log"];

fn yes() -> bool {
    true
}

/// One entry of the host registry (`capstan_hosts`, key = host).
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
        anchor: serde_json::Value,
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
