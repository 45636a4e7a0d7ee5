//! Given intent (and an observed host), when deciding or planning, then steps/actions.

use super::*;
use crate::event::{Cause, Event};
use crate::testkit::{activate_op, by, given, image, prepare_op, prepared, retired, running};
use crate::testkit::{spec_for, started, stopped};
use capstan_common::Phase;

const SIM: DriverKind = DriverKind::SIM;

fn web_running_r1() -> Intent {
    given(&running("r1", image("a")))
}

fn observed(entries: &[(&str, &str, BackendState)]) -> Observed {
    let mut o = Observed::default();
    for (wl, rev, state) in entries {
        o.workloads
            .entry(format!("ns/{wl}"))
            .or_default()
            .insert((*rev).into(), state.clone());
    }
    o
}

fn gave_up(reason: &str) -> BackendState {
    BackendState::Failed {
        reason: reason.into(),
    }
}

/// `web@rev`'s action `to` (`Start`, `Stop`, `Missing`).
fn web(to: fn(String, String, String) -> Action, rev: &str) -> Action {
    to("ns".into(), "web".into(), rev.into())
}

fn start(namespace: String, workload: String, revision: String) -> Action {
    Action::Start {
        namespace,
        workload,
        revision,
    }
}

fn stop(namespace: String, workload: String, revision: String) -> Action {
    Action::Stop {
        namespace,
        workload,
        revision,
    }
}

fn missing(namespace: String, workload: String, revision: String) -> Action {
    Action::Missing {
        namespace,
        workload,
        revision,
    }
}

#[test]
fn prepare_needs_a_namespace() {
    let refusal = decide(&Intent::default(), SIM, &prepare_op("r1", image("a"))).unwrap_err();
    assert_eq!(refusal.code, ErrorCode::NamespaceNotFound);
}

#[test]
fn a_spec_for_another_driver_is_refused() {
    let intent = web_running_r1();
    let docker = spec_for(DriverKind::DOCKER, Some("shop/web:2"));
    let refusal = decide(&intent, SIM, &prepare_op("r2", docker.clone())).unwrap_err();
    assert_eq!(refusal.code, ErrorCode::DriverMismatch);
    assert_eq!(
        refusal.message,
        "revision r2 is for driver docker; this agent runs sim"
    );
    assert!(decide(&intent, DriverKind::DOCKER, &prepare_op("r2", docker)).is_ok());
    let refusal = decide(
        &Intent::default(),
        DriverKind::DOCKER,
        &prepare_op("r1", image("a")),
    )
    .unwrap_err();
    assert_eq!(
        refusal.code,
        ErrorCode::DriverMismatch,
        "decided before anything about the host"
    );
}

#[test]
fn a_revision_in_the_log_for_another_driver_is_neither_activated_nor_started() {
    // Given r1 prepared and running on a sim agent, when the agent now runs docker:
    let intent = web_running_r1();
    let docker = DriverKind::DOCKER;
    let start = Op::StartWorkload {
        namespace: "ns".into(),
        workload: "web".into(),
    };
    for op in [activate_op("r1"), start] {
        let refusal = decide(&intent, docker, &op).unwrap_err();
        assert_eq!(refusal.code, ErrorCode::DriverMismatch, "{op:?}");
        assert!(decide(&intent, SIM, &op).is_ok(), "{op:?}");
    }
}

#[test]
fn revisions_are_immutable() {
    let intent = web_running_r1();
    assert!(
        decide(&intent, SIM, &prepare_op("r1", image("a"))).is_ok(),
        "same spec again is idempotent"
    );
    assert_eq!(
        decide(&intent, SIM, &prepare_op("r1", image("b")))
            .unwrap_err()
            .code,
        ErrorCode::RevisionConflict
    );
}

#[test]
fn activating_a_new_revision_names_the_one_it_replaces() {
    let mut intent = web_running_r1();
    intent.apply(4, &prepared("r2", image("b")));
    let step = decide(&intent, SIM, &activate_op("r2")).unwrap();
    assert!(
        matches!(step, Step::Activate { previous: Some(ref p), .. } if p == "r1"),
        "{step:?}"
    );
}

#[test]
fn activating_an_unprepared_revision_is_refused() {
    let refusal = decide(&web_running_r1(), SIM, &activate_op("r9")).unwrap_err();
    assert_eq!(refusal.code, ErrorCode::RevisionNotFound);
}

