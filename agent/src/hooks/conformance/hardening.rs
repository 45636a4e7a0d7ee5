//! Hardening rules: a command that changes nothing runs no hooks and no driver call,
//! and compensation only ever revokes the revision the failed command was starting.

use super::*;

fn kinds_of(rig: &Rig, id: &str) -> Vec<&'static str> {
    let records = rig.base.executor.log().for_command(id).unwrap();
    records.iter().map(|r| r.event.kind()).collect()
}

#[tokio::test]
async fn a_command_that_changes_nothing_runs_no_hooks_and_no_driver_call() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    assert_eq!(rig.r1().starts, 1);
    rig.fake.clear();
    assert_eq!(rig.activate("a2").await.outcome, Outcome::Succeeded);
    rig.ok("t1", "start_workload", W).await;
    assert_eq!(rig.fake.calls(), vec![], "no hook was called");
    assert_eq!(rig.r1().starts, 1, "the driver was not called");
    assert_eq!(rig.r1().state, BackendState::Running);
    for id in ["a2", "t1"] {
        assert_eq!(
            kinds_of(&rig, id),
            ["command_received", "command_completed"],
            "{id}: no effect event"
        );
    }
}

#[tokio::test]
async fn a_reactivation_of_the_running_revision_cannot_fail_and_revoke_its_grant() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.fake.clear();
    rig.fake.on("b", BeforeWorkloadStart, Act::Fail(1));
    let r = rig.activate("a2").await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStop),
        names(&[]),
        "nothing revoked"
    );
    assert_eq!(rig.r1().state, BackendState::Running);
}

#[tokio::test]
async fn a_failed_activation_of_r2_compensates_r2_never_the_running_r1() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.ok("p2", "prepare_revision", &prepare("r2", "")).await;
    rig.fake.clear();
    rig.fake.on("b", BeforeWorkloadStart, Act::Fail(1));
    let r = rig
        .run(
            "a2",
            "activate_revision",
            &format!(r#"{W},"revision":"r2""#),
        )
        .await;
    assert_eq!(r.error.unwrap().code, ErrorCode::HookFailed);
    let requests = rig.fake.requests.lock().unwrap().clone();
    let undo: Vec<_> = requests.iter().filter(|r| r.compensating).collect();
    assert_eq!(undo.len(), 1, "{requests:?}");
    assert_eq!(undo[0].phase, BeforeWorkloadStop);
    assert_eq!(
        undo[0].revision.as_deref(),
        Some("r2"),
        "the revoke names r2"
    );
    assert!(
        requests.iter().all(|r| r.revision.as_deref() == Some("r2")),
        "nothing about r1: {requests:?}"
    );
    assert_eq!(rig.r1().state, BackendState::Running, "r1 keeps running");
}
