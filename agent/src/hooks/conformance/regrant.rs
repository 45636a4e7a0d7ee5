//! A re-grant that fails revokes nothing: when an activation or start of the running
//! revision (or an ensure of a ready namespace) grants again what is missing and an
//! owner fails, what the revision or namespace held before the command stays held, as
//! after a crash in the same place. Compensation never touches what still runs.

use super::revisions::{call, held, r1_running_held_by_a, rev};
use super::*;
use crate::grants::Hold;

/// Every way `b` can fail a re-grant of r1, for an activation and a start: `a` keeps
/// the grant it held before the command, nothing is revoked, r1 runs on.
#[tokio::test]
async fn a_failed_regrant_of_the_running_revision_revokes_nothing_it_held() {
    let failures = [
        CallFailure::Exit,
        CallFailure::Timeout,
        CallFailure::Reply,
        CallFailure::Spawn,
    ];
    for (op, fields) in [
        ("activate_revision", rev("r1")),
        ("start_workload", W.into()),
    ] {
        for failure in failures {
            let rig = rig(&["a", "b"]);
            r1_running_held_by_a(&rig).await;
            rig.fake.on("b", BeforeWorkloadStart, Act::Break(failure));
            let r = rig.run("g1", op, &fields).await;
            let case = format!("{op}, b {}", failure.as_str());
            assert_eq!(r.outcome, Outcome::Failed, "{case}: {r:?}");
            assert!(r.retryable, "{case}: {r:?}");
            let message = &r.error.as_ref().unwrap().message;
            assert!(
                message.ends_with(
                    "; nothing was revoked: revision r1 keeps its grants, and a retry grants what is missing"
                ),
                "{case}: {message}"
            );
            assert_eq!(
                rig.calls_about(),
                vec![
                    call("a", BeforeWorkloadStart, false, "r1"),
                    call("b", BeforeWorkloadStart, false, "r1"),
                ],
                "{case}: no compensation of the running revision"
            );
            let holders = rig.holders("r1").unwrap();
            assert_eq!(holders.get("a"), Some(&Hold::Granted), "{case}");
            assert_eq!(rig.state("r1"), Some(BackendState::Running), "{case}");
            assert_eq!(rig.r1().starts, 1, "{case}: the driver was not called");
            // The retry grants what is missing.
            rig.fake.clear();
            rig.fake.script.lock().unwrap().clear();
            rig.ok("g2", op, &fields).await;
            assert_eq!(rig.holders("r1"), held(&["a", "b"]), "{case}");
            assert!(rig.fake.calls().iter().all(|c| !c.2), "{case}");
        }
    }
}

/// A re-grant whose merged launch env is rejected starts nothing and revokes nothing.
#[tokio::test]
async fn a_regrant_with_a_rejected_launch_env_revokes_nothing_it_held() {
    let rig = rig(&["a", "b"]);
    r1_running_held_by_a(&rig).await;
    rig.fake.on(
        "b",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("HOME", "opaque-x")])),
    );
    let r = rig.activate("g1").await;
    assert_eq!(
        r.error.as_ref().map(|e| e.code),
        Some(ErrorCode::LaunchEnvRejected),
        "{r:?}"
    );
    assert_eq!(rig.fake.calls_in(BeforeWorkloadStop), names(&[]));
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.r1().starts, 1, "nothing started again");
}

/// `ns` ready; a delete whose revocation failed at `a` left `b` revoked and the
/// namespace ready. Then a re-grant where `b` fails: `a` is not revoked.
#[tokio::test]
async fn a_failed_regrant_of_a_ready_namespace_revokes_nothing_it_held() {
    let rig = rig(&["a", "b"]);
    rig.ok("ns", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    rig.fake.on("a", BeforeNamespaceDelete, Act::Fail(1));
    let r = rig
        .run("d1", "delete_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    let of_ns = |rig: &Rig| {
        let log = rig.base.executor.log();
        log.with_intent(|i| i.grants.of_namespace("ns").cloned())
    };
    assert_eq!(of_ns(&rig), held(&["a"]));
    rig.fake.clear();
    rig.fake.on("b", AfterNamespacePrepared, Act::Fail(1));
    let r = rig
        .run("ns2", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(
        rig.fake.calls(),
        vec![
            ("a".into(), AfterNamespacePrepared, false),
            ("b".into(), AfterNamespacePrepared, false),
        ],
        "no before_namespace_delete for the ready namespace"
    );
    assert_eq!(of_ns(&rig), held(&["a"]));
    assert!(rig
        .base
        .executor
        .log()
        .intent()
        .namespaces
        .contains_key("ns"));
    rig.fake.clear();
    rig.ok("ns3", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(of_ns(&rig), held(&["a", "b"]));
}
