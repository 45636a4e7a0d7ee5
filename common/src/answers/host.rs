//! The answers about one host (`docs/protocol.md`, *Answers about a host*): what the
//! agent's RPC (`capstan.v1.rpc.<host>.<verb>`) and its local socket answer, what the
//! coordinator passes on, and what both CLIs read. One type per answer, so the agent
//! that writes one and every reader agree by construction; the verbs that ask for them
//! are [`Verb`].

use super::Figures;
use crate::ErrorCode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A verb of the agent's RPC (every one) or of its local socket (every one, and the
/// local-only ones: [`Verb::is_local_only`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// → [`PingAnswer`].
    Ping,
    /// → [`StatusAnswer`].
    Status,
    /// → [`IntentAnswer`].
    Intent,
    /// [`super::LogRequest`] → [`LogAnswer`].
    Log,
    /// Local socket only → [`super::VerifyAnswer`].
    Verify,
    /// Local socket only: [`ExportRequest`] → [`ExportAnswer`].
    Export,
    /// Local socket only → [`super::LayoutAnswer`].
    Layout,
}

impl Verb {
    /// Every verb, in declaration order.
    pub const ALL: [Verb; 7] = [
        Verb::Ping,
        Verb::Status,
        Verb::Intent,
        Verb::Log,
        Verb::Verify,
        Verb::Export,
        Verb::Layout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Ping => "ping",
            Verb::Status => "status",
            Verb::Intent => "intent",
            Verb::Log => "log",
            Verb::Verify => "verify",
            Verb::Export => "export",
            Verb::Layout => "layout",
        }
    }

    /// The verb spelt `text`, if it is one.
    pub fn parse(text: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// Answered on the local socket only (they read the whole log, or the files).
    pub fn is_local_only(self) -> bool {
        matches!(self, Verb::Verify | Verb::Export | Verb::Layout)
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `ping`: the agent is there, and its clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingAnswer {
    pub host: String,
    pub version: String,
    /// The agent's clock.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// `status`: the agent's health and what it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusAnswer {
    pub host: String,
    pub version: String,
    /// The seq of the last record in its log.
    pub last_seq: u64,
    /// The seq of the last record `CAPSTAN_EVT` acknowledged.
    pub published_seq: u64,
    /// False while the log takes no writes; `degraded` or `log_failed` says why.
    pub healthy: bool,
    /// Why the log is read-only (a bad record), or `None`.
    pub degraded: Option<String>,
    /// Why the log could not be made durable (a failed flush), or `None`.
    pub log_failed: Option<String>,
    /// The outbox's alarm (a `duplicate` publish ack), or `None`.
    pub outbox_alarm: Option<String>,
    /// Ids of commands received but not completed.
    pub in_flight: Vec<String>,
    /// The driver the agent runs (`["docker"]`).
    pub drivers: Vec<String>,
    /// What that driver declares, each a boolean.
    pub capabilities: serde_json::Value,
    /// The agent's key figures; older agents: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
}

/// `intent`: the running intent rebuilt from the log (`capstan-agent intent --json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentAnswer {
    /// The seq of the last record folded in (0: an empty log).
    pub applied_seq: u64,
    /// Every prepared namespace, by name.
    pub namespaces: BTreeMap<String, NamespaceAnswer>,
    /// By `namespace/workload`.
    pub workloads: BTreeMap<String, WorkloadAnswer>,
    /// Commands received but not completed, by id → the seq that received them.
    #[serde(default)]
    pub in_flight: BTreeMap<String, u64>,
    /// The grant ledger (`docs/hooks.md`, *Grants follow what runs*).
    #[serde(default)]
    pub grants: GrantsAnswer,
}

/// A prepared namespace in an [`IntentAnswer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceAnswer {
    /// The seq of the `namespace_ready` that made it.
    pub ready_seq: u64,
}

/// A workload in an [`IntentAnswer`] (its revisions' specs are in the log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadAnswer {
    pub intent: RunIntent,
    /// The revision that runs when the workload runs.
    pub active_revision: Option<String>,
    /// Every revision ever prepared, by name.
    pub revisions: BTreeMap<String, RevisionState>,
    /// The last failure to bring the workload to its intent.
    pub failed: Option<ErrorCode>,
}

/// The grant ledger in an [`IntentAnswer`]: who may hold access for what.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantsAnswer {
    /// Namespace → owner → hold.
    pub namespaces: BTreeMap<String, BTreeMap<String, Hold>>,
    /// `namespace/workload` → revision → owner → hold.
    pub revisions: BTreeMap<String, BTreeMap<String, BTreeMap<String, Hold>>>,
}

