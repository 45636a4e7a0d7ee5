//! Exactly once across retention: a command whose records a prune removed is
//! answered as a duplicate when it comes again (a coordinator's re-post, a JetStream
//! redelivery), however old, and never carried out again.

use crate::log::retention::Policy;
use crate::log::LogOptions;
use crate::testkit::{activate_op, command, prepare_op, spec, Rig};
use capstan_common::{ErrorCode, Op, Outcome};
use capstan_driver::sim::SimConfig;
use std::time::Duration;

fn options() -> LogOptions {
    LogOptions::snapshot_every(4)
}

/// Given `ns` ready, `web` prepared and activated on r1 (command `a1`), then on r2,
/// and enough other commands after for a snapshot past them, when retention prunes
/// everything it may: `a1`'s records are gone from the log.
async fn pruned_rig() -> Rig {
    let rig = Rig::with_log(options(), SimConfig::default());
    rig.ok(
        "ns",
        Op::EnsureNamespace {
            namespace: "ns".into(),
        },
    )
    .await;
    rig.ok("p1", prepare_op("r1", spec())).await;
    rig.ok("a1", activate_op("r1")).await;
    rig.ok("p2", prepare_op("r2", spec())).await;
    rig.ok("a2", activate_op("r2")).await;
    for i in 0..4 {
        let namespace = format!("other{i}");
        rig.ok(&format!("o{i}"), Op::EnsureNamespace { namespace })
            .await;
    }
    prune_all(&rig);
    let log = rig.executor.log();
    assert!(log.for_command("a1").unwrap().is_empty(), "a1 is pruned");
    rig
}

/// Prunes all retention may (keeping one record), everything published, now.
fn prune_all(rig: &Rig) {
    let log = rig.executor.log();
    let policy = Policy {
        max_records: Some(1),
        max_age: None,
        export_dir: rig.dir.path().join("export"),
        interval: Duration::from_secs(1),
        pruned_ids_max_age: Duration::from_secs(30 * 86_400),
    };
    let now = chrono::Utc::now().timestamp_millis();
    let mut pruned = 0;
    while let Some(p) = log.prune(&policy, log.last_seq(), now).unwrap() {
        pruned = p.last;
    }
    assert!(pruned > 0, "something was pruned");
}

/// Given a pruned rig, then: `web` still runs r2, r1 was started once.
fn r1_started_once_and_r2_active(rig: &Rig) {
    let host = rig.sim.host();
    assert_eq!(host.revisions["ns/web@r1"].starts, 1, "{host:?}");
    let intent = rig.executor.log().intent();
    let web = intent.workload("ns", "web").unwrap();
    assert_eq!(web.active_revision.as_deref(), Some("r2"), "{web:?}");
}

#[tokio::test]
async fn a_pruned_command_sent_again_is_answered_from_the_log_and_not_carried_out() {
    let rig = pruned_rig().await;
    let before = rig.records().len();

    let again = rig.executor.execute(command("a1", activate_op("r1"))).await;

    assert_eq!(
        (again.outcome, again.duplicate, &again.error),
        (Outcome::Succeeded, true, &None),
        "{again:?}"
    );
    r1_started_once_and_r2_active(&rig);
    assert_eq!(rig.records().len(), before, "nothing was appended");
}

#[tokio::test]
async fn a_pruned_id_sent_again_with_other_content_is_an_id_conflict() {
    let rig = pruned_rig().await;

    let other = rig.executor.execute(command("a1", activate_op("r9"))).await;

    assert_eq!(
        (other.outcome, other.duplicate),
        (Outcome::Rejected, false),
        "{other:?}"
    );
    let error = other.error.unwrap();
    assert_eq!(error.code, ErrorCode::IdConflict, "{error:?}");
    assert!(error.message.contains("a1"), "{error:?}");
    r1_started_once_and_r2_active(&rig);
}

#[tokio::test]
async fn a_pruned_command_is_still_answered_after_a_restart() {
    let rig = pruned_rig().await.reopen(options(), SimConfig::default());

    let again = rig.executor.execute(command("a1", activate_op("r1"))).await;
    assert_eq!((again.outcome, again.duplicate), (Outcome::Succeeded, true));
    let other = rig.executor.execute(command("a1", activate_op("r9"))).await;
    assert_eq!(other.error.map(|e| e.code), Some(ErrorCode::IdConflict));
    r1_started_once_and_r2_active(&rig);
}

#[tokio::test]
async fn a_pruned_failure_is_answered_with_its_code() {
    let rig = Rig::with_log(options(), SimConfig::default());
    // Activating a revision never prepared fails, and completes with its code.
    let failed = rig.executor.execute(command("x1", activate_op("r7"))).await;
    assert_eq!(failed.outcome, Outcome::Failed, "{failed:?}");
    for i in 0..6 {
        let namespace = format!("other{i}");
        rig.ok(&format!("o{i}"), Op::EnsureNamespace { namespace })
            .await;
    }
    prune_all(&rig);
    assert!(rig.executor.log().for_command("x1").unwrap().is_empty());

    let again = rig.executor.execute(command("x1", activate_op("r7"))).await;

    assert_eq!((again.outcome, again.duplicate), (Outcome::Failed, true));
    assert_eq!(again.error, failed.error, "the same code and message");
    assert_eq!(again.retryable, failed.retryable);
}
