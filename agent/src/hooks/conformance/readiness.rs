//! Readiness gates activation: the predecessor runs, and holds its grants, until the
//! new revision passes its check; one that never does is stopped and revoked and the
//! command fails `not_ready`; an agent restart during the wait probes again.

use super::revisions::{call, held, replaced, rev, undone, NO_BUDGET_LIMIT};
use super::*;
use capstan_driver::sim::ScriptedFailure;

/// A sim whose probes of `r2` fail `times` times (for ever when `None`).
pub(super) fn probes_of_r2_fail(times: Option<u32>) -> SimConfig {
    SimConfig {
        failures: vec![ScriptedFailure {
            op: "probe".into(),
            revision: Some("r2".into()),
            times,
            ..ScriptedFailure::default()
        }],
        ..SimConfig::default()
    }
}

pub(super) fn two_owners(sim: SimConfig) -> Rig {
    let owners = ["a", "b"]
        .map(|n| owner(n, Duration::from_secs(30)))
        .to_vec();
    rig_on(owners, NO_BUDGET_LIMIT, sim)
}

/// `prepare_revision` fields for `r2` with a tcp check: `threshold` passes in a row,
/// probed every 10 ms, within `deadline_ms`.
fn prepare_checked(threshold: u32, deadline_ms: u32) -> String {
    format!(
        r#"{W},"revision":"r2","spec":{{"driver":"sim","image":null,"command":[],"env":{{}},"readiness":{{"check":{{"tcp":{{"port":8080}}}},"interval_ms":10,"timeout_ms":10,"threshold":{threshold},"deadline_ms":{deadline_ms}}}}}"#
    )
}

/// `web` running r1 (granted by a and b), r2 prepared with a check; no calls remembered.
pub(super) async fn r1_running_r2_checked(rig: &Rig, threshold: u32, deadline_ms: u32) {
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    let fields = prepare_checked(threshold, deadline_ms);
    rig.ok("p2", "prepare_revision", &fields).await;
    rig.fake.clear();
}

impl Rig {
    /// r1 runs and holds a's and b's grants; r2 is stopped and holds none.
    pub(super) fn r1_kept_r2_undone(&self) {
        assert_eq!(self.state("r1"), Some(BackendState::Running));
        assert_eq!(self.state("r2"), Some(BackendState::Stopped));
        assert_eq!(self.holders("r1"), held(&["a", "b"]));
        assert_eq!(self.holders("r2"), held(&[]));
    }

    /// How often the scripted probe failure has fired.
    fn failed_probes(&self) -> u32 {
        self.host().fired.first().copied().unwrap_or(0)
    }

    fn active(&self) -> Option<String> {
        let log = self.base.executor.log();
        log.with_intent(|i| i.workload("ns", "web")?.active_revision.clone())
    }
}

#[tokio::test]
async fn a_revision_never_ready_is_stopped_and_revoked_and_its_predecessor_runs_on_with_its_grants()
{
    let rig = two_owners(probes_of_r2_fail(None));
    r1_running_r2_checked(&rig, 1, 200).await;
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::NotReady, "{r:?}");
    assert!(r.retryable);
    assert!(
        e.message.contains("ns/web@r2 was not ready within 200 ms"),
        "{}",
        e.message
    );
    assert!(rig.failed_probes() >= 2, "probed until the deadline");
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.state("r2"), Some(BackendState::Stopped));
    assert_eq!(rig.active().as_deref(), Some("r1"));
    assert_eq!(
        rig.calls_about(),
        undone("r2"),
        "r2's grants undone, r1's untouched"
    );
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.holders("r2"), held(&[]));
}