/// What the controller wants of one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunIntent {
    /// Should run its active revision.
    Running,
    /// Explicitly stopped by `stop_workload`, or never activated.
    Stopped,
}

impl RunIntent {
    pub fn as_str(self) -> &'static str {
        match self {
            RunIntent::Running => "running",
            RunIntent::Stopped => "stopped",
        }
    }
}

/// Where a revision is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevisionState {
    /// Staged by `prepare_revision`; never the active one, or replaced since.
    Prepared,
    /// The workload's active revision.
    Active,
    /// Removed by `retire_revision`; kept as a tombstone so a late command for it is
    /// answered, not re-created.
    Retired,
}

/// How sure the grant ledger is that a hook owner holds access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// Its preparing call succeeded.
    Granted,
    /// Its preparing call began and did not succeed: cut short, answered invalidly, or
    /// interrupted by a crash. It may have granted.
    Pending,
}

/// `log`: a page of the host's records ([`super::LogRequest`] says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogAnswer {
    /// The records, as in `docs/protocol.md`, *Log records* (each with its `seq`).
    pub records: Vec<serde_json::Value>,
    /// The seq of the last record in the log.
    pub last_seq: u64,
    /// Where a prune cut the log, if one did.
    pub anchor: Option<AnchorSummary>,
}

impl LogAnswer {
    /// The seq of the page's last record.
    pub fn last_record_seq(&self) -> Option<u64> {
        self.records.last()?.get("seq")?.as_u64()
    }
}

/// Where retention cut a log: the last pruned record's seq and hash (hex), how many
/// records were pruned in all, and the last export file on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorSummary {
    pub seq: u64,
    pub hash: String,
    pub pruned: u64,
    pub file: String,
}

/// The local socket's `export` request: the export lines of records after `since` up
/// to `until`, at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    #[serde(default)]
    pub since: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// The local socket's `export` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportAnswer {
    /// The export lines (`docs/retention.md`, *Export format*).
    pub lines: Vec<serde_json::Value>,
    /// Where a prune cut the log, if one did.
    pub anchor: Option<AnchorSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verb_reads_back_as_itself_and_only_rpc_verbs_go_over_nats() {
        for verb in Verb::ALL {
            assert_eq!(Verb::parse(verb.as_str()), Some(verb));
            let json = serde_json::to_value(verb).unwrap();
            assert_eq!(json, verb.as_str());
            assert_eq!(
                crate::nats_layout::RPC_VERBS.contains(&verb.as_str()),
                !verb.is_local_only(),
                "{verb}"
            );
        }
        assert_eq!(Verb::parse("Ping"), None);
    }

    #[test]
    fn an_intent_answer_reads_the_documented_example() {
        // docs/protocol.md, *Intent*.
        let json = r#"{"applied_seq":51,
 "namespaces":{"shop":{"ready_seq":3}},
 "workloads":{"shop/web":{"intent":"running","active_revision":"r2","failed":null,
                          "revisions":{"r1":"retired","r2":"active"}}},
 "in_flight":{"c-17":52},
 "grants":{"namespaces":{"shop":{"iam":"granted"}},
           "revisions":{"shop/web":{"r1":{},"r2":{"iam":"granted","mesh":"pending"}}}}}"#;
        let intent: IntentAnswer = serde_json::from_str(json).unwrap();
        let web = &intent.workloads["shop/web"];
        assert_eq!(web.intent, RunIntent::Running);
        assert_eq!(web.revisions["r1"], RevisionState::Retired);
        assert_eq!(intent.in_flight["c-17"], 52);
        assert_eq!(
            intent.grants.revisions["shop/web"]["r2"]["mesh"],
            Hold::Pending
        );
        let back = serde_json::to_value(&intent).unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
    }

    #[test]
    fn a_status_answer_of_an_agent_without_figures_reads_and_writes_none() {
        let json = serde_json::json!({
            "host": "h1", "version": "0.1.0", "last_seq": 4, "published_seq": 4,
            "healthy": true, "degraded": null, "log_failed": null, "outbox_alarm": null,
            "in_flight": [], "drivers": ["sim"], "capabilities": {}
        });
        let status: StatusAnswer = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(status.figures, None);
        assert_eq!(serde_json::to_value(&status).unwrap(), json);
    }
}
