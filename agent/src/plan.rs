//! Decisions, without I/O. [`decide`] turns one command into the one step that carries
//! it out (or the reason it cannot be); [`plan`] compares intent with what the driver
//! observes and lists the actions that converge the host; [`shutdown_sweep`] lists what
//! a graceful stop must stop; [`grants`] decides what to grant, revoke or finish
//! around the driver steps; [`resume`] decides what happens next to a command from
//! what the log holds of its id (answer, refuse, begin, finish, cut, recover, carry
//! out); [`Step::effect`] is what the log records once a step is
//! carried out. The executor performs what these return.

pub mod grants;
pub mod resume;
mod step;
pub use resume::{resume, Resume};
pub use step::{HookSequence, Step};

use crate::intent::{Intent, RevisionState, RunIntent, WorkloadIntent};
use capstan_common::{DriverKind, ErrorCode, Op, Spec};
use capstan_driver::{BackendState, Observed};

/// True when intent says `revision` is `w`'s active revision and runs: running intent
/// and no failure to reach it since it last started.
fn runs(w: &WorkloadIntent, revision: &str) -> bool {
    w.intent == RunIntent::Running
        && w.failed.is_none()
        && w.active_revision.as_deref() == Some(revision)
}

fn already_running(namespace: &str, workload: &str, revision: &str) -> Result<Step, Refusal> {
    Ok(Step::AlreadyRunning {
        namespace: namespace.into(),
        workload: workload.into(),
        revision: revision.into(),
    })
}

/// Why an accepted command cannot be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Result<Step, Refusal> {
    Err(Refusal {
        code,
        message: message.into(),
    })
}

/// Refuses a revision whose spec names another driver than the agent's: one prepared
/// with it, or (after the agent's driver was changed) one already in the log.
fn runs_on(driver: DriverKind, revision: &str, spec: &Spec) -> Result<(), Refusal> {
    if spec.driver == driver {
        return Ok(());
    }
    Err(Refusal {
        code: ErrorCode::DriverMismatch,
        message: format!(
            "revision {revision} is for driver {}; this agent runs {driver}",
            spec.driver
        ),
    })
}

/// Decides how to carry out `op` given the current intent, on an agent that runs the
/// `driver` kind of driver.
pub fn decide(intent: &Intent, driver: DriverKind, op: &Op) -> Result<Step, Refusal> {
    let ns_exists = |ns: &str| intent.namespaces.contains_key(ns);
    match op {
        // Carried out by the executor itself: it changes nothing on the host.
        Op::CancelCommand { .. } => refuse(
            ErrorCode::InvalidCommand,
            "a cancel is not a step on the host",
        ),
        Op::EnsureNamespace { namespace } if intent.namespaces.contains_key(namespace) => {
            Ok(Step::AlreadyReady {
                namespace: namespace.clone(),
            })
        }
        Op::EnsureNamespace { namespace } => Ok(Step::EnsureNamespace {
            namespace: namespace.clone(),
        }),
        Op::DeleteNamespace { namespace } => {
            let live: Vec<&str> = intent
                .workloads
                .values()
                .filter(|w| &w.namespace == namespace && w.has_live_revisions())
                .map(|w| w.workload.as_str())
                .collect();
            if !live.is_empty() {
                return refuse(
                    ErrorCode::NamespaceNotEmpty,
                    format!(
                        "namespace {namespace} still holds {} workload(s): {}",
                        live.len(),
                        live.join(", ")
                    ),
                );
            }
            Ok(Step::DeleteNamespace {
                namespace: namespace.clone(),
            })
        }
        Op::PrepareRevision {
            namespace,
            workload,
            revision,
            spec,
        } => {
            runs_on(driver, revision, spec)?;
            if !ns_exists(namespace) {
                return refuse(
                    ErrorCode::NamespaceNotFound,
                    format!("namespace {namespace} is not prepared"),
                );
            }
            if let Some(existing) = intent
                .workload(namespace, workload)
                .and_then(|w| w.revisions.get(revision))
            {
                if existing.state == RevisionState::Retired {
                    return refuse(
                        ErrorCode::RevisionRetired,
                        format!("revision {revision} was retired"),
                    );
                }
                if &existing.spec != spec {
                    return refuse(
                        ErrorCode::RevisionConflict,
                        format!("revision {revision} exists with a different spec; revisions are immutable"),
                    );
                }
            }
            Ok(Step::Prepare {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: revision.clone(),
                spec: spec.clone(),
            })
        }
        Op::ActivateRevision {
            namespace,
            workload,
            revision,
        } => {
            let w = intent
                .workload(namespace, workload)
                .ok_or_else(|| Refusal {
                    code: ErrorCode::WorkloadNotFound,
                    message: format!("workload {namespace}/{workload} is unknown"),
                })?;
            let r = w.revisions.get(revision).ok_or_else(|| Refusal {
                code: ErrorCode::RevisionNotFound,
                message: format!("revision {revision} of {namespace}/{workload} is not prepared"),
            })?;
            if r.state == RevisionState::Retired {
                return refuse(
                    ErrorCode::RevisionRetired,
                    format!("revision {revision} was retired"),
                );
            }
            runs_on(driver, revision, &r.spec)?;
            if runs(w, revision) {
                return already_running(namespace, workload, revision);
            }
            Ok(Step::Activate {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: revision.clone(),
                spec: r.spec.clone(),
                previous: w.active_revision.clone().filter(|p| p != revision),
            })
        }
        Op::StopWorkload {
            namespace,
            workload,
        } => {
            let w = intent
                .workload(namespace, workload)
                .ok_or_else(|| Refusal {
                    code: ErrorCode::WorkloadNotFound,
                    message: format!("workload {namespace}/{workload} is unknown"),
                })?;
            Ok(Step::Stop {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: w.active_revision.clone(),
            })
        }
        Op::StartWorkload {
            namespace,
            workload,
        } => {
            let w = intent
                .workload(namespace, workload)
                .ok_or_else(|| Refusal {
                    code: ErrorCode::WorkloadNotFound,
                    message: format!("workload {namespace}/{workload} is unknown"),
                })?;
            let (revision, spec) = w.active_spec().ok_or_else(|| Refusal {
                code: ErrorCode::NoActiveRevision,
                message: format!("workload {namespace}/{workload} has no active revision to start"),
            })?;
            runs_on(driver, revision, spec)?;
            if runs(w, revision) {
                return already_running(namespace, workload, revision);
            }
            Ok(Step::Start {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: revision.into(),
                spec: spec.clone(),
            })
        }
        Op::RetireRevision {
            namespace,
            workload,
            revision,
        } => {
            let known = intent
                .workload(namespace, workload)
                .and_then(|w| w.revisions.get(revision));
            if known.is_none() {
                return refuse(
                    ErrorCode::RevisionNotFound,
                    format!("revision {revision} of {namespace}/{workload} is unknown"),
                );
            }
            // Retiring an already-retired revision repeats the (idempotent) removal.
            Ok(Step::Retire {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: revision.clone(),
            })
        }
    }
}

