//! Lifecycle hooks: the other subsystems (IAM, networking, secrets) that must grant or
//! revoke access around a namespace's and a workload's life.
//!
//! - [`config`]: the owners, from trusted local config, validated once and frozen.
//! - [`exec`], [`nats`]: the real runners (a process per call, or a NATS request,
//!   JSON in and out), behind [`Runners`].
//! - [`phase`]: running a phase across owners, with durable progress in the log,
//!   reverse-order compensation and the fresh cleanup budget.
//! - [`env`]: the launch environment rules, applied once to the merged result.
//!
//! Nothing here puts a hook's message or any value into an error or an event: errors
//! name the phase and the owner only.

pub mod config;
#[cfg(test)]
mod conformance;
pub mod env;
pub mod exec;
pub mod nats;
pub mod phase;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use config::{HookConfig, HookConfigError};
pub use phase::{HookContext, OnFailure, PhaseError, Prepared};

pub use capstan_common::Phase;

/// How an owner is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookKind {
    /// A process per call: argv[0] is an existing executable.
    Exec { argv: Vec<String> },
    /// A NATS request on `subject` of the server `nats` connects to (its `url`, with
    /// its credentials and TLS settings).
    Nats {
        nats: Box<capstan_common::nats::NatsConfig>,
        subject: String,
    },
}

/// One configured hook owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookOwner {
    pub name: String,
    pub kind: HookKind,
    pub timeout: Duration,
    pub phases: Vec<Phase>,
}

impl HookOwner {
    pub fn takes(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }
}

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default budget for compensation after a failed or cancelled preparation.
pub const DEFAULT_CLEANUP_BUDGET: Duration = Duration::from_secs(5);

/// The frozen owner list. Built once at start from config; there is no way to change
/// it afterwards (an `Arc` of an immutable slice): changing hooks needs a restart.
#[derive(Clone)]
pub struct Hooks {
    owners: Arc<[HookOwner]>,
    runner: Arc<dyn HookRunner>,
    cleanup_budget: Duration,
    /// Every call's result and duration is recorded here.
    metrics: Arc<crate::metrics::Metrics>,
}

impl Hooks {
    pub fn new(owners: Vec<HookOwner>, runner: Arc<dyn HookRunner>) -> Hooks {
        Hooks {
            owners: owners.into(),
            runner,
            cleanup_budget: DEFAULT_CLEANUP_BUDGET,
            metrics: Arc::default(),
        }
    }

    /// Records calls into `metrics` (the executor's).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Hooks {
        self.metrics = metrics;
        self
    }

    /// No owners at all: every phase is a no-op.
    pub fn none() -> Hooks {
        Hooks::new(Vec::new(), Arc::new(Runners::default()))
    }

    pub fn with_cleanup_budget(mut self, budget: Duration) -> Hooks {
        self.cleanup_budget = budget;
        self
    }

    pub fn owners(&self) -> &[HookOwner] {
        &self.owners
    }

    pub fn cleanup_budget(&self) -> Duration {
        self.cleanup_budget
    }

    /// The config-order indexes of the owners named in `names` (unknown names are
    /// skipped: an owner no longer configured cannot be called).
    pub fn indexes<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Vec<usize> {
        let names: Vec<&String> = names.into_iter().collect();
        (0..self.owners.len())
            .filter(|&i| names.contains(&&self.owners[i].name))
            .collect()
    }

    /// The names of the owners taking `phase`, in config order.
    pub fn takers(&self, phase: Phase) -> Vec<String> {
        self.owners
            .iter()
            .filter(|o| o.takes(phase))
            .map(|o| o.name.clone())
            .collect()
    }

    /// The indexes of the owners taking part in `phase`, in calling order: config order
    /// for preparing phases, reverse for revoking ones.
    pub fn order(&self, phase: Phase) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.owners.len())
            .filter(|&i| self.owners[i].takes(phase))
            .collect();
        if !phase.is_preparing() {
            v.reverse();
        }
        v
    }
}

