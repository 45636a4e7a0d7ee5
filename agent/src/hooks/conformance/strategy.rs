//! `strategy: "stop-first"`: the running revision is stopped before the new one
//! starts, keeps its grants meanwhile, and is started again when the new one fails to
//! start or to become ready.

use super::revisions::{held, replaced, rev, undone, NO_BUDGET_LIMIT};
use super::*;
use capstan_driver::sim::ScriptedFailure;

/// A sim whose `op` on r2 fails once (`probe`: for ever).
fn r2_fails(op: &str) -> SimConfig {
    SimConfig {
        failures: vec![ScriptedFailure {
            op: op.into(),
            revision: Some("r2".into()),
            times: (op != "probe").then_some(1),
            ..ScriptedFailure::default()
        }],
        ..SimConfig::default()
    }
}

/// `web` running r1 (granted by a and b), and r2 prepared stop-first with `extra`
/// spec fields; no calls remembered.
async fn r1_running_r2_stop_first(sim: SimConfig, extra: &str) -> Rig {
    let owners = ["a", "b"]
        .map(|n| owner(n, Duration::from_secs(30)))
        .to_vec();
    let rig = rig_on(owners, NO_BUDGET_LIMIT, sim);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    let fields = format!(
        r#"{W},"revision":"r2","spec":{{"driver":"sim","image":null,"command":[],"env":{{}},"strategy":"stop-first"{extra}}}"#
    );
    rig.ok("p2", "prepare_revision", &fields).await;
    rig.fake.clear();
    rig
}

#[tokio::test]
async fn a_stop_first_activation_that_fails_starts_the_old_revision_again_with_its_grants() {
    let rig = r1_running_r2_stop_first(r2_fails("activate"), "").await;
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    let r1 = rig.r1();
    assert_eq!(r1.state, BackendState::Running);
    assert_eq!(
        r1.starts, 2,
        "stopped before r2's start, then started again"
    );
    assert_eq!(rig.state("r2"), Some(BackendState::Stopped));
    assert_eq!(rig.calls_about(), undone("r2"), "r1 never revoked");
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.holders("r2"), held(&[]));
    // The retry replaces r1.
    rig.fake.clear();
    rig.ok("a3", "activate_revision", &rev("r2")).await;
    assert_eq!(rig.r1().state, BackendState::Stopped);
    assert_eq!(rig.state("r2"), Some(BackendState::Running));
    assert_eq!(rig.calls_about(), replaced("r2", "r1"));
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}

#[tokio::test]
async fn a_stop_first_revision_never_ready_is_stopped_and_the_old_one_started_again() {
    let check = r#","readiness":{"check":{"tcp":{"port":80}},"interval_ms":10,"deadline_ms":100}"#;
    let rig = r1_running_r2_stop_first(r2_fails("probe"), check).await;
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.error.map(|e| e.code), Some(ErrorCode::NotReady));
    assert_eq!(rig.r1().state, BackendState::Running);
    assert_eq!(rig.r1().starts, 2);
    assert_eq!(rig.state("r2"), Some(BackendState::Stopped));
    assert_eq!(rig.calls_about(), undone("r2"));
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
}

#[tokio::test]
async fn with_the_default_strategy_a_failed_activation_never_stopped_the_old_revision() {
    // Start-first (the default): a failed activation never stopped r1.
    let owners = ["a", "b"]
        .map(|n| owner(n, Duration::from_secs(30)))
        .to_vec();
    let rig = rig_on(owners, NO_BUDGET_LIMIT, r2_fails("activate"));
    rig.staged().await;
    rig.ok("a1", "activate_revision", &rev("r1")).await;
    rig.ok("p2", "prepare_revision", &prepare("r2", "")).await;
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(
        (rig.r1().state, rig.r1().starts),
        (BackendState::Running, 1)
    );
}