/// One thing to do so that the host matches intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A running-intent workload's active revision is not running.
    Start {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// A revision runs that should not: its workload is stopped, or it is not active.
    Stop {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// Intent names an active revision the backend does not have.
    Missing {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// A running-intent workload's active revision is one the backend has given up
    /// on: it is reported, not started.
    Failed {
        namespace: String,
        workload: String,
        revision: String,
        /// The backend's reason.
        reason: String,
    },
    /// The backend has something labelled ours that intent does not know.
    Drift {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// A revision of ours was changed outside capstan (`what`: e.g. a Deployment
    /// scaled by hand): drift too, reported and never undone or removed.
    Changed {
        namespace: String,
        workload: String,
        revision: String,
        what: String,
    },
}

/// Lists the actions that bring the observed host to intent. Pure and idempotent:
/// planning again after the actions succeed returns nothing but drift.
pub fn plan(intent: &Intent, observed: &Observed) -> Vec<Action> {
    let mut actions = Vec::new();
    for w in intent.workloads.values() {
        let (ns, wl) = (w.namespace.clone(), w.workload.clone());
        if let (RunIntent::Running, Some(active)) = (w.intent, &w.active_revision) {
            match observed.revision(&ns, &wl, active) {
                Some(BackendState::Running) => {}
                Some(BackendState::Stopped) => actions.push(Action::Start {
                    namespace: ns.clone(),
                    workload: wl.clone(),
                    revision: active.clone(),
                }),
                Some(BackendState::Failed { reason }) => actions.push(Action::Failed {
                    namespace: ns.clone(),
                    workload: wl.clone(),
                    revision: active.clone(),
                    reason: reason.clone(),
                }),
                None => actions.push(Action::Missing {
                    namespace: ns.clone(),
                    workload: wl.clone(),
                    revision: active.clone(),
                }),
            }
        }
        for (rev, state) in observed
            .workloads
            .get(&capstan_common::workload_key(&ns, &wl))
            .into_iter()
            .flatten()
        {
            let should_run =
                w.intent == RunIntent::Running && w.active_revision.as_ref() == Some(rev);
            if state.is_running() && !should_run && w.revisions.contains_key(rev) {
                actions.push(Action::Stop {
                    namespace: ns.clone(),
                    workload: wl.clone(),
                    revision: rev.clone(),
                });
            }
        }
    }
    for (key, revisions) in &observed.workloads {
        let known = intent.workloads.get(key);
        for rev in revisions.keys() {
            let tracked = known
                .and_then(|w| w.revisions.get(rev))
                .is_some_and(|r| r.state != RevisionState::Retired);
            if !tracked {
                let (ns, wl) = key.split_once('/').unwrap_or((key, ""));
                actions.push(Action::Drift {
                    namespace: ns.into(),
                    workload: wl.into(),
                    revision: rev.clone(),
                });
            }
        }
    }
    for (key, revisions) in &observed.changed {
        let (ns, wl) = key.split_once('/').unwrap_or((key, ""));
        let known = intent.workloads.get(key);
        for (rev, what) in revisions {
            // A revision intent does not know is reported once, as drift above.
            let tracked = known
                .and_then(|w| w.revisions.get(rev))
                .is_some_and(|r| r.state != RevisionState::Retired);
            if !tracked {
                continue;
            }
            actions.push(Action::Changed {
                namespace: ns.into(),
                workload: wl.into(),
                revision: rev.clone(),
                what: what.clone(),
            });
        }
    }
    actions
}

/// What a graceful agent stop must stop when the driver manages lifecycle: the running
/// revision of every running-intent workload. Intent is not changed by doing so.
pub fn shutdown_sweep(intent: &Intent, observed: &Observed) -> Vec<Action> {
    intent
        .workloads
        .values()
        .filter(|w| w.intent == RunIntent::Running)
        .filter_map(|w| {
            let rev = w.active_revision.as_ref()?;
            (observed.revision(&w.namespace, &w.workload, rev) == Some(&BackendState::Running))
                .then(|| Action::Stop {
                    namespace: w.namespace.clone(),
                    workload: w.workload.clone(),
                    revision: rev.clone(),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests;
