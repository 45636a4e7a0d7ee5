//! Lifecycle hook phases: where in a workload's or namespace's life the agent calls
//! the hook owners. Part of the wire protocol (hook requests, `hook_*` events).

use serde::{Deserialize, Serialize};

/// The four points in a lifecycle where owners are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// After `ensure_namespace` prepared the tenant infrastructure, before ready.
    AfterNamespacePrepared,
    /// Before a workload (re)starts; owners may contribute launch env placeholders.
    BeforeWorkloadStart,
    /// Before a workload is stopped or a revision retired (reverse order).
    BeforeWorkloadStop,
    /// Before a namespace's infrastructure is deleted (reverse order).
    BeforeNamespaceDelete,
}

impl Phase {
    pub const ALL: [Phase; 4] = [
        Phase::AfterNamespacePrepared,
        Phase::BeforeWorkloadStart,
        Phase::BeforeWorkloadStop,
        Phase::BeforeNamespaceDelete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::AfterNamespacePrepared => "after_namespace_prepared",
            Phase::BeforeWorkloadStart => "before_workload_start",
            Phase::BeforeWorkloadStop => "before_workload_stop",
            Phase::BeforeNamespaceDelete => "before_namespace_delete",
        }
    }

    /// Preparing phases grant (config order); revoking phases revoke (reverse order).
    pub fn is_preparing(self) -> bool {
        matches!(
            self,
            Phase::AfterNamespacePrepared | Phase::BeforeWorkloadStart
        )
    }

    /// The revoking phase that undoes this preparing phase.
    pub fn compensation(self) -> Option<Phase> {
        match self {
            Phase::AfterNamespacePrepared => Some(Phase::BeforeNamespaceDelete),
            Phase::BeforeWorkloadStart => Some(Phase::BeforeWorkloadStop),
            _ => None,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
