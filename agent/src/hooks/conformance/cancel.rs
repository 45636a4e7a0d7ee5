//! A `cancel_command` from the controller cuts its target short as the agent's stop
//! does: hooks in flight are cancelled and what they granted compensated, a readiness
//! wait is cut and the new revision stopped and revoked, a target not begun is never
//! begun (also after a restart), and a target that completed is left as it completed.

use super::readiness::{probes_of_r2_fail, r1_running_r2_checked, two_owners};
use super::revisions::rev;
use super::*;

/// A `cancel_command`'s fields for `target`.
fn of(target: &str) -> String {
    format!(r#""target":"{target}""#)
}

impl Rig {
    /// Drives `run` until `n` calls of `phase` have begun.
    async fn called_while<F: std::future::Future<Output = CommandResult>>(
        &self,
        run: &mut std::pin::Pin<&mut F>,
        phase: Phase,
        n: usize,
    ) {
        loop {
            let called = self.fake.called.notified();
            tokio::pin!(called);
            called.as_mut().enable();
            if self.fake.calls_in(phase).len() >= n {
                return;
            }
            tokio::select! {
                r = &mut *run => panic!("finished before call {n} of {phase}: {r:?}"),
                () = called => {}
                () = tokio::time::sleep(BOUND) => panic!("call {n} of {phase} not made within {BOUND:?}"),
            }
        }
    }

    /// The kinds of the records that carry `id`, in order.
    fn kinds_of(&self, id: &str) -> Vec<&'static str> {
        let records = self.base.records();
        let of = records.iter().filter(|r| r.event.command_id() == Some(id));
        of.map(|r| r.event.kind()).collect()
    }
}

#[tokio::test]
async fn a_cancel_mid_hook_cuts_it_and_compensates_in_reverse() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    rig.fake.on("b", BeforeWorkloadStart, Act::Hang);
    let text = cmd("a1", "activate_revision", &rev("r1"));
    let run = rig.base.executor.submit(&text);
    tokio::pin!(run);
    rig.called_while(&mut run, BeforeWorkloadStart, 2).await;
    // Carried out while a1 hangs in b's call: a cancel waits for no namespace.
    let fields = of("a1");
    let k = tokio::select! {
        k = rig.run("k1", "cancel_command", &fields) => k,
        r = &mut run => panic!("a1 finished before the cancel: {r:?}"),
    };
    assert_eq!((k.outcome, k.error), (Outcome::Succeeded, None));
    let r = bounded("the cancelled a1", run).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(r.retryable);
    assert!(
        e.message
            .starts_with("cancelled at the controller's request (cancel_command k1): "),
        "{}",
        e.message
    );
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
    assert_eq!(
        rig.kinds_of("k1"),
        ["command_received", "command_completed"]
    );
    assert!(rig.kinds_of("a1").contains(&"cancel_requested"));
    // Sent again, the cancel is answered from the log.
    let again = rig.run("k1", "cancel_command", &of("a1")).await;
    assert_eq!((again.outcome, again.duplicate), (Outcome::Succeeded, true));
}

#[tokio::test]
async fn a_cancel_during_the_readiness_wait_stops_and_revokes_the_new_revision() {
    let rig = two_owners(probes_of_r2_fail(None));
    r1_running_r2_checked(&rig, 1, 3_600_000).await;
    let text = cmd("a2", "activate_revision", &rev("r2"));
    let run = rig.base.executor.submit(&text);
    tokio::pin!(run);
    rig.probed_while(&mut run).await;
    let fields = of("a2");
    let k = tokio::select! {
        k = rig.run("k2", "cancel_command", &fields) => k,
        r = &mut run => panic!("a2 finished before the cancel: {r:?}"),
    };
    assert_eq!(k.outcome, Outcome::Succeeded, "{k:?}");
    let r = bounded("the cancelled a2", run).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(
        e.message
            .contains("cancel_command k2): cancelled while waiting for ns/web@r2"),
        "{}",
        e.message
    );
    rig.r1_kept_r2_undone();
}

#[tokio::test]
async fn a_cancel_of_a_completed_command_changes_nothing() {
    let rig = rig(&["a"]);
    rig.staged().await;
    rig.ok("a1", "activate_revision", &rev("r1")).await;
    let before = rig.kinds_of("a1");
    let k = rig.run("k1", "cancel_command", &of("a1")).await;
    assert_eq!((k.outcome, k.error), (Outcome::Succeeded, None));
    assert_eq!(rig.kinds_of("a1"), before, "nothing recorded about a1");
    let again = rig.run("a1", "activate_revision", &rev("r1")).await;
    assert_eq!((again.outcome, again.duplicate), (Outcome::Succeeded, true));
    assert_eq!(rig.r1().starts, 1);
}

#[tokio::test]
async fn a_command_cancelled_before_it_arrives_is_recorded_and_never_begun_even_after_a_restart() {
    let rig = rig(&["a"]);
    rig.staged().await;
    let k = rig.run("k1", "cancel_command", &of("a1")).await;
    assert_eq!(k.outcome, Outcome::Succeeded, "{k:?}");
    assert_eq!(rig.kinds_of("a1"), ["cancel_requested"]);
    // A second cancel of it records nothing more.
    rig.ok("k2", "cancel_command", &of("a1")).await;
    assert_eq!(rig.kinds_of("a1"), ["cancel_requested"]);
    let rig = rig.reopen(SimConfig::default());
    let r = rig.run("a1", "activate_revision", &rev("r1")).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(r.retryable);
    assert_eq!(
        e.message,
        "cancelled at the controller's request (cancel_command k1) before it began; nothing was done"
    );
    assert!(rig.fake.calls().is_empty(), "no hook called");
    assert_eq!(rig.r1().starts, 0);
    assert_eq!(
        rig.kinds_of("a1"),
        ["cancel_requested", "command_received", "command_completed"]
    );
    // Retried under a new id (what a controller does with a retryable failure), it
    // runs.
    rig.ok("a1b", "activate_revision", &rev("r1")).await;
    assert_eq!(rig.r1().starts, 1);
}

#[tokio::test]
async fn a_cancel_names_another_command_and_is_for_this_host() {
    let rig = rig(&["a"]);
    let r = rig.run("k1", "cancel_command", &of("k1")).await;
    assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
    assert_eq!(r.error.unwrap().code, ErrorCode::InvalidCommand);
    let r = rig.run("k2", "cancel_command", &of("not an id")).await;
    assert_eq!(r.error.unwrap().code, ErrorCode::InvalidId);
}
