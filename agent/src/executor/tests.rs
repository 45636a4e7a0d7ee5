//! The executor against the real log and sim driver: refusals before any effect, and
//! startup reconciliation of a backend that gave up.

/// A log that cannot be made durable under a running executor.
mod flush_failure;
/// The reconciler's looks while the agent runs.
mod look;
/// Random valid command sequences through the executor (proptest).
mod property;
/// Commands answered from what retention kept of them.
mod pruned;

use crate::event::{Cause, Event};
use crate::testkit::{prepare_op, spec_for, Rig};
use capstan_common::{DriverKind, ErrorCode, Op, Outcome};
use capstan_driver::sim::SimConfig;
use capstan_driver::{BackendState, RevisionRef};

const R1: RevisionRef<'static> = RevisionRef {
    namespace: "ns",
    workload: "web",
    revision: "r1",
};

#[tokio::test]
async fn a_spec_for_another_driver_is_refused_before_any_effect() {
    let rig = Rig::new(SimConfig::default());
    let ns = Op::EnsureNamespace {
        namespace: "ns".into(),
    };
    rig.ok("ns", ns).await;
    let docker = spec_for(DriverKind::DOCKER, Some("shop/web:2"));
    let command = crate::testkit::command("p1", prepare_op("r1", docker));
    let r = rig.executor.execute(command).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(!r.retryable);
    let error = r.error.unwrap();
    assert_eq!(error.code, ErrorCode::DriverMismatch);
    assert!(error.message.contains("this agent runs sim"), "{error:?}");
    let kinds: Vec<&str> = (rig.executor.log().for_command("p1").unwrap())
        .iter()
        .map(|r| r.event.kind())
        .collect();
    assert_eq!(kinds, ["command_received", "command_completed"]);
    assert!(
        rig.sim.host().revisions.is_empty(),
        "the driver was not called"
    );
    assert!(rig.executor.log().intent().workloads.is_empty());
}

