//! Decisions, without I/O. [`decide`] turns one command into the one step that carries
//! it out (or the reason it cannot be); [`plan`] compares intent with what the driver
//! observes and lists the actions that converge the host; [`shutdown_sweep`] lists what
//! a graceful stop must stop. The executor performs what these return.

use crate::intent::{Intent, RevisionState, RunIntent};
use capstan_common::{ErrorCode, Op, Spec};
use capstan_driver::{BackendState, Observed};

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

/// Decides how to carry out `op` given the current intent.
pub fn decide(intent: &Intent, op: &Op) -> Result<Step, Refusal> {
    let ns_exists = |ns: &str| intent.namespaces.contains_key(ns);
    match op {
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
    /// The backend has something labelled ours that intent does not know.
    Drift {
        namespace: String,
        workload: String,
        revision: String,
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
            if *state == BackendState::Running && !should_run && w.revisions.contains_key(rev) {
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
            (observed.revision(&w.namespace, &w.workload, rev) == Some(BackendState::Running)).then(
                || Action::Stop {
                    namespace: w.namespace.clone(),
                    workload: w.workload.clone(),
                    revision: rev.clone(),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! Given intent (and an observed host), when planning, then steps/actions.
    use super::*;
    use crate::event::{Cause, Event};
    use capstan_common::DriverKind;
    use std::collections::BTreeMap;

    fn spec(image: &str) -> Spec {
        Spec {
            driver: DriverKind::Sim,
            image: Some(image.into()),
            command: vec![],
            env: BTreeMap::new(),
            working_dir: None,
            mounts: vec![],
            ports: vec![],
        }
    }

    fn given(events: Vec<Event>) -> Intent {
        let mut intent = Intent::default();
        for (i, e) in events.iter().enumerate() {
            intent.apply(i as u64 + 1, e);
        }
        intent
    }

    fn web_running_r1() -> Intent {
        given(vec![
            Event::NamespaceReady {
                command_id: "c1".into(),
                namespace: "ns".into(),
            },
            Event::RevisionPrepared {
                command_id: "c2".into(),
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into(),
                spec: spec("a"),
            },
            Event::WorkloadStarted {
                cause: Cause::Command("c3".into()),
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into(),
                previous: None,
            },
        ])
    }

    fn observed(entries: &[(&str, &str, BackendState)]) -> Observed {
        let mut o = Observed::default();
        for (wl, rev, state) in entries {
            o.workloads
                .entry(format!("ns/{wl}"))
                .or_default()
                .insert((*rev).into(), *state);
        }
        o
    }

    fn op_prepare(rev: &str, image: &str) -> Op {
        Op::PrepareRevision {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: rev.into(),
            spec: spec(image),
        }
    }

    #[test]
    fn prepare_needs_a_namespace() {
        let refusal = decide(&Intent::default(), &op_prepare("r1", "a")).unwrap_err();
        assert_eq!(refusal.code, ErrorCode::NamespaceNotFound);
    }

    #[test]
    fn revisions_are_immutable() {
        let intent = web_running_r1();
        assert!(
            decide(&intent, &op_prepare("r1", "a")).is_ok(),
            "same spec again is idempotent"
        );
        assert_eq!(
            decide(&intent, &op_prepare("r1", "b")).unwrap_err().code,
            ErrorCode::RevisionConflict
        );
    }

    #[test]
    fn activating_a_new_revision_names_the_one_it_replaces() {
        let mut intent = web_running_r1();
        intent.apply(
            4,
            &Event::RevisionPrepared {
                command_id: "c4".into(),
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r2".into(),
                spec: spec("b"),
            },
        );
        let step = decide(
            &intent,
            &Op::ActivateRevision {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r2".into(),
            },
        )
        .unwrap();
        assert!(
            matches!(step, Step::Activate { previous: Some(ref p), .. } if p == "r1"),
            "{step:?}"
        );
    }

    #[test]
    fn activating_an_unprepared_revision_is_refused() {
        let refusal = decide(
            &web_running_r1(),
            &Op::ActivateRevision {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r9".into(),
            },
        )
        .unwrap_err();
        assert_eq!(refusal.code, ErrorCode::RevisionNotFound);
    }

    #[test]
    fn a_namespace_with_workloads_cannot_be_deleted() {
        let refusal = decide(
            &web_running_r1(),
            &Op::DeleteNamespace {
                namespace: "ns".into(),
            },
        )
        .unwrap_err();
        assert_eq!(refusal.code, ErrorCode::NamespaceNotEmpty);
    }

    #[test]
    fn start_without_an_active_revision_is_refused() {
        let mut intent = web_running_r1();
        intent.apply(
            4,
            &Event::RevisionRetired {
                command_id: "c5".into(),
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into(),
            },
        );
        let refusal = decide(
            &intent,
            &Op::StartWorkload {
                namespace: "ns".into(),
                workload: "web".into(),
            },
        )
        .unwrap_err();
        assert_eq!(refusal.code, ErrorCode::NoActiveRevision);
    }

    #[test]
    fn plan_starts_a_stopped_running_intent_workload() {
        let actions = plan(
            &web_running_r1(),
            &observed(&[("web", "r1", BackendState::Stopped)]),
        );
        assert_eq!(
            actions,
            vec![Action::Start {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into()
            }]
        );
    }

    #[test]
    fn plan_reports_a_missing_backend() {
        let actions = plan(&web_running_r1(), &Observed::default());
        assert_eq!(
            actions,
            vec![Action::Missing {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into()
            }]
        );
    }

    #[test]
    fn plan_leaves_explicitly_stopped_workloads_stopped() {
        let mut intent = web_running_r1();
        intent.apply(
            4,
            &Event::WorkloadStopped {
                cause: Cause::Command("s".into()),
                namespace: "ns".into(),
                workload: "web".into(),
                revision: Some("r1".into()),
            },
        );
        assert!(plan(&intent, &observed(&[("web", "r1", BackendState::Stopped)])).is_empty());
        let running = plan(&intent, &observed(&[("web", "r1", BackendState::Running)]));
        assert_eq!(
            running,
            vec![Action::Stop {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into()
            }]
        );
    }

    #[test]
    fn plan_reports_drift_for_unknown_backends() {
        let actions = plan(
            &web_running_r1(),
            &observed(&[
                ("web", "r1", BackendState::Running),
                ("ghost", "r1", BackendState::Running),
            ]),
        );
        assert_eq!(
            actions,
            vec![Action::Drift {
                namespace: "ns".into(),
                workload: "ghost".into(),
                revision: "r1".into()
            }]
        );
    }

    #[test]
    fn plan_converges() {
        let intent = web_running_r1();
        assert!(plan(&intent, &observed(&[("web", "r1", BackendState::Running)])).is_empty());
    }

    #[test]
    fn shutdown_stops_only_running_intent_workloads() {
        let intent = web_running_r1();
        let sweep = shutdown_sweep(&intent, &observed(&[("web", "r1", BackendState::Running)]));
        assert_eq!(sweep.len(), 1);
        assert!(
            shutdown_sweep(&intent, &observed(&[("web", "r1", BackendState::Stopped)])).is_empty()
        );
    }
}
