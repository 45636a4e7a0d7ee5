//! The step a command comes to ([`Step`], what [`super::decide`] returns) and what is
//! decided about it without I/O: the hook calls around its driver call
//! ([`Step::hooks`]), what it is about ([`Step::target`]) and the event that records
//! it carried out ([`Step::effect`]).

use crate::event::{Cause, Event};
use capstan_common::{Phase, Spec};

/// The one driver step that carries out an accepted command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    EnsureNamespace {
        namespace: String,
    },
    DeleteNamespace {
        namespace: String,
    },
    Prepare {
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
    },
    /// Start `revision`, then stop `previous`.
    Activate {
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
        previous: Option<String>,
    },
    Start {
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
    },
    /// Stop the active revision (`None`: nothing to stop, only intent changes).
    Stop {
        namespace: String,
        workload: String,
        revision: Option<String>,
    },
    Retire {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// Nothing to do: the command asks for what already is (activating the revision
    /// that is active and running, starting a workload that runs). No hook and no
    /// driver call; the command completes `succeeded` with no effect event.
    AlreadyRunning {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// Nothing to do: `ensure_namespace` of a namespace that is ready. No hook (a
    /// failing `after_namespace_prepared` would revoke the access of workloads that
    /// run in it) and no driver call; completes `succeeded` with no effect event.
    AlreadyReady {
        namespace: String,
    },
}

/// A step's hook phase and its place around the driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookSequence {
    /// No hooks: preparing a revision (nothing runs yet), or a step with nothing to do
    /// (an activation of what runs revokes only what is stale: `grants::stale`).
    None,
    /// The driver call, then `phase` grants (owners prepare for what now exists).
    DriverThenGrant(Phase),
    /// `phase` grants first, and the launch env its owners return goes into the driver
    /// call; a driver call that fails is rolled back (`grants::roll_back`).
    GrantThenDriver(Phase),
    /// `phase` revokes first, then the driver call.
    RevokeThenDriver(Phase),
}

impl Step {
    /// The namespace, workload and revision a step concerns: what its hook calls are
    /// about (a stop's revision: the one running, if any).
    pub fn target(&self) -> (String, Option<String>, Option<String>) {
        match self {
            Step::EnsureNamespace { namespace }
            | Step::DeleteNamespace { namespace }
            | Step::AlreadyReady { namespace } => (namespace.clone(), None, None),
            Step::Prepare {
                namespace,
                workload,
                revision,
                ..
            }
            | Step::Activate {
                namespace,
                workload,
                revision,
                ..
            }
            | Step::Start {
                namespace,
                workload,
                revision,
                ..
            }
            | Step::Retire {
                namespace,
                workload,
                revision,
            }
            | Step::AlreadyRunning {
                namespace,
                workload,
                revision,
            } => (
                namespace.clone(),
                Some(workload.clone()),
                Some(revision.clone()),
            ),
            Step::Stop {
                namespace,
                workload,
                revision,
            } => (namespace.clone(), Some(workload.clone()), revision.clone()),
        }
    }

    /// The spec the step runs a revision with (a prepare, an activation, a start).
    pub fn spec(&self) -> Option<&Spec> {
        match self {
            Step::Prepare { spec, .. } | Step::Activate { spec, .. } | Step::Start { spec, .. } => {
                Some(spec)
            }
            Step::EnsureNamespace { .. }
            | Step::DeleteNamespace { .. }
            | Step::Stop { .. }
            | Step::Retire { .. }
            | Step::AlreadyRunning { .. }
            | Step::AlreadyReady { .. } => None,
        }
    }

    /// Which lifecycle hook phase goes with this step, and on which side of its
    /// driver call (docs/hooks.md). The executor calls them in this order.
    pub fn hooks(&self) -> HookSequence {
        match self {
            Step::Prepare { .. } | Step::AlreadyRunning { .. } | Step::AlreadyReady { .. } => {
                HookSequence::None
            }
            Step::EnsureNamespace { .. } => {
                HookSequence::DriverThenGrant(Phase::AfterNamespacePrepared)
            }
            Step::Activate { .. } | Step::Start { .. } => {
                HookSequence::GrantThenDriver(Phase::BeforeWorkloadStart)
            }
            Step::Stop { .. } | Step::Retire { .. } => {
                HookSequence::RevokeThenDriver(Phase::BeforeWorkloadStop)
            }
            Step::DeleteNamespace { .. } => {
                HookSequence::RevokeThenDriver(Phase::BeforeNamespaceDelete)
            }
        }
    }

    /// The event that records this step carried out for command `id`: the command's
    /// effect, written before its completion (`None` for a step with nothing to do).
    /// Every event returned is one [`Event::is_effect`] names.
    /// Takes the step: what the event holds is moved, nothing copied.
    pub fn effect(self, id: &str) -> Option<Event> {
        let command_id = id.to_string();
        let by = || Cause::Command(id.to_string());
        Some(match self {
            Step::AlreadyRunning { .. } | Step::AlreadyReady { .. } => return None,
            Step::EnsureNamespace { namespace } => Event::NamespaceReady {
                command_id,
                namespace,
            },
            Step::DeleteNamespace { namespace } => Event::NamespaceDeleted {
                command_id,
                namespace,
            },
            Step::Prepare {
                namespace,
                workload,
                revision,
                spec,
            } => Event::RevisionPrepared {
                command_id,
                namespace,
                workload,
                revision,
                spec,
            },
            Step::Activate {
                namespace,
                workload,
                revision,
                previous,
                ..
            } => Event::WorkloadStarted {
                cause: by(),
                namespace,
                workload,
                revision,
                previous,
            },
            Step::Start {
                namespace,
                workload,
                revision,
                ..
            } => Event::WorkloadStarted {
                cause: by(),
                namespace,
                workload,
                revision,
                previous: None,
            },
            Step::Stop {
                namespace,
                workload,
                revision,
            } => Event::WorkloadStopped {
                cause: by(),
                namespace,
                workload,
                revision,
            },
            Step::Retire {
                namespace,
                workload,
                revision,
            } => Event::RevisionRetired {
                command_id,
                namespace,
                workload,
                revision,
            },
        })
    }
}

#[cfg(test)]
mod tests;