/// Given a driver that does not declare `probes`, when a spec with a readiness check
/// is prepared, then it is rejected `invalid_spec` before it is received (the check
/// would never be carried out); the same spec on a driver that probes is taken.
#[tokio::test]
async fn a_readiness_check_the_driver_cannot_carry_out_is_rejected() {
    let checked = || {
        let mut spec = spec_for(DriverKind::SIM, None);
        spec.readiness =
            Some(serde_json::from_str(r#"{"check":{"tcp":{"port":8080}}}"#).expect("readiness"));
        spec
    };
    let rig = Rig::new(SimConfig {
        probes: false,
        ..SimConfig::default()
    });
    let ns = Op::EnsureNamespace {
        namespace: "ns".into(),
    };
    rig.ok("ns", ns.clone()).await;
    let r = (rig.executor)
        .execute(crate::testkit::command("p1", prepare_op("r1", checked())))
        .await;
    assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
    let error = r.error.unwrap();
    assert_eq!(error.code, ErrorCode::InvalidSpec);
    assert!(error.message.contains("probes"), "{error:?}");
    assert!(
        rig.sim.host().revisions.is_empty(),
        "the driver was not called"
    );

    let rig = Rig::new(SimConfig::default());
    rig.ok("ns", ns).await;
    let r = (rig.executor)
        .execute(crate::testkit::command("p1", prepare_op("r1", checked())))
        .await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
}

/// Given a spec for the agent's own driver that the driver's rules refuse (the sim
/// has no settings, so a `sim` section), when it is prepared, then it is rejected
/// with the driver's `invalid_spec` before anything is recorded as received, the
/// rejection is on record, and the driver was not called; the same spec without the
/// section is then carried out.
#[tokio::test]
async fn a_spec_the_drivers_own_rules_refuse_is_rejected_before_it_is_received() {
    let rig = Rig::new(SimConfig::default());
    let ns = Op::EnsureNamespace {
        namespace: "ns".into(),
    };
    rig.ok("ns", ns).await;
    let mut spec = spec_for(DriverKind::SIM, None);
    let json = serde_json::to_string(&spec).unwrap();
    let with_section = format!(r#"{},"sim":{{"cpus":2}}}}"#, &json[..json.len() - 1]);
    spec.sections = serde_json::from_str::<capstan_common::Spec>(&with_section)
        .unwrap()
        .sections;
    capstan_common::validate::spec(&spec).expect("what every spec shares is fine");
    let command = crate::testkit::command("p1", prepare_op("r1", spec.clone()));
    let r = rig.executor.execute(command).await;
    assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
    assert!(!r.retryable);
    let error = r.error.unwrap();
    assert_eq!(error.code, ErrorCode::InvalidSpec);
    assert!(error.message.contains("leave `sim` out"), "{error:?}");
    let kinds: Vec<&str> = (rig.executor.log().for_command("p1").unwrap())
        .iter()
        .map(|r| r.event.kind())
        .collect();
    assert_eq!(kinds, ["command_rejected"]);
    assert!(
        rig.sim.host().revisions.is_empty(),
        "the driver was not called"
    );

    spec.sections = Default::default();
    let command = crate::testkit::command("p2", prepare_op("r1", spec));
    let r = rig.executor.execute(command).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
}

#[tokio::test]
async fn startup_reports_a_backend_that_gave_up_and_does_not_start_it() {
    let rig = Rig::new(SimConfig::default());
    rig.running_r1().await;
    rig.sim.give_up(R1, "start-limit-hit").unwrap();
    let report = rig.executor.reconcile().await.unwrap();
    assert_eq!((report.started, report.failed), (0, 1), "{report:?}");
    let last = rig.records().pop().unwrap().event;
    let Event::WorkloadFailed {
        cause,
        code,
        message,
        ..
    } = last
    else {
        panic!("{last:?}")
    };
    assert_eq!(
        (cause, code),
        (Cause::AgentStartup, ErrorCode::BackendFailed)
    );
    assert_eq!(
        message,
        "the backend gave up on revision r1: start-limit-hit"
    );
    let r1 = rig.sim.host().revisions["ns/web@r1"].clone();
    assert_eq!(r1.starts, 1, "not started again");
    assert!(matches!(r1.state, BackendState::Failed { .. }));
    let w = rig.executor.log().intent();
    let w = w.workload("ns", "web").unwrap();
    assert_eq!(
        w.intent,
        crate::intent::RunIntent::Running,
        "intent unchanged"
    );
}

#[tokio::test]
async fn without_lifecycle_startup_only_records_what_it_finds() {
    let rig = Rig::new(SimConfig {
        manages_lifecycle: false,
        ..SimConfig::default()
    });
    rig.running_r1().await;
    rig.sim.give_up(R1, "start-limit-hit").unwrap();
    let before = rig.records().len();

    let report = rig.executor.reconcile().await.unwrap();

    assert_eq!((report.started, report.failed), (0, 1), "{report:?}");
    let new: Vec<_> = rig.records().split_off(before);
    assert!(
        matches!(
            &new[..],
            [crate::event::Record {
                event: Event::WorkloadFailed {
                    code: ErrorCode::BackendFailed,
                    ..
                },
                ..
            }]
        ),
        "{new:?}"
    );
    assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 1);

    // A stopped revision of a running-intent workload is the backend's to restart.
    rig.ok("a1-again", crate::testkit::activate_op("r1")).await;
    rig.sim.exit(R1, 1).unwrap();
    let report = rig.executor.reconcile().await.unwrap();
    assert_eq!((report.started, report.failed), (0, 0), "{report:?}");
    assert_eq!(
        rig.sim.host().revisions["ns/web@r1"].state,
        BackendState::Stopped
    );
}

#[tokio::test]
async fn a_reused_id_with_other_content_is_an_id_conflict_not_a_duplicate() {
    let rig = Rig::new(SimConfig::default());
    let ns = |namespace: &str| Op::EnsureNamespace {
        namespace: namespace.into(),
    };
    rig.ok("c1", ns("ns")).await;

    // The same content under the same id, issued later and signed anew: a duplicate.
    let again = rig
        .executor
        .execute(crate::testkit::command("c1", ns("ns")))
        .await;
    assert_eq!((again.outcome, again.duplicate), (Outcome::Succeeded, true));

    // Other content under the same id: rejected, never answered from the log.
    let other = rig
        .executor
        .execute(crate::testkit::command("c1", ns("other")))
        .await;
    assert_eq!(other.outcome, Outcome::Rejected, "{other:?}");
    assert!(!other.duplicate && !other.retryable, "{other:?}");
    let error = other.error.unwrap();
    assert_eq!(error.code, ErrorCode::IdConflict);
    assert!(error.message.contains("c1"), "{error:?}");
    assert!(
        !rig.executor.log().intent().namespaces.contains_key("other"),
        "nothing was carried out"
    );
    let kinds: Vec<&str> = (rig.executor.log().for_command("c1").unwrap())
        .iter()
        .map(|r| r.event.kind())
        .collect();
    assert_eq!(
        kinds,
        [
            "command_received",
            "namespace_ready",
            "command_completed",
            "command_rejected"
        ]
    );
}