#[tokio::test]
async fn a_revision_ready_after_failed_probes_activates_once_it_passes_the_threshold_in_a_row() {
    let rig = two_owners(probes_of_r2_fail(Some(3)));
    r1_running_r2_checked(&rig, 2, 30_000).await;
    rig.ok("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(rig.failed_probes(), 3);
    assert_eq!(rig.state("r1"), Some(BackendState::Stopped));
    assert_eq!(rig.state("r2"), Some(BackendState::Running));
    assert_eq!(rig.active().as_deref(), Some("r2"));
    assert_eq!(rig.calls_about(), replaced("r2", "r1"));
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}

#[tokio::test]
async fn cancelling_during_the_wait_stops_and_revokes_the_new_revision_and_keeps_the_old_one() {
    let rig = two_owners(probes_of_r2_fail(None));
    r1_running_r2_checked(&rig, 1, 3_600_000).await;
    let cancel = tokio_util::sync::CancellationToken::new();
    let command =
        capstan_common::Command::parse(&cmd("a2", "activate_revision", &rev("r2"))).unwrap();
    let run = rig.base.executor.execute_until(command, &cancel);
    tokio::pin!(run);
    rig.probed_while(&mut run).await;
    cancel.cancel();
    let r = bounded("the cancelled a2", run).await;
    assert_eq!(
        r.error.as_ref().map(|e| e.code),
        Some(ErrorCode::Cancelled),
        "{r:?}"
    );
    assert!(r.retryable);
    rig.r1_kept_r2_undone();
}

impl Rig {
    /// Drives `run` until r2 has been probed (and failed) at least once.
    pub(super) async fn probed_while<F: std::future::Future<Output = CommandResult>>(
        &self,
        run: &mut std::pin::Pin<&mut F>,
    ) {
        let waited = async {
            while self.failed_probes() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            r = run => panic!("finished before r2 was probed: {r:?}"),
            () = bounded("the first probe", waited) => {}
        }
    }

    /// Runs activation of r2 until it is waiting for readiness, drops it there as a
    /// crash would, and opens the data dir again with `sim` and recovers.
    async fn crash_while_waiting(self, sim: SimConfig) -> Rig {
        {
            let text = cmd("a2", "activate_revision", &rev("r2"));
            let run = self.base.executor.submit(&text);
            tokio::pin!(run);
            self.probed_while(&mut run).await;
        }
        let rig = self.reopen(sim);
        bounded("recovery", rig.base.executor.recover())
            .await
            .unwrap();
        rig
    }
}

#[tokio::test]
async fn a_crash_during_the_wait_probes_again_on_restart_and_finishes_once_ready() {
    let rig = two_owners(probes_of_r2_fail(None));
    r1_running_r2_checked(&rig, 1, 3_600_000).await;
    // After the restart, probes pass.
    let rig = rig.crash_while_waiting(SimConfig::default()).await;
    assert_eq!(rig.outcome("a2"), (Outcome::Succeeded, None));
    assert_eq!(rig.state("r1"), Some(BackendState::Stopped));
    assert_eq!(rig.state("r2"), Some(BackendState::Running));
    assert_eq!(rig.active().as_deref(), Some("r2"));
    assert_eq!(
        rig.calls_about(),
        vec![
            call("b", BeforeWorkloadStop, false, "r1"),
            call("a", BeforeWorkloadStop, false, "r1"),
        ],
        "r2 kept what it was granted; r1 revoked"
    );
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}

#[tokio::test]
async fn a_crash_during_the_wait_rolls_back_on_restart_when_the_revision_is_still_not_ready() {
    let rig = two_owners(probes_of_r2_fail(None));
    // Long enough for the crash to land inside the wait; the restart waits it out.
    r1_running_r2_checked(&rig, 1, 2_000).await;
    let rig = rig.crash_while_waiting(probes_of_r2_fail(None)).await;
    assert_eq!(
        rig.outcome("a2"),
        (Outcome::Failed, Some(ErrorCode::Interrupted))
    );
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.state("r2"), Some(BackendState::Stopped));
    assert_eq!(rig.active().as_deref(), Some("r1"));
    assert_eq!(
        rig.calls_about(),
        vec![
            call("b", BeforeWorkloadStop, true, "r2"),
            call("a", BeforeWorkloadStop, true, "r2"),
        ]
    );
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.holders("r2"), held(&[]));
}

#[tokio::test]
async fn a_start_that_never_becomes_ready_stops_the_revision_again_and_revokes_it() {
    let rig = two_owners(probes_of_r2_fail(Some(1)));
    r1_running_r2_checked(&rig, 1, 1_000).await;
    rig.ok("a2", "activate_revision", &rev("r2")).await;
    rig.ok("s1", "stop_workload", W).await;
    // From now on r2 never passes.
    let rig = rig.reopen(probes_of_r2_fail(None));
    let r = rig.run("s2", "start_workload", W).await;
    assert_eq!(
        r.error.as_ref().map(|e| e.code),
        Some(ErrorCode::NotReady),
        "{r:?}"
    );
    assert_eq!(rig.state("r2"), Some(BackendState::Stopped));
    assert_eq!(rig.calls_about(), undone("r2"));
    assert_eq!(rig.holders("r2"), held(&[]));
    let stopped = rig.base.executor.log().with_intent(|i| {
        i.workload("ns", "web")
            .map(|w| w.intent == crate::intent::RunIntent::Stopped)
    });
    assert_eq!(stopped, Some(true), "intent stays stopped");
}