/// What a hook is told (JSON on stdin for `exec`). Version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRequest {
    pub v: u32,
    pub phase: Phase,
    pub owner: String,
    pub host: String,
    pub command_id: String,
    pub namespace: String,
    pub workload: Option<String>,
    pub revision: Option<String>,
    /// True when this call undoes this owner's earlier preparing call (after a later
    /// owner failed, a rejected launch env, a cancellation or a crash).
    pub compensating: bool,
}

#[cfg(test)]
impl HookRequest {
    /// A request for owner `t` about `ns/w@r1`, for runner tests.
    pub(crate) fn sample(phase: Phase) -> HookRequest {
        HookRequest {
            v: 1,
            phase,
            owner: "t".into(),
            host: "h1".into(),
            command_id: "c1".into(),
            namespace: "ns".into(),
            workload: Some("w".into()),
            revision: Some("r1".into()),
            compensating: false,
        }
    }
}

/// What a hook answers (JSON on stdout for `exec`, the reply payload for `nats`;
/// empty means `{}`; unknown fields are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookReply {
    /// `false` is a failure (the only way a `nats` owner can fail a call).
    #[serde(default)]
    pub ok: Option<bool>,
    /// Launch environment placeholders (`before_workload_start` only; ignored
    /// elsewhere).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl HookReply {
    /// Reads a reply: at most [`MAX_REPLY_BYTES`], a JSON object or nothing at all.
    pub fn parse(bytes: &[u8]) -> Result<HookReply, CallFailure> {
        if bytes.len() > MAX_REPLY_BYTES {
            return Err(CallFailure::Reply);
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(HookReply::default());
        }
        let reply: HookReply = serde_json::from_slice(bytes).map_err(|_| CallFailure::Reply)?;
        if reply.ok == Some(false) {
            return Err(CallFailure::Exit);
        }
        Ok(reply)
    }
}

/// The largest reply accepted.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

/// Why one call failed. Carries no text from the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// Could not be started (the executable vanished) or reached (no NATS server,
    /// no responder).
    Spawn,
    /// Exited non-zero or was killed by a signal.
    Exit,
    /// The reply was not the expected JSON (or was too large).
    Reply,
    /// Ran past its timeout and was killed.
    Timeout,
    /// Cancelled and killed.
    Cancelled,
}

impl CallFailure {
    /// Whether the owner may have granted despite the failure, so a preparing call that
    /// failed this way is compensated too: a call cut short (timeout, cancellation) may
    /// have granted before it was killed, and one whose reply was invalid said it
    /// succeeded (exit 0). An owner that could not be reached granted nothing, and one
    /// that reported failure cleans up its own partial work.
    pub fn may_have_granted(self) -> bool {
        matches!(
            self,
            CallFailure::Timeout | CallFailure::Cancelled | CallFailure::Reply
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CallFailure::Spawn => "could not be started or reached",
            CallFailure::Exit => "failed",
            CallFailure::Reply => "replied with an invalid reply",
            CallFailure::Timeout => "timed out",
            CallFailure::Cancelled => "was cancelled",
        }
    }
}

/// Calls one owner once. Implementations must be cancel-safe: the caller enforces the
/// timeout and the cancellation token by dropping the future, and dropping it must
/// stop the call (the exec runner kills the hook's process group).
#[async_trait::async_trait]
pub trait HookRunner: Send + Sync {
    async fn call(
        &self,
        owner: &HookOwner,
        request: &HookRequest,
    ) -> Result<HookReply, CallFailure>;
}

/// The real runner: each owner by its kind.
#[derive(Default)]
pub struct Runners {
    exec: exec::ExecRunner,
    nats: nats::NatsRunner,
}

#[async_trait::async_trait]
impl HookRunner for Runners {
    async fn call(
        &self,
        owner: &HookOwner,
        request: &HookRequest,
    ) -> Result<HookReply, CallFailure> {
        match owner.kind {
            HookKind::Exec { .. } => self.exec.call(owner, request).await,
            HookKind::Nats { .. } => self.nats.call(owner, request).await,
        }
    }
}
