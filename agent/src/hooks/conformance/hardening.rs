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

#[tokio::test]
async fn an_owner_that_replied_invalidly_is_compensated_one_that_failed_or_was_unreachable_is_not()
{
    for (failure, undo) in [
        (CallFailure::Reply, names(&["b", "a"])),
        (CallFailure::Exit, names(&["a"])),
        (CallFailure::Spawn, names(&["a"])),
    ] {
        let rig = rig(&["a", "b"]);
        rig.staged().await;
        rig.fake.on("b", BeforeWorkloadStart, Act::Break(failure));
        let r = rig.activate("a1").await;
        assert_eq!(r.error.unwrap().code, ErrorCode::HookFailed, "{failure:?}");
        assert_eq!(rig.fake.calls_in(BeforeWorkloadStop), undo, "{failure:?}");
        assert_eq!(rig.r1().starts, 0);
    }
}

#[tokio::test]
async fn after_a_crash_an_owner_cut_short_or_with_an_invalid_reply_is_compensated_too() {
    let rig = rig(&["a", "b", "c", "d", "e"]);
    let log = rig.base.executor.log();
    let (id, phase) = ("c1".to_string(), BeforeWorkloadStart);
    let mut events = Vec::new();
    for (owner, code) in [
        ("a", None),
        ("b", Some(ErrorCode::Cancelled)),
        ("c", Some(ErrorCode::HookTimeout)),
        ("d", Some(ErrorCode::HookInvalidReply)),
        ("e", Some(ErrorCode::HookFailed)),
    ] {
        let (command_id, owner) = (id.clone(), owner.to_string());
        events.push(Event::HookStarted {
            command_id: command_id.clone(),
            phase,
            owner: owner.clone(),
            revision: Some("r1".into()),
        });
        events.push(match code {
            None => Event::HookSucceeded {
                command_id,
                phase,
                owner,
            },
            Some(code) => Event::HookFailed {
                command_id,
                phase,
                owner,
                code,
            },
        });
    }
    log.append_durable(&events).await.unwrap();
    let history = log.for_command(&id).unwrap();
    let fake = Arc::new(Fake::default());
    let owners = ["a", "b", "c", "d", "e"].map(|n| owner(n, Duration::from_secs(30)));
    let hooks = Hooks::new(owners.to_vec(), fake.clone());
    let ctx = super::super::HookContext {
        host: testkit::HOST.into(),
        command_id: id,
        namespace: "ns".into(),
        workload: Some("web".into()),
        revision: Some("r1".into()),
    };
    let e = hooks
        .recover_interrupted(log, &ctx, &history)
        .await
        .unwrap();
    assert_eq!(e.unwrap().code(), ErrorCode::Interrupted);
    assert_eq!(
        fake.calls_in(BeforeWorkloadStop),
        names(&["d", "c", "b", "a"]),
        "b, c were cut short and d replied nonsense: they may have granted; e reported failure"
    );
}

#[tokio::test]
async fn ensuring_a_ready_namespace_runs_no_hooks_and_cannot_revoke_it() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.fake.clear();
    rig.fake.on("b", AfterNamespacePrepared, Act::Fail(1));
    let r = rig
        .run("ns-again", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(
        rig.fake.calls(),
        vec![],
        "no hook was called, nothing revoked"
    );
    assert_eq!(
        kinds_of(&rig, "ns-again"),
        ["command_received", "command_completed"]
    );
    assert_eq!(rig.r1().state, BackendState::Running);
}