#[test]
fn a_namespace_with_workloads_cannot_be_deleted() {
    let refusal = decide(
        &web_running_r1(),
        SIM,
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
    intent.apply(4, &retired("r1"));
    let refusal = decide(
        &intent,
        SIM,
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
    assert_eq!(actions, vec![web(start, "r1")]);
}

#[test]
fn plan_reports_a_missing_backend() {
    let actions = plan(&web_running_r1(), &Observed::default());
    assert_eq!(actions, vec![web(missing, "r1")]);
}

#[test]
fn plan_reports_a_revision_the_backend_gave_up_on_instead_of_starting_it() {
    let actions = plan(
        &web_running_r1(),
        &observed(&[("web", "r1", gave_up("start-limit-hit"))]),
    );
    assert_eq!(
        actions,
        vec![Action::Failed {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: "r1".into(),
            reason: "start-limit-hit".into()
        }]
    );
}

#[test]
fn a_given_up_revision_that_should_not_run_needs_nothing() {
    let mut intent = web_running_r1();
    intent.apply(4, &stopped(by("s"), "r1"));
    assert!(plan(&intent, &observed(&[("web", "r1", gave_up("crash-loop"))])).is_empty());
    let mut replaced = web_running_r1();
    replaced.apply(4, &prepared("r2", image("b")));
    replaced.apply(5, &started(by("a2"), "r2", Some("r1")));
    let host = observed(&[
        ("web", "r1", gave_up("crash-loop")),
        ("web", "r2", BackendState::Running),
    ]);
    assert!(plan(&replaced, &host).is_empty());
}

#[test]
fn plan_leaves_explicitly_stopped_workloads_stopped() {
    let mut intent = web_running_r1();
    intent.apply(4, &stopped(by("s"), "r1"));
    assert!(plan(&intent, &observed(&[("web", "r1", BackendState::Stopped)])).is_empty());
    let running = plan(&intent, &observed(&[("web", "r1", BackendState::Running)]));
    assert_eq!(running, vec![web(stop, "r1")]);
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
fn plan_reports_a_revision_changed_outside_capstan_as_drift() {
    let mut o = observed(&[
        ("web", "r1", BackendState::Running),
        ("ghost", "r1", BackendState::Running),
    ]);
    for wl in ["web", "ghost"] {
        o.changed
            .entry(format!("ns/{wl}"))
            .or_default()
            .insert("r1".into(), "replicas set to 3 by kubectl".into());
    }
    assert_eq!(
        plan(&web_running_r1(), &o),
        vec![
            Action::Drift {
                namespace: "ns".into(),
                workload: "ghost".into(),
                revision: "r1".into()
            },
            Action::Changed {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into(),
                what: "replicas set to 3 by kubectl".into(),
            }
        ],
        "a revision intent does not know is drift once, not a change as well"
    );
}

#[test]
fn plan_converges() {
    let intent = web_running_r1();
    assert!(plan(&intent, &observed(&[("web", "r1", BackendState::Running)])).is_empty());
}

#[test]
fn shutdown_stops_only_running_intent_workloads_that_run() {
    let intent = web_running_r1();
    let sweep = shutdown_sweep(&intent, &observed(&[("web", "r1", BackendState::Running)]));
    assert_eq!(sweep.len(), 1);
    for state in [BackendState::Stopped, gave_up("crash-loop")] {
        assert!(shutdown_sweep(&intent, &observed(&[("web", "r1", state)])).is_empty());
    }
    let mut after_shutdown = intent.clone();
    after_shutdown.apply(4, &stopped(Cause::AgentShutdown, "r1"));
    assert_eq!(
        shutdown_sweep(
            &after_shutdown,
            &observed(&[("web", "r1", BackendState::Running)])
        ),
        sweep,
        "an agent shutdown leaves intent running"
    );
}

fn start_op() -> Op {
    Op::StartWorkload {
        namespace: "ns".into(),
        workload: "web".into(),
    }
}

#[test]
fn activating_or_starting_what_already_runs_is_nothing_to_do() {
    let intent = web_running_r1();
    let nothing = Step::AlreadyRunning {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: "r1".into(),
    };
    for op in [activate_op("r1"), start_op()] {
        assert_eq!(decide(&intent, SIM, &op), Ok(nothing.clone()), "{op:?}");
    }
}

#[test]
fn ensuring_a_ready_namespace_is_nothing_to_do() {
    let intent = web_running_r1();
    let op = Op::EnsureNamespace {
        namespace: "ns".into(),
    };
    let ready = Step::AlreadyReady {
        namespace: "ns".into(),
    };
    assert_eq!(decide(&intent, SIM, &op), Ok(ready));
    let other = Op::EnsureNamespace {
        namespace: "other".into(),
    };
    assert!(matches!(
        decide(&intent, SIM, &other),
        Ok(Step::EnsureNamespace { .. })
    ));
}

#[test]
fn a_stopped_or_failed_active_revision_is_started_for_real() {
    let mut stopped_by_command = web_running_r1();
    stopped_by_command.apply(4, &stopped(by("s1"), "r1"));
    let mut failed = web_running_r1();
    failed.apply(
        4,
        &crate::event::Event::WorkloadFailed {
            cause: Cause::AgentStartup,
            namespace: "ns".into(),
            workload: "web".into(),
            code: ErrorCode::BackendMissing,
            message: "gone".into(),
        },
    );
    for intent in [stopped_by_command, failed] {
        let step = decide(&intent, SIM, &activate_op("r1")).unwrap();
        assert!(
            matches!(step, Step::Activate { previous: None, .. }),
            "{step:?}"
        );
        let step = decide(&intent, SIM, &start_op()).unwrap();
        assert!(matches!(step, Step::Start { .. }), "{step:?}");
    }
}

/// Every kind of step, on `ns/web` (`r2` after `r1`).
fn every_step() -> Vec<Step> {
    let (ns, wl) = (|| "ns".to_string(), || "web".to_string());
    vec![
        Step::EnsureNamespace { namespace: ns() },
        Step::DeleteNamespace { namespace: ns() },
        Step::Prepare {
            namespace: ns(),
            workload: wl(),
            revision: "r2".into(),
            spec: image("a"),
        },
        Step::Activate {
            namespace: ns(),
            workload: wl(),
            revision: "r2".into(),
            spec: image("a"),
            previous: Some("r1".into()),
        },
        Step::Start {
            namespace: ns(),
            workload: wl(),
            revision: "r2".into(),
            spec: image("a"),
        },
        Step::Stop {
            namespace: ns(),
            workload: wl(),
            revision: Some("r2".into()),
        },
        Step::Retire {
            namespace: ns(),
            workload: wl(),
            revision: "r1".into(),
        },
        Step::AlreadyRunning {
            namespace: ns(),
            workload: wl(),
            revision: "r2".into(),
        },
        Step::AlreadyReady { namespace: ns() },
    ]
}

#[test]
fn each_step_carried_out_records_its_effect_under_the_command() {
    // Given each step, when command c7 carried it out, then the log records:
    let effects: Vec<Option<Event>> = every_step().into_iter().map(|s| s.effect("c7")).collect();
    let mut prepared_r2 = prepared("r2", image("a"));
    if let Event::RevisionPrepared { command_id, .. } = &mut prepared_r2 {
        *command_id = "c7".into();
    }
    let mut retired_r1 = retired("r1");
    if let Event::RevisionRetired { command_id, .. } = &mut retired_r1 {
        *command_id = "c7".into();
    }
    assert_eq!(
        effects,
        vec![
            Some(Event::NamespaceReady {
                command_id: "c7".into(),
                namespace: "ns".into()
            }),
            Some(Event::NamespaceDeleted {
                command_id: "c7".into(),
                namespace: "ns".into()
            }),
            Some(prepared_r2),
            Some(started(by("c7"), "r2", Some("r1"))),
            // A start names no predecessor: it stops nothing.
            Some(started(by("c7"), "r2", None)),
            Some(stopped(by("c7"), "r2")),
            Some(retired_r1),
            // Nothing to do: no effect (the command completes without one).
            None,
            None,
        ]
    );
}

#[test]
fn a_stop_with_nothing_running_still_records_the_intent_change() {
    let step = Step::Stop {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: None,
    };
    assert_eq!(
        step.effect("c1"),
        Some(Event::WorkloadStopped {
            cause: by("c1"),
            namespace: "ns".into(),
            workload: "web".into(),
            revision: None,
        })
    );
}

#[test]
fn the_effect_kinds_are_exactly_the_events_named_effects() {
    // Given every kind of event the log can hold, then an event is an effect exactly
    // when its kind is one a step records.
    let kinds: std::collections::BTreeSet<&str> = every_step()
        .into_iter()
        .filter_map(|s| s.effect("c1"))
        .inspect(|e| assert!(e.is_effect(), "{e:?}"))
        .map(|e| e.kind())
        .collect();
    for (event, _) in crate::log::samples::every_event() {
        assert_eq!(
            event.is_effect(),
            kinds.contains(event.kind()),
            "{}",
            event.kind()
        );
    }
}

#[test]
fn each_step_has_its_hook_phase_on_its_side_of_the_driver_call() {
    // Given each step, when the executor asks which hooks go with it, then (the
    // order of every_step: ensure, delete, prepare, activate, start, stop, retire,
    // already running, already ready):
    let sequences: Vec<HookSequence> = every_step().iter().map(Step::hooks).collect();
    assert_eq!(
        sequences,
        vec![
            HookSequence::DriverThenGrant(Phase::AfterNamespacePrepared),
            HookSequence::RevokeThenDriver(Phase::BeforeNamespaceDelete),
            HookSequence::None,
            HookSequence::GrantThenDriver(Phase::BeforeWorkloadStart),
            HookSequence::GrantThenDriver(Phase::BeforeWorkloadStart),
            HookSequence::RevokeThenDriver(Phase::BeforeWorkloadStop),
            HookSequence::RevokeThenDriver(Phase::BeforeWorkloadStop),
            HookSequence::None,
            HookSequence::None,
        ]
    );
}

#[test]
fn the_hooks_are_told_the_revision_the_step_concerns() {
    let targets: Vec<_> = every_step().iter().map(Step::target).collect();
    let (ns, web) = ("ns".to_string(), Some("web".to_string()));
    let rev = |r: &str| Some(r.to_string());
    assert_eq!(
        targets,
        vec![
            (ns.clone(), None, None),
            (ns.clone(), None, None),
            (ns.clone(), web.clone(), rev("r2")),
            (ns.clone(), web.clone(), rev("r2")),
            (ns.clone(), web.clone(), rev("r2")),
            (ns.clone(), web.clone(), rev("r2")),
            // A retire names the revision it retires, not the one running.
            (ns.clone(), web.clone(), rev("r1")),
            (ns.clone(), web.clone(), rev("r2")),
            (ns, None, None),
        ]
    );
    // A stop with nothing running names no revision.
    let idle = Step::Stop {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: None,
    };
    assert_eq!(idle.target(), ("ns".into(), web, None));
}

#[test]
fn an_op_starts_a_revision_exactly_when_the_step_it_comes_to_does() {
    // web runs r1, r2 is prepared; on the second host web was stopped.
    let mut events = running("r1", image("a"));
    events.push(prepared("r2", image("b")));
    let runs = given(&events);
    events.push(stopped(by("s0"), "r1"));
    let stopped_web = given(&events);
    let (ns, wl) = ("ns".to_string(), "web".to_string());
    let ops = [
        Op::EnsureNamespace {
            namespace: "other".into(),
        },
        Op::DeleteNamespace {
            namespace: "other".into(),
        },
        prepare_op("r3", image("c")),
        activate_op("r2"),
        Op::StopWorkload {
            namespace: ns.clone(),
            workload: wl.clone(),
        },
        Op::StartWorkload {
            namespace: ns.clone(),
            workload: wl.clone(),
        },
        Op::RetireRevision {
            namespace: ns,
            workload: wl,
            revision: "r2".into(),
        },
        Op::CancelCommand {
            target: "a1".into(),
        },
    ];
    let mut starts = 0;
    for op in &ops {
        // A new op fails to compile here: add one to the list above too.
        match op {
            Op::EnsureNamespace { .. }
            | Op::DeleteNamespace { .. }
            | Op::PrepareRevision { .. }
            | Op::ActivateRevision { .. }
            | Op::StopWorkload { .. }
            | Op::StartWorkload { .. }
            | Op::RetireRevision { .. }
            | Op::CancelCommand { .. } => {}
        }
        for intent in [&runs, &stopped_web] {
            let Ok(step) = decide(intent, SIM, op) else {
                continue;
            };
            let step = grants::with_grants(step, intent, &Default::default());
            if matches!(step, Step::AlreadyRunning { .. }) {
                assert!(op.starts(), "{op:?} came to {step:?}");
                continue;
            }
            let is_start = grants::starting(&step).is_some();
            assert_eq!(op.starts(), is_start, "{op:?} came to {step:?}");
            starts += usize::from(is_start);
        }
    }
    assert_eq!(starts, 3, "an activation on both hosts and a start");
}
