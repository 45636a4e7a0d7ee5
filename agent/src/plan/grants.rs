//! Grants follow what runs: the decisions about hook grants around the driver steps,
//! without I/O, from the ledger ([`crate::grants`]) and what the driver reports now.
//!
//! - [`with_grants`]: a command that changes nothing for the driver still grants what
//!   is missing (after a partly failed revocation, or an owner added since).
//! - [`regrant`]: whether a step grants again for what runs (or is ready) and still
//!   will when the command ends, so that a failed grant revokes nothing.
//! - [`stale`]: after a revision starts, the other revisions of its workload that still
//!   hold grants, to be revoked.
//! - [`roll_back`]: after an activation or start that did not complete (the driver
//!   failed, or a crash cut it short), what makes the workload run what intent says,
//!   with grants held by that revision only.
//! - [`recover`]: for an activation or start interrupted by a crash after its grants
//!   began, whether the driver had applied it (finish it) or not (roll back).

use super::Step;
use crate::grants::Hold;
use crate::intent::{Intent, RunIntent};
use capstan_common::{Readiness, Strategy};
use capstan_driver::BackendState;

/// The owners that grant, by level: each must hold access for a running revision (or
/// a ready namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Duties {
    /// Owners taking `before_workload_start`.
    pub workload: Vec<String>,
    /// Owners taking `after_namespace_prepared`.
    pub namespace: Vec<String>,
}

impl Duties {
    /// True when nobody grants anything: every decision here is then a no-op.
    pub fn is_empty(&self) -> bool {
        self.workload.is_empty() && self.namespace.is_empty()
    }
}

/// True when the ledger tracks `holders` and some duty is not surely granted. A
/// revision or namespace the ledger never saw a call for (one granted by a build
/// before the ledger) counts as granted: nothing says otherwise.
fn missing(holders: Option<&crate::grants::Holders>, duty: &[String]) -> bool {
    holders.is_some_and(|h| duty.iter().any(|o| h.get(o) != Some(&Hold::Granted)))
}

/// True when every owner in `duty` surely holds `revision`'s grant (tracked and
/// granted; an untracked revision is not sure).
pub fn surely_granted(intent: &Intent, duties: &Duties, ns: &str, wl: &str, rev: &str) -> bool {
    let holders = intent.grants.of_revision(ns, wl, rev);
    match holders {
        None => duties.workload.is_empty(),
        Some(h) => duties
            .workload
            .iter()
            .all(|o| h.get(o) == Some(&Hold::Granted)),
    }
}

/// Turns a no-op step into one that grants again when grants are missing: activating
/// or starting the running revision becomes a start (`before_workload_start` for every
/// owner, then the driver's start with the launch env); ensuring a ready namespace
/// becomes an ensure (`after_namespace_prepared` again).
pub fn with_grants(step: Step, intent: &Intent, duties: &Duties) -> Step {
    match step {
        Step::AlreadyRunning {
            namespace,
            workload,
            revision,
        } => {
            let held = intent.grants.of_revision(&namespace, &workload, &revision);
            let spec = intent
                .workload(&namespace, &workload)
                .and_then(|w| w.revisions.get(&revision))
                .map(|r| r.spec.clone());
            match spec {
                Some(spec) if missing(held, &duties.workload) => Step::Start {
                    namespace,
                    workload,
                    revision,
                    spec,
                },
                _ => Step::AlreadyRunning {
                    namespace,
                    workload,
                    revision,
                },
            }
        }
        Step::AlreadyReady { namespace }
            if missing(intent.grants.of_namespace(&namespace), &duties.namespace) =>
        {
            Step::EnsureNamespace { namespace }
        }
        step => step,
    }
}

/// When `step` grants again for what already runs and still will when the command
/// ends, whatever it does: a start or activation of the revision intent runs, an
/// ensure of a namespace intent has ready (what [`with_grants`] makes of a no-op). The
/// answer names it (`revision r1`, `namespace shop`) for the error: a failed
/// preparing phase then revokes nothing, neither what it held before the command nor
/// what it was granted since, as a crash there does (compensation never touches what
/// runs). `None`: a first grant, compensated on failure.
pub fn regrant(intent: &Intent, step: &Step) -> Option<String> {
    if let Some(s) = starting(step) {
        let w = intent.workload(s.namespace, s.workload)?;
        return super::runs(w, s.revision).then(|| format!("revision {}", s.revision));
    }
    match step {
        Step::EnsureNamespace { namespace } => intent
            .namespaces
            .contains_key(namespace)
            .then(|| format!("namespace {namespace}")),
        _ => None,
    }
}

/// The revisions of `ns/wl` other than `running` that still hold grants: each is
/// revoked once `running` is up.
pub fn stale(intent: &Intent, ns: &str, wl: &str, running: &str) -> Vec<String> {
    intent
        .grants
        .held_revisions(ns, wl)
        .into_iter()
        .filter(|r| r != running)
        .collect()
}

