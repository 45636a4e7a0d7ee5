//! The grant ledger: which hook owners may hold access for what, folded from the
//! log's hook records. It is part of [`crate::intent::Intent`] and, like it, only
//! folds: the decisions that read it (what to grant, revoke or finish) are in
//! [`crate::plan`].
//!
//! A preparing call (`after_namespace_prepared`, `before_workload_start`) that began
//! makes its owner a holder, [`Hold::Pending`] until it succeeds ([`Hold::Granted`]);
//! one the owner reported failed (`hook_failed`) or could not be reached for undoes a
//! pending hold, since the owner cleans up after itself; one cut short or answered
//! invalidly leaves it pending (it may have granted). A revoking call that succeeded
//! (`before_workload_stop`, `before_namespace_delete`) ends the hold; one that failed
//! leaves it. Namespace phases hold for the namespace, workload phases for one
//! revision: the one the `hook_started` names, or (records written before it named
//! one) the command's revision, for `start_workload` and `stop_workload` the
//! workload's active revision when the command arrived.

use crate::event::Event;
use capstan_common::{ErrorCode, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How sure the ledger is that an owner holds access (the `intent` answer's word for
/// it).
pub use capstan_common::answers::Hold;

/// Owner name → hold.
pub type Holders = BTreeMap<String, Hold>;

/// What an in-flight command's hook calls are about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub namespace: String,
    pub workload: Option<String>,
    pub revision: Option<String>,
}

/// The ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    /// Namespace → its holders.
    pub namespaces: BTreeMap<String, Holders>,
    /// Workload key (`namespace/workload`) → revision → its holders.
    pub revisions: BTreeMap<String, BTreeMap<String, Holders>>,
    /// In-flight command id → what its current hook call is about.
    pub targets: BTreeMap<String, Target>,
}

/// Whether a phase's holds are the namespace's or a revision's.
fn for_namespace(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::AfterNamespacePrepared | Phase::BeforeNamespaceDelete
    )
}

impl Grants {
    /// The holders of a revision: `None` when the ledger has never seen a call for it
    /// (none was made, or only before this build kept the ledger), `Some` (maybe
    /// empty: every hold revoked) once it has.
    pub fn of_revision(&self, namespace: &str, workload: &str, revision: &str) -> Option<&Holders> {
        self.revisions
            .get(&capstan_common::workload_key(namespace, workload))?
            .get(revision)
    }

    /// The holders of a namespace, as [`Grants::of_revision`].
    pub fn of_namespace(&self, namespace: &str) -> Option<&Holders> {
        self.namespaces.get(namespace)
    }

    /// The revisions of a workload that have at least one holder.
    pub fn held_revisions(&self, namespace: &str, workload: &str) -> Vec<String> {
        self.revisions
            .get(&capstan_common::workload_key(namespace, workload))
            .map(|r| {
                r.iter()
                    .filter(|(_, h)| !h.is_empty())
                    .map(|(rev, _)| rev.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A command arrived about `target` (its revision already resolved by the caller).
    pub fn received(&mut self, command_id: &str, target: Target) {
        self.targets.insert(command_id.to_string(), target);
    }

    /// The command is finished: its target is forgotten (its holds are not).
    pub fn completed(&mut self, command_id: &str) {
        self.targets.remove(command_id);
    }

    /// The revision is gone: nothing is tracked for it any more.
    pub fn retired(&mut self, namespace: &str, workload: &str, revision: &str) {
        let key = capstan_common::workload_key(namespace, workload);
        if let Some(revs) = self.revisions.get_mut(&key) {
            revs.remove(revision);
            if revs.is_empty() {
                self.revisions.remove(&key);
            }
        }
    }

    /// Everything held in `namespace` is gone with it.
    pub fn namespace_deleted(&mut self, namespace: &str) {
        self.namespaces.remove(namespace);
        let prefix = format!("{namespace}/");
        self.revisions.retain(|k, _| !k.starts_with(&prefix));
    }

    /// Folds a hook record in; other events are not the ledger's.
    pub fn apply(&mut self, event: &Event) {
        let (command_id, phase, owner) = match event {
            Event::HookStarted {
                command_id,
                phase,
                owner,
                revision,
            } => {
                if let (Some(rev), Some(t)) = (revision, self.targets.get_mut(command_id)) {
                    t.revision = Some(rev.clone());
                }
                (command_id, *phase, owner)
            }
            Event::HookSucceeded {
                command_id,
                phase,
                owner,
            }
            | Event::HookFailed {
                command_id,
                phase,
                owner,
                ..
            } => (command_id, *phase, owner),
            _ => return,
        };
        let Some(holders) = self.holders_mut(command_id, phase) else {
            return;
        };
        match (event, phase.is_preparing()) {
            (Event::HookStarted { .. }, true) => {
                holders.entry(owner.clone()).or_insert(Hold::Pending);
            }
            (Event::HookSucceeded { .. }, true) => {
                holders.insert(owner.clone(), Hold::Granted);
            }
            (Event::HookFailed { code, .. }, true)
                if *code == ErrorCode::HookFailed && holders.get(owner) == Some(&Hold::Pending) =>
            {
                holders.remove(owner);
            }
            (Event::HookSucceeded { .. }, false) => {
                holders.remove(owner);
            }
            _ => {}
        }
    }

    /// The holders a call of `command_id` in `phase` changes, created if missing.
    fn holders_mut(&mut self, command_id: &str, phase: Phase) -> Option<&mut Holders> {
        let t = self.targets.get(command_id)?.clone();
        if for_namespace(phase) {
            return Some(self.namespaces.entry(t.namespace).or_default());
        }
        let (workload, revision) = (t.workload?, t.revision?);
        let key = capstan_common::workload_key(&t.namespace, &workload);
        Some(
            self.revisions
                .entry(key)
                .or_default()
                .entry(revision)
                .or_default(),
        )
    }
}

#[cfg(test)]
mod tests;
