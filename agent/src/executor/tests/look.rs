//! Given a host that moved away from intent while the agent runs, when the reconciler
//! looks, then it records what it finds once, stops what runs against intent, starts
//! nothing, and never undoes a command on the namespace it looks at.

use super::R1;
use crate::event::{Cause, Event};
use crate::executor::Noticed;
use crate::testkit::{prepared, spec, Rig};
use capstan_common::ErrorCode;
use capstan_driver::sim::SimConfig;
use capstan_driver::{BackendState, Driver, RevisionRef};

const R9: RevisionRef<'static> = RevisionRef {
    namespace: "ns",
    workload: "web",
    revision: "r9",
};

/// The records appended since `before`.
fn since(rig: &Rig, before: usize) -> Vec<Event> {
    rig.records()
        .split_off(before)
        .into_iter()
        .map(|r| r.event)
        .collect()
}

#[tokio::test]
async fn a_backend_removed_by_hand_is_recorded_missing_once_and_not_made_again() {
    let rig = Rig::new(SimConfig::default());
    rig.running_r1().await;
    let mut noticed = Noticed::default();
    assert_eq!(rig.executor.look(&mut noticed).await.unwrap().failed, 0);
    rig.sim.retire(R1).await.unwrap(); // `docker rm -f` of the running revision
    let before = rig.records().len();

    let report = rig.executor.look(&mut noticed).await.unwrap();

    assert_eq!((report.failed, report.started), (1, 0), "{report:?}");
    let new = since(&rig, before);
    assert!(
        matches!(
            &new[..],
            [Event::WorkloadFailed {
                cause: Cause::Supervisor,
                code: ErrorCode::BackendMissing,
                ..
            }]
        ),
        "{new:?}"
    );
    assert!(rig.sim.host().revisions.is_empty(), "not made again");
    // Intent holds the failure now: the next look records nothing.
    let before = rig.records().len();
    let again = rig.executor.look(&mut noticed).await.unwrap();
    assert_eq!(again.failed, 0, "{again:?}");
    assert_eq!(since(&rig, before), Vec::new());
}

#[tokio::test]
async fn drift_is_recorded_once_while_it_stays_and_again_when_it_comes_back() {
    let rig = Rig::new(SimConfig::default());
    rig.running_r1().await;
    let mut noticed = Noticed::default();
    let drift_records = |rig: &Rig, before| {
        since(rig, before)
            .into_iter()
            .filter(|e| matches!(e, Event::DriftDetected { reaped: false, .. }))
            .count()
    };
    for round in 0..2 {
        rig.sim.prepare(R9, &spec()).await.unwrap(); // labelled ours, unknown to intent
        let before = rig.records().len();
        let report = rig.executor.look(&mut noticed).await.unwrap();
        assert_eq!(report.drift, 1, "round {round}: {report:?}");
        assert_eq!(drift_records(&rig, before), 1, "round {round}");
        let before = rig.records().len();
        let report = rig.executor.look(&mut noticed).await.unwrap();
        assert_eq!(report.drift, 0, "round {round}: still there, not again");
        assert_eq!(drift_records(&rig, before), 0, "round {round}");
        rig.sim.retire(R9).await.unwrap();
        assert_eq!(rig.executor.look(&mut noticed).await.unwrap().drift, 0);
    }
}

#[tokio::test]
async fn a_revision_started_by_hand_against_intent_is_stopped() {
    let rig = Rig::new(SimConfig::default());
    rig.running_r1().await;
    let stop = capstan_common::Op::StopWorkload {
        namespace: "ns".into(),
        workload: "web".into(),
    };
    rig.ok("s1", stop).await;
    rig.sim.resume(R1).await.unwrap();
    let before = rig.records().len();

    let report = rig.executor.look(&mut Noticed::default()).await.unwrap();

    assert_eq!((report.stopped, report.started), (1, 0), "{report:?}");
    assert!(
        matches!(
            &since(&rig, before)[..],
            [Event::WorkloadStopped {
                cause: Cause::Supervisor,
                ..
            }]
        ),
        "{:?}",
        since(&rig, before)
    );
    let r1 = &rig.sim.host().revisions["ns/web@r1"];
    assert_eq!(r1.state, BackendState::Stopped);
}

#[tokio::test]
async fn a_revision_that_exited_is_left_to_the_supervisor() {
    let rig = Rig::new(SimConfig::default());
    rig.running_r1().await;
    rig.sim.exit(R1, 1).unwrap();
    let before = rig.records().len();
    let report = rig.executor.look(&mut Noticed::default()).await.unwrap();
    assert_eq!(report, Default::default());
    assert_eq!(since(&rig, before), Vec::new());
    assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 1);
}

/// A prepare on `ns` has made its backend and not yet recorded it when the look
/// observes the host; the look waits for the namespace, then decides again.
async fn look_during_a_prepare(record_it: bool) -> (Rig, Vec<Event>) {
    let rig = Rig::new(SimConfig {
        reaps_orphans: true,
        ..SimConfig::default()
    });
    rig.running_r1().await;
    let before = rig.records().len();
    let mut noticed = Noticed::default();
    let command = rig.executor.lock_namespace("ns").await;
    rig.sim.prepare(R9, &spec()).await.unwrap();
    let prepare = async {
        // The look (polled first) has observed r9 unknown and waits for `ns`.
        tokio::task::yield_now().await;
        if record_it {
            let mut effect = prepared("r9", spec());
            if let Event::RevisionPrepared { command_id, .. } = &mut effect {
                *command_id = "p9".into();
            }
            rig.executor.log().append_durable(&[effect]).await.unwrap();
        }
        drop(command);
    };
    let (report, ()) = tokio::join!(rig.executor.look(&mut noticed), prepare);
    report.unwrap();
    let new = since(&rig, before);
    (rig, new)
}

#[tokio::test]
async fn a_backend_a_prepare_has_made_and_not_yet_recorded_is_never_reaped() {
    let (rig, new) = look_during_a_prepare(true).await;
    assert!(rig.sim.host().revisions.contains_key("ns/web@r9"), "kept");
    assert!(
        !new.iter().any(|e| matches!(e, Event::DriftDetected { .. })),
        "{new:?}"
    );
    // And the control: left unrecorded, it is drift, reaped.
    let (rig, new) = look_during_a_prepare(false).await;
    assert!(
        !rig.sim.host().revisions.contains_key("ns/web@r9"),
        "reaped"
    );
    assert!(
        matches!(&new[..], [Event::DriftDetected { reaped: true, .. }]),
        "{new:?}"
    );
}
