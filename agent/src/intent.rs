//! Running intent: the fold of the log. [`Intent::apply`] only folds — every decision
//! was made before the event was written — so replaying the same records always
//! rebuilds the same intent, from scratch or from a snapshot.

use crate::event::{Cause, Event};
use crate::grants::{Grants, Target};
use capstan_common::answers::{GrantsAnswer, IntentAnswer, NamespaceAnswer, WorkloadAnswer};
use capstan_common::{ErrorCode, Spec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the controller wants of one workload, and where a revision is in its life
/// (the vocabulary of the `intent` answer, which the fold writes).
pub use capstan_common::answers::{RevisionState, RunIntent};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    pub state: RevisionState,
    pub spec: Spec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadIntent {
    pub namespace: String,
    pub workload: String,
    pub intent: RunIntent,
    pub active_revision: Option<String>,
    pub revisions: BTreeMap<String, Revision>,
    /// The last failure to reach intent, cleared by the next successful start.
    pub failed: Option<ErrorCode>,
}

impl WorkloadIntent {
    /// True while any revision still has a runtime on the host.
    pub fn has_live_revisions(&self) -> bool {
        self.revisions
            .values()
            .any(|r| r.state != RevisionState::Retired)
    }

    /// The active revision's spec.
    pub fn active_spec(&self) -> Option<(&str, &Spec)> {
        let rev = self.active_revision.as_deref()?;
        self.revisions.get(rev).map(|r| (rev, &r.spec))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceIntent {
    /// The seq of the `namespace_ready` that made it.
    pub ready_seq: u64,
}

/// The folded state of the host, as the log says it should be.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The seq of the last record folded in.
    pub applied_seq: u64,
    pub namespaces: BTreeMap<String, NamespaceIntent>,
    /// Keyed `namespace/workload`.
    pub workloads: BTreeMap<String, WorkloadIntent>,
    /// Commands received but not completed, by id, with the seq that received them.
    /// Startup finishes or compensates every one of them.
    pub in_flight: BTreeMap<String, u64>,
    /// Which hook owners may hold access for what.
    #[serde(default)]
    pub grants: Grants,
}

/// The key of a workload in [`Intent::workloads`].
pub use capstan_common::workload_key as key;

impl Intent {
    pub fn workload(&self, namespace: &str, workload: &str) -> Option<&WorkloadIntent> {
        self.workloads.get(&key(namespace, workload))
    }

    /// Folds one record's event in. No decisions here: the event already says what
    /// was decided.
    pub fn apply(&mut self, seq: u64, event: &Event) {
        self.applied_seq = seq;
        match event {
            Event::CommandReceived {
                command_id,
                namespace,
                workload,
                revision,
                ..
            } => {
                self.in_flight.insert(command_id.clone(), seq);
                // A start or stop is about the revision active when it arrived.
                let revision = revision.clone().or_else(|| {
                    let w = self.workload(namespace, workload.as_deref()?)?;
                    w.active_revision.clone()
                });
                let target = Target {
                    namespace: namespace.clone(),
                    workload: workload.clone(),
                    revision,
                };
                self.grants.received(command_id, target);
            }
            Event::CommandCompleted { command_id, .. } => {
                self.in_flight.remove(command_id);
                self.grants.completed(command_id);
            }
            Event::CommandRejected { .. } | Event::CancelRequested { .. } => {}
            Event::HookStarted { .. } | Event::HookSucceeded { .. } | Event::HookFailed { .. } => {
                self.grants.apply(event)
            }
            Event::NamespaceReady { namespace, .. } => {
                self.namespaces
                    .entry(namespace.clone())
                    .or_insert(NamespaceIntent { ready_seq: seq });
            }
            Event::NamespaceDeleted { namespace, .. } => {
                self.namespaces.remove(namespace);
                self.workloads.retain(|_, w| &w.namespace != namespace);
                self.grants.namespace_deleted(namespace);
            }
            Event::RevisionPrepared {
                namespace,
                workload,
                revision,
                spec,
                ..
            } => {
                let w = self.workload_entry(namespace, workload);
                w.revisions
                    .entry(revision.clone())
                    .or_insert_with(|| Revision {
                        state: RevisionState::Prepared,
                        spec: spec.clone(),
                    });
            }
            Event::WorkloadStarted {
                cause,
                namespace,
                workload,
                revision,
                previous,
            } => {
                let w = self.workload_entry(namespace, workload);
                w.failed = None;
                if let Cause::Command(_) = cause {
                    w.intent = RunIntent::Running;
                    if let Some(prev) = previous.as_ref().and_then(|p| w.revisions.get_mut(p)) {
                        if prev.state == RevisionState::Active {
                            prev.state = RevisionState::Prepared;
                        }
                    }
                    if let Some(r) = w.revisions.get_mut(revision) {
                        r.state = RevisionState::Active;
                    }
                    w.active_revision = Some(revision.clone());
                }
            }
            Event::WorkloadStopped {
                cause: Cause::Command(_),
                namespace,
                workload,
                ..
            } => {
                self.workload_entry(namespace, workload).intent = RunIntent::Stopped;
            }
            Event::WorkloadStopped { .. } => {}
            Event::RevisionRetired {
                namespace,
                workload,
                revision,
                ..
            } => {
                self.grants.retired(namespace, workload, revision);
                let w = self.workload_entry(namespace, workload);
                if let Some(r) = w.revisions.get_mut(revision) {
                    r.state = RevisionState::Retired;
                }
                if w.active_revision.as_deref() == Some(revision) {
                    w.active_revision = None;
                    w.intent = RunIntent::Stopped;
                }
            }
            Event::WorkloadFailed {
                namespace,
                workload,
                code,
                ..
            } => {
                self.workload_entry(namespace, workload).failed = Some(*code);
            }
            // Observations, not decisions: intent does not change.
            Event::WorkloadExited { .. } | Event::DriftDetected { .. } => {}
        }
    }

    fn workload_entry(&mut self, namespace: &str, workload: &str) -> &mut WorkloadIntent {
        self.workloads
            .entry(key(namespace, workload))
            .or_insert_with(|| WorkloadIntent {
                namespace: namespace.to_string(),
                workload: workload.to_string(),
                intent: RunIntent::Stopped,
                active_revision: None,
                revisions: BTreeMap::new(),
                failed: None,
            })
    }

    /// The `intent` answer (`docs/protocol.md`, *Intent*): the intent without the
    /// revisions' specs and the in-flight commands' hook targets.
    pub fn answer(&self) -> IntentAnswer {
        let workloads = self.workloads.iter().map(|(key, w)| {
            let revisions = w.revisions.iter().map(|(name, r)| (name.clone(), r.state));
            let answer = WorkloadAnswer {
                intent: w.intent,
                active_revision: w.active_revision.clone(),
                revisions: revisions.collect(),
                failed: w.failed,
            };
            (key.clone(), answer)
        });
        let namespaces = self.namespaces.iter().map(|(name, ns)| {
            let answer = NamespaceAnswer {
                ready_seq: ns.ready_seq,
            };
            (name.clone(), answer)
        });
        IntentAnswer {
            applied_seq: self.applied_seq,
            namespaces: namespaces.collect(),
            workloads: workloads.collect(),
            in_flight: self.in_flight.clone(),
            grants: GrantsAnswer {
                namespaces: self.grants.namespaces.clone(),
                revisions: self.grants.revisions.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! Given events, when folded, then intent.
    use super::*;
    use crate::testkit::{by as cmd, given, ns_ready, retired, spec, started};

    fn prepared(rev: &str) -> Event {
        crate::testkit::prepared(rev, spec())
    }
    fn stopped(cause: Cause) -> Event {
        crate::testkit::stopped(cause, "r1")
    }

    #[test]
    fn activation_makes_the_revision_active_and_running() {
        let intent = given(&[ns_ready(), prepared("r1"), started(cmd("a1"), "r1", None)]);
        let w = intent.workload("ns", "web").unwrap();
        assert_eq!(w.intent, RunIntent::Running);
        assert_eq!(w.active_revision.as_deref(), Some("r1"));
        assert_eq!(w.revisions["r1"].state, RevisionState::Active);
        assert_eq!(intent.applied_seq, 3);
    }

    #[test]
    fn activating_a_newer_revision_demotes_the_previous_one() {
        let intent = given(&[
            ns_ready(),
            prepared("r1"),
            started(cmd("a1"), "r1", None),
            prepared("r2"),
            started(cmd("a2"), "r2", Some("r1")),
        ]);
        let w = intent.workload("ns", "web").unwrap();
        assert_eq!(w.active_revision.as_deref(), Some("r2"));
        assert_eq!(w.revisions["r1"].state, RevisionState::Prepared);
        assert_eq!(w.revisions["r2"].state, RevisionState::Active);
    }

    #[test]
    fn an_agent_shutdown_never_changes_intent() {
        let before = given(&[ns_ready(), prepared("r1"), started(cmd("a1"), "r1", None)]);
        let mut after = before.clone();
        after.apply(4, &stopped(Cause::AgentShutdown));
        after.apply(5, &started(Cause::AgentStartup, "r1", None));
        after.applied_seq = before.applied_seq;
        assert_eq!(after, before);
    }

    #[test]
    fn an_explicit_stop_is_remembered_and_a_start_reverses_it() {
        let mut intent = given(&[
            ns_ready(),
            prepared("r1"),
            started(cmd("a1"), "r1", None),
            stopped(cmd("s1")),
        ]);
        assert_eq!(
            intent.workload("ns", "web").unwrap().intent,
            RunIntent::Stopped
        );
        intent.apply(5, &started(cmd("st1"), "r1", None));
        assert_eq!(
            intent.workload("ns", "web").unwrap().intent,
            RunIntent::Running
        );
    }

    #[test]
    fn retiring_the_active_revision_leaves_nothing_to_run() {
        let intent = given(&[
            ns_ready(),
            prepared("r1"),
            started(cmd("a1"), "r1", None),
            retired("r1"),
        ]);
        let w = intent.workload("ns", "web").unwrap();
        assert_eq!(w.active_revision, None);
        assert_eq!(w.intent, RunIntent::Stopped);
        assert!(!w.has_live_revisions());
    }

    #[test]
    fn commands_are_in_flight_until_completed() {
        let received = Event::CommandReceived {
            command_id: "c9".into(),
            op: "ensure_namespace".into(),
            namespace: "ns".into(),
            workload: None,
            revision: None,
            command: "{}".into(),
        };
        let mut intent = given(&[received]);
        assert_eq!(intent.in_flight.get("c9"), Some(&1));
        intent.apply(
            2,
            &Event::CommandCompleted {
                command_id: "c9".into(),
                outcome: capstan_common::Outcome::Succeeded,
                code: None,
                message: None,
            },
        );
        assert!(intent.in_flight.is_empty());
    }

    #[test]
    fn deleting_a_namespace_forgets_its_workloads() {
        let intent = given(&[
            ns_ready(),
            prepared("r1"),
            Event::NamespaceDeleted {
                command_id: "d".into(),
                namespace: "ns".into(),
            },
        ]);
        assert!(intent.namespaces.is_empty());
        assert!(intent.workloads.is_empty());
    }
}
