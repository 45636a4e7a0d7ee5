//! A command's own `deadline` cuts it short as the agent's stop does: hooks in flight
//! are cancelled and what they granted compensated, a readiness wait is cut and the new
//! revision stopped and revoked, a command not begun by then is not begun, and a
//! command that completed is answered as it completed.

use super::readiness::{probes_of_r2_fail, r1_running_r2_checked, two_owners};
use super::revisions::rev;
use super::*;

/// `fields` with `"deadline"` `ms` milliseconds from now (in the past when negative).
fn by(fields: &str, ms: i64) -> String {
    let at = chrono::Utc::now() + chrono::Duration::milliseconds(ms);
    format!(r#"{fields},"deadline":"{}""#, at.to_rfc3339())
}

#[tokio::test]
async fn a_deadline_passing_mid_hook_cancels_it_and_compensates_in_reverse() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    rig.fake.on("b", BeforeWorkloadStart, Act::Hang);
    let r = rig
        .run("a1", "activate_revision", &by(&rev("r1"), 300))
        .await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(r.retryable);
    assert!(e.message.starts_with("its deadline "), "{}", e.message);
    assert!(e.message.contains("owner b was cancelled"), "{}", e.message);
    assert_eq!(
        rig.fake.calls(),
        vec![
            ("a".into(), BeforeWorkloadStart, false),
            ("b".into(), BeforeWorkloadStart, false),
            ("b".into(), BeforeWorkloadStop, true),
            ("a".into(), BeforeWorkloadStop, true),
        ]
    );
    assert_eq!(rig.r1().starts, 0);
}

#[tokio::test]
async fn a_command_past_its_deadline_is_recorded_and_not_begun() {
    let rig = rig(&["a"]);
    rig.staged().await;
    let r = rig
        .run("a1", "activate_revision", &by(&rev("r1"), -1_000))
        .await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(
        e.message
            .ends_with("passed before it began; nothing was done"),
        "{}",
        e.message
    );
    assert!(rig.fake.calls().is_empty(), "no hook called");
    assert_eq!(rig.r1().starts, 0);
    let kinds: Vec<&str> = rig
        .base
        .records()
        .iter()
        .rev()
        .take(2)
        .map(|r| r.event.kind())
        .collect();
    assert_eq!(kinds, ["command_completed", "command_received"]);
}

#[tokio::test]
async fn a_deadline_passing_during_the_readiness_wait_stops_and_revokes_the_new_revision() {
    let rig = two_owners(probes_of_r2_fail(None));
    r1_running_r2_checked(&rig, 1, 3_600_000).await;
    let r = rig
        .run("a2", "activate_revision", &by(&rev("r2"), 300))
        .await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(
        e.message.contains("cancelled while waiting for ns/web@r2"),
        "{}",
        e.message
    );
    rig.r1_kept_r2_undone();
}

#[tokio::test]
async fn a_completed_command_sent_again_past_its_deadline_is_answered_as_it_completed() {
    let rig = rig(&["a"]);
    rig.staged().await;
    let at = chrono::Utc::now() + chrono::Duration::milliseconds(500);
    let fields = format!(r#"{},"deadline":"{}""#, rev("r1"), at.to_rfc3339());
    rig.ok("a1", "activate_revision", &fields).await;
    // The same command, once its deadline is behind it.
    let behind = (at - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(behind + Duration::from_millis(1)).await;
    let again = rig.run("a1", "activate_revision", &fields).await;
    assert_eq!((again.outcome, again.duplicate), (Outcome::Succeeded, true));
    assert_eq!(rig.r1().starts, 1);
}
