//! What the coordinator's HTTP API answers (`docs/nats.md`, *HTTP API*), as the types
//! the API writes and the `capstan` CLI (and [`crate::rollout`]) reads. The answers it
//! passes on from an agent are `capstan_common::answers`' (`IntentAnswer`,
//! `StatusAnswer`, `LogAnswer`); a command's status is
//! [`capstan_common::status::CommandStatus`].

use capstan_common::answers::HostBeat;
use capstan_common::status::CommandStatus;
use serde::{Deserialize, Serialize};

/// `POST /v1/commands` (202): the command is on its way to its host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub id: String,
    pub host: String,
}

/// `POST /v1/commands/{id}/cancel`: the cancel's id (`None`: the command was done,
/// nothing was sent) and the command's status as read before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelAnswer {
    pub cancel_id: Option<String>,
    pub command: CommandStatus,
}

/// `GET /v1/hosts`: every host, and the fleet's heartbeat pace the statuses are
/// judged by (it grows with the fleet: `docs/nats.md`, *Heartbeats*). Coordinators of
/// earlier releases answer without `beat_secs` and `stale_after_secs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostsAnswer {
    pub hosts: Vec<HostStatus>,
    /// How often each host beats now.
    #[serde(default)]
    pub beat_secs: u64,
    /// A host whose beat is older is `stale`.
    #[serde(default)]
    pub stale_after_secs: u64,
}

/// One host as its beats, its key and its records show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostStatus {
    pub host: String,
    pub status: HostState,
    /// Its last heartbeat (`None` when `gone` or `unverified`, and when `warming`
    /// with none heard).
    pub beat: Option<HostBeat>,
    /// Seconds since that beat was written, by the coordinator's clock.
    pub age_secs: Option<i64>,
}

/// How the coordinator sees a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Its beat is within `stale_after`.
    Alive,
    /// Its last beat is older, still kept.
    Stale,
    /// No beat kept, but the host has events or a registered key.
    Gone,
    /// Its beat is not signed by a key registered for it.
    Unverified,
    /// No fresh beat heard yet, and this coordinator has heard beats for less than
    /// `stale_after` (it just started, or came back to NATS): alive or gone, it
    /// cannot tell yet.
    Warming,
}

impl HostState {
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Alive => "alive",
            HostState::Stale => "stale",
            HostState::Gone => "gone",
            HostState::Unverified => "unverified",
            HostState::Warming => "warming",
        }
    }
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /v1/hosts/{host}/events`: the host's records as published in `CAPSTAN_EVT`
/// (each its log record's JSON plus `host`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsAnswer {
    pub host: String,
    pub events: Vec<serde_json::Value>,
}

/// What [`crate::rollout::run`] returns and `capstan --json rollout` prints: every
/// host's result, sorted by host. A host the API refused a command for is
/// `unsubmitted`, one whose wait failed `unknown` (both `done: false`, with `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutSummary {
    /// Hosts.
    pub total: usize,
    /// Hosts that succeeded at every command.
    pub succeeded: usize,
    /// Commands in the rollout, each run on every host in turn.
    pub commands: usize,
    pub results: Vec<HostResult>,
}

/// One host's result in a rollout: the status of the last command it got to, and
/// which command that is. A host that did not succeed stopped at it: the commands
/// after it were not submitted to that host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostResult {
    /// Which command of the rollout `status` is of, from 1; equal to
    /// [`RolloutSummary::commands`] with `succeeded` when the host ran them all.
    pub step: usize,
    #[serde(flatten)]
    pub status: CommandStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_state_is_written_as_the_docs_spell_it() {
        for state in [
            HostState::Alive,
            HostState::Stale,
            HostState::Gone,
            HostState::Unverified,
            HostState::Warming,
        ] {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, state.as_str());
            assert_eq!(serde_json::from_value::<HostState>(json).unwrap(), state);
        }
    }
}