/// What the driver reports now for the revision a step was about and for the one
/// intent runs (the predecessor), `None`: no backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub target: Option<BackendState>,
    pub intended: Option<BackendState>,
    /// Why the target, which runs, is not started after all: the driver could not
    /// settle it ([`capstan_driver::Driver::settle`]: kube's rollout did not
    /// complete) or it did not pass its readiness check (`spec.readiness`) when
    /// probed again; `None`: settled and passed (or no check).
    pub unready: Option<String>,
}

/// One thing to do to bring a workload back to intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Stop this revision: it runs and intent does not run it.
    Stop(String),
    /// Revoke every grant this revision holds (compensating, reverse order, under
    /// the cleanup budget). Skipped if the stop before it failed: what runs keeps its
    /// grants.
    Revoke(String),
    /// Start this revision again without hooks (it holds its grants): intent runs it
    /// and it does not run.
    Resume(String),
}

/// The revision intent runs for `ns/wl`, if any.
pub fn intended(intent: &Intent, ns: &str, wl: &str) -> Option<String> {
    let w = intent.workload(ns, wl)?;
    (w.intent == RunIntent::Running)
        .then(|| w.active_revision.clone())
        .flatten()
}

/// After an activation or start of `revision` that did not complete: stop it if it
/// runs and intent does not run it, revoke what it holds unless intent runs it, and
/// start the revision intent runs again if it no longer runs. Intent itself is what
/// the log says before the command: a command that did not complete changed nothing.
///
/// The order follows the spec's `strategy`: start-first brings the revision intent
/// runs back before the other is stopped (the two may run at once, and on a cluster
/// the predecessor's pods are never all gone); stop-first stops first, as the two
/// must never run at once.
pub fn roll_back(
    intent: &Intent,
    ns: &str,
    wl: &str,
    revision: &str,
    strategy: Strategy,
    seen: &Seen,
) -> Vec<Fix> {
    let intended = intended(intent, ns, wl);
    let mut undo = Vec::new();
    if intended.as_deref() != Some(revision) {
        if seen.target == Some(BackendState::Running) {
            undo.push(Fix::Stop(revision.into()));
        }
        let held = intent.grants.of_revision(ns, wl, revision);
        if held.is_some_and(|h| !h.is_empty()) {
            undo.push(Fix::Revoke(revision.into()));
        }
    }
    let resume = intended
        .filter(|p| p != revision && seen.intended != Some(BackendState::Running))
        .map(Fix::Resume);
    match strategy {
        Strategy::StartFirst => resume.into_iter().chain(undo).collect(),
        Strategy::StopFirst => undo.into_iter().chain(resume).collect(),
    }
}

/// How to end an activation or start that a crash interrupted after its grants began.
/// A revision with a readiness check counts as applied only once it passes it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The driver had applied it (the revision runs, every owner granted): record its
    /// effect, stopping the predecessor first if it still runs, then revoke stale
    /// grants. The command succeeds.
    Finish { stop: Option<String> },
    /// It had not: these fixes, then the command fails `interrupted` (retryable).
    RollBack(Vec<Fix>),
}

/// What an activation or start starts, and the revision it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starting<'a> {
    pub namespace: &'a str,
    pub workload: &'a str,
    pub revision: &'a str,
    pub previous: Option<&'a str>,
    /// The started revision's readiness check, if its spec has one.
    pub readiness: Option<&'a Readiness>,
    /// How it replaces the revision that runs.
    pub strategy: Strategy,
}

/// [`Starting`] for an activation or start; `None` for any other step.
pub fn starting(step: &Step) -> Option<Starting<'_>> {
    match step {
        Step::Activate {
            namespace,
            workload,
            revision,
            previous,
            spec,
        } => Some(Starting {
            namespace,
            workload,
            revision,
            previous: previous.as_deref(),
            readiness: spec.readiness.as_ref(),
            strategy: spec.strategy,
        }),
        Step::Start {
            namespace,
            workload,
            revision,
            spec,
        } => Some(Starting {
            namespace,
            workload,
            revision,
            previous: None,
            readiness: spec.readiness.as_ref(),
            strategy: spec.strategy,
        }),
        // Every step is named: a new one that starts something is classified here
        // (a crash in the middle of it is then recovered as a start).
        Step::EnsureNamespace { .. }
        | Step::DeleteNamespace { .. }
        | Step::Prepare { .. }
        | Step::Stop { .. }
        | Step::Retire { .. }
        | Step::AlreadyRunning { .. }
        | Step::AlreadyReady { .. } => None,
    }
}

/// Decides [`Recovery`] for `step` (an activation or start; `None` for any other step).
pub fn recover(intent: &Intent, duties: &Duties, step: &Step, seen: &Seen) -> Option<Recovery> {
    let Starting {
        namespace: ns,
        workload: wl,
        revision: rev,
        previous,
        strategy,
        ..
    } = starting(step)?;
    let applied = seen.target == Some(BackendState::Running)
        && seen.unready.is_none()
        && surely_granted(intent, duties, ns, wl, rev);
    if applied {
        let predecessor_runs = seen.intended == Some(BackendState::Running);
        let stop = previous.filter(|_| predecessor_runs).map(String::from);
        return Some(Recovery::Finish { stop });
    }
    Some(Recovery::RollBack(roll_back(
        intent, ns, wl, rev, strategy, seen,
    )))
}

#[cfg(test)]
mod tests;
