//! The reconciler's loop: [`Executor::look`] compares intent with what the driver
//! observes while the agent runs, as startup reconciliation does once, so that a
//! backend removed, changed or given up on outside capstan, or one labelled ours that
//! intent does not know, is seen within one interval (`reconcile_interval_secs`) rather
//! than at the next agent start.
//!
//! A look differs from startup in three ways:
//! - It **starts nothing.** A workload that exited is the supervisor's (its backoff
//!   and its giving up decide); one whose backend is gone needs a command's start,
//!   with its grants, so it is recorded failed (`backend_missing`) for the controller.
//! - It records **a finding once**: a missing or given-up backend is not recorded
//!   again while intent already holds that failure (`workload_failed` with the same
//!   code: from the log, so also across restarts), nor a drift or change the last look
//!   (or startup) recorded and that is still there ([`Noticed`], in memory).
//! - What it changes on the host — stopping a revision that runs against intent,
//!   reaping an unknown backend of ours when the driver reaps — it decides again under
//!   the namespace's lock, from intent and the driver observed again. A command on
//!   that namespace (a prepare whose backend exists before its record does) is thus
//!   never undone half-way; a look finds nothing to do in the common case and takes
//!   no lock then.
//!
//! What it records is caused by the `supervisor` (the fold ignores it: intent never
//! changes here).

use super::{Executor, ReconcileReport};
use crate::event::Cause;
use crate::intent::Intent;
use crate::log::LogError;
use crate::plan::{self, Action};
use capstan_common::ErrorCode;
use std::collections::BTreeSet;

/// The drift and changes a look (or startup) found and recorded, by namespace,
/// workload and revision: found again, they are not recorded again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Noticed(BTreeSet<(String, String, String)>);

impl Noticed {
    /// The drift and changes among `actions`.
    pub(super) fn among(actions: &[Action]) -> Noticed {
        Noticed(actions.iter().filter_map(drift).collect())
    }
}

/// The finding `action` is, when it is a drift or a change.
fn drift(action: &Action) -> Option<(String, String, String)> {
    match action {
        Action::Drift {
            namespace,
            workload,
            revision,
        }
        | Action::Changed {
            namespace,
            workload,
            revision,
            ..
        } => Some((namespace.clone(), workload.clone(), revision.clone())),
        Action::Start { .. }
        | Action::Stop { .. }
        | Action::Missing { .. }
        | Action::Failed { .. } => None,
    }
}

/// The namespace `action` is about.
fn namespace(action: &Action) -> &str {
    match action {
        Action::Start { namespace, .. }
        | Action::Stop { namespace, .. }
        | Action::Missing { namespace, .. }
        | Action::Failed { namespace, .. }
        | Action::Changed { namespace, .. }
        | Action::Drift { namespace, .. } => namespace,
    }
}

/// Whether a look carries `action` out (see the module docs): never a start; a stop
/// only when the driver manages lifecycle; a failure intent does not hold yet; a
/// drift or change not `noticed` before.
fn to_do(action: &Action, intent: &Intent, noticed: &Noticed, manages: bool) -> bool {
    let holds = |namespace: &str, workload: &str, code: ErrorCode| {
        (intent.workload(namespace, workload)).is_some_and(|w| w.failed == Some(code))
    };
    match action {
        Action::Start { .. } => false,
        Action::Stop { .. } => manages,
        Action::Missing {
            namespace,
            workload,
            ..
        } => !holds(namespace, workload, ErrorCode::BackendMissing),
        Action::Failed {
            namespace,
            workload,
            ..
        } => !holds(namespace, workload, ErrorCode::BackendFailed),
        Action::Changed { .. } | Action::Drift { .. } => {
            !drift(action).is_some_and(|d| noticed.0.contains(&d))
        }
    }
}

impl Executor {
    /// One look (see the module docs): what it did, and in `noticed` the drift and
    /// changes there are now.
    pub async fn look(&self, noticed: &mut Noticed) -> Result<ReconcileReport, LogError> {
        let mut report = ReconcileReport::default();
        let manages = self.driver.capabilities().manages_lifecycle;
        let Some(found) = self.observed_plan().await else {
            return Ok(report);
        };
        let namespaces: BTreeSet<String> = self.log.with_intent(|intent| {
            (found.iter())
                .filter(|a| to_do(a, intent, noticed, manages))
                .map(|a| namespace(a).to_string())
                .collect()
        });
        let mut recorded = BTreeSet::new();
        for ns in namespaces {
            let _serial = self.lock_namespace(&ns).await;
            // Decided again under the lock: a command on `ns` may have run meanwhile.
            let Some(again) = self.observed_plan().await else {
                break;
            };
            let actions: Vec<Action> = self.log.with_intent(|intent| {
                (again.into_iter())
                    .filter(|a| namespace(a) == ns && to_do(a, intent, noticed, manages))
                    .collect()
            });
            for action in actions {
                recorded.extend(drift(&action));
                self.act(action, Cause::Supervisor, &mut report).await?;
            }
        }
        // Noticed from now on: what was recorded, by this look or before, and is still
        // there. A drift this look could not decide on (the host could not be observed
        // again) is looked at again next time.
        let still = Noticed::among(&found).0;
        recorded.extend(still.into_iter().filter(|d| noticed.0.contains(d)));
        *noticed = Noticed(recorded);
        if report != ReconcileReport::default() {
            self.log.durable(self.log.last_seq()).await?;
        }
        Ok(report)
    }

    /// What [`plan::plan`] says of the host as the driver observes it now; `None` when
    /// the driver cannot observe it (logged).
    async fn observed_plan(&self) -> Option<Vec<Action>> {
        match self.driver.observe().await {
            Ok(observed) => Some(self.log.with_intent(|i| plan::plan(i, &observed))),
            Err(e) => {
                tracing::warn!(error = %e.report(), "cannot observe the host; looking again later");
                None
            }
        }
    }
}
