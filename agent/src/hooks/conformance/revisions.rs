//! Grants follow what runs: activating a revision revokes what the one it replaced
//! holds, a start that did not complete (the driver failed, or a crash cut it short)
//! leaves the workload running what intent says with grants for that revision only,
//! and a grant a failed command left missing is granted again.

use super::*;
use crate::grants::{Hold, Holders};
use crate::log::LogOptions;
use capstan_driver::sim::ScriptedFailure;

pub(super) const NO_BUDGET_LIMIT: Duration = Duration::from_secs(5);

/// `web` running r1 (granted by `names`), r2 prepared; no calls remembered.
async fn r1_running_r2_prepared(rig: &Rig) {
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.ok("p2", "prepare_revision", &prepare("r2", "")).await;
    rig.fake.clear();
}

pub(super) fn rev(r: &str) -> String {
    format!(r#"{W},"revision":"{r}""#)
}

impl Rig {
    pub(super) fn holders(&self, r: &str) -> Option<Holders> {
        let log = self.base.executor.log();
        log.with_intent(|i| i.grants.of_revision("ns", "web", r).cloned())
    }

    pub(super) fn state(&self, r: &str) -> Option<BackendState> {
        let key = format!("ns/web@{r}");
        self.host().revisions.get(&key).map(|r| r.state.clone())
    }

    /// (owner, phase, compensating, revision) of every call, in order.
    pub(super) fn calls_about(&self) -> Vec<(String, Phase, bool, Option<String>)> {
        let requests = self.fake.requests.lock().unwrap();
        let calls = requests.iter();
        calls
            .map(|q| (q.owner.clone(), q.phase, q.compensating, q.revision.clone()))
            .collect()
    }

    /// Runs `op` until `owner` is in its `phase` call (scripted to hang), then drops
    /// it there, as a crash would, and opens the data dir again with the same owners
    /// (no longer scripted to fail) and recovers.
    async fn crash_in(self, id: &str, op: &str, fields: &str, owner: &str, phase: Phase) -> Rig {
        {
            let text = cmd(id, op, fields);
            let run = self.base.executor.submit(&text);
            tokio::pin!(run);
            loop {
                let called = self.fake.called.notified();
                tokio::pin!(called);
                called.as_mut().enable();
                if self.fake.calls_in(phase).iter().any(|o| o == owner) {
                    break;
                }
                tokio::select! {
                    r = &mut run => panic!("{id} finished before {owner} was called: {r:?}"),
                    () = called => {}
                    () = tokio::time::sleep(BOUND) => panic!("{owner} not called within {BOUND:?}"),
                }
            }
        }
        self.fake.script.lock().unwrap().clear();
        let rig = self.reopen(SimConfig::default());
        bounded("recovery", rig.base.executor.recover())
            .await
            .unwrap();
        rig
    }

    /// Opens the data dir again, as an agent restart does, with owners `a` and `b`
    /// and the sim configured as `sim`; no calls remembered.
    pub(super) fn reopen(self, sim: SimConfig) -> Rig {
        let Rig { base, fake } = self;
        fake.clear();
        let owners = ["a", "b"]
            .map(|n| super::owner(n, Duration::from_secs(30)))
            .to_vec();
        let hooks = Hooks::new(owners, fake.clone()).with_cleanup_budget(NO_BUDGET_LIMIT);
        let base = base.reopen_with(LogOptions::default(), sim, |e| e.with_hooks(hooks));
        Rig { base, fake }
    }

    pub(super) fn outcome(&self, id: &str) -> (Outcome, Option<ErrorCode>) {
        let records = self.base.executor.log().for_command(id).unwrap();
        match &records.last().unwrap().event {
            Event::CommandCompleted { outcome, code, .. } => (*outcome, *code),
            e => panic!("{id} did not complete: {e:?}"),
        }
    }
}

pub(super) fn held(owners: &[&str]) -> Option<Holders> {
    Some(
        owners
            .iter()
            .map(|o| (o.to_string(), Hold::Granted))
            .collect(),
    )
}

/// `new` granted by a then b, then `old` revoked by b then a: a replacement.
pub(super) fn replaced(new: &str, old: &str) -> Vec<(String, Phase, bool, Option<String>)> {
    vec![
        call("a", BeforeWorkloadStart, false, new),
        call("b", BeforeWorkloadStart, false, new),
        call("b", BeforeWorkloadStop, false, old),
        call("a", BeforeWorkloadStop, false, old),
    ]
}

/// `rev` granted by a then b, then compensated by b then a: a start undone.
pub(super) fn undone(rev: &str) -> Vec<(String, Phase, bool, Option<String>)> {
    vec![
        call("a", BeforeWorkloadStart, false, rev),
        call("b", BeforeWorkloadStart, false, rev),
        call("b", BeforeWorkloadStop, true, rev),
        call("a", BeforeWorkloadStop, true, rev),
    ]
}

pub(super) fn call(
    owner: &str,
    phase: Phase,
    compensating: bool,
    r: &str,
) -> (String, Phase, bool, Option<String>) {
    (owner.into(), phase, compensating, Some(r.into()))
}

#[tokio::test]
async fn activating_a_revision_revokes_what_the_replaced_one_held_once_the_new_one_runs() {
    let rig = rig(&["a", "b"]);
    r1_running_r2_prepared(&rig).await;
    rig.ok("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(rig.calls_about(), replaced("r2", "r1"));
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
    assert_eq!(rig.state("r1"), Some(BackendState::Stopped));
}

#[tokio::test]
async fn a_failed_revocation_of_the_replaced_revision_fails_retryably_and_the_next_command_finishes_it(
) {
    let rig = rig(&["a", "b"]);
    r1_running_r2_prepared(&rig).await;
    rig.fake.on("a", BeforeWorkloadStop, Act::Fail(1));
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.retryable, "{r:?}");
    assert_eq!(
        rig.state("r2"),
        Some(BackendState::Running),
        "the effect is kept"
    );
    assert_eq!(
        rig.holders("r1"),
        held(&["a"]),
        "b revoked, a still holds r1"
    );
    rig.fake.clear();
    rig.ok("a3", "activate_revision", &rev("r2")).await;
    // A revocation is retried whole, as a stop is (revoking is idempotent).
    assert_eq!(
        rig.calls_about(),
        vec![
            call("b", BeforeWorkloadStop, false, "r1"),
            call("a", BeforeWorkloadStop, false, "r1"),
        ]
    );
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}

#[tokio::test]
async fn a_failed_activation_in_the_driver_revokes_the_new_revision_and_keeps_the_old_one() {
    let failure = ScriptedFailure {
        op: "activate".into(),
        revision: Some("r2".into()),
        times: Some(1),
        ..ScriptedFailure::default()
    };
    let sim = SimConfig {
        failures: vec![failure],
        ..SimConfig::default()
    };
    let owners = ["a", "b"]
        .map(|n| owner(n, Duration::from_secs(30)))
        .to_vec();
    let rig = rig_on(owners, NO_BUDGET_LIMIT, sim);
    r1_running_r2_prepared(&rig).await;
    let r = rig.run("a2", "activate_revision", &rev("r2")).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(
        rig.calls_about(),
        undone("r2"),
        "r2's grants undone, r1's untouched"
    );
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.holders("r2"), held(&[]));
    // The retry converges: r2 runs with the grants, r1 holds none.
    rig.fake.clear();
    rig.ok("a3", "activate_revision", &rev("r2")).await;
    assert_eq!(rig.calls_about(), replaced("r2", "r1"));
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}

/// `web` running r1; a stop whose revocation failed at `a` left `b` revoked: r1 runs,
/// held by `a` only. No calls remembered.
pub(super) async fn r1_running_held_by_a(rig: &Rig) {
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    // The stop revokes b, then a fails: r1 still runs, b no longer holds it.
    rig.fake.on("a", BeforeWorkloadStop, Act::Fail(1));
    let r = rig.run("s1", "stop_workload", W).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.holders("r1"), held(&["a"]));
    rig.fake.clear();
}

#[tokio::test]
async fn a_running_revision_missing_a_grant_is_granted_again_by_the_next_activation() {
    let rig = rig(&["a", "b"]);
    r1_running_held_by_a(&rig).await;
    assert_eq!(rig.activate("a2").await.outcome, Outcome::Succeeded);
    assert_eq!(
        rig.calls_about(),
        vec![
            call("a", BeforeWorkloadStart, false, "r1"),
            call("b", BeforeWorkloadStart, false, "r1"),
        ]
    );
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
}

#[tokio::test]
async fn a_crash_while_granting_the_new_revision_is_undone_for_that_revision_on_restart() {
    let rig = rig(&["a", "b"]);
    r1_running_r2_prepared(&rig).await;
    rig.fake.on("b", BeforeWorkloadStart, Act::Hang);
    let fields = rev("r2");
    let rig = rig
        .crash_in("a2", "activate_revision", &fields, "b", BeforeWorkloadStart)
        .await;
    assert_eq!(
        rig.calls_about(),
        vec![
            call("b", BeforeWorkloadStop, true, "r2"),
            call("a", BeforeWorkloadStop, true, "r2"),
        ],
        "every owner that began is compensated, about r2"
    );
    assert_eq!(
        rig.outcome("a2"),
        (Outcome::Failed, Some(ErrorCode::Interrupted))
    );
    assert_eq!(rig.state("r1"), Some(BackendState::Running));
    assert_eq!(rig.holders("r1"), held(&["a", "b"]));
    assert_eq!(rig.holders("r2"), held(&[]));
}

#[tokio::test]
async fn a_crash_while_revoking_the_replaced_revision_is_finished_on_restart() {
    let rig = rig(&["a", "b"]);
    r1_running_r2_prepared(&rig).await;
    rig.fake.on("b", BeforeWorkloadStop, Act::Hang);
    let fields = rev("r2");
    let rig = rig
        .crash_in("a2", "activate_revision", &fields, "b", BeforeWorkloadStop)
        .await;
    assert_eq!(rig.outcome("a2"), (Outcome::Succeeded, None));
    assert_eq!(
        rig.calls_about(),
        vec![
            call("b", BeforeWorkloadStop, false, "r1"),
            call("a", BeforeWorkloadStop, false, "r1"),
        ],
        "r2 stays granted; r1's grants are revoked"
    );
    let active = rig.base.executor.log().with_intent(|i| {
        let w = i.workload("ns", "web").unwrap();
        w.active_revision.clone()
    });
    assert_eq!(active.as_deref(), Some("r2"));
    assert_eq!(rig.state("r2"), Some(BackendState::Running));
    assert_eq!(rig.state("r1"), Some(BackendState::Stopped));
    assert_eq!(rig.holders("r1"), held(&[]));
    assert_eq!(rig.holders("r2"), held(&["a", "b"]));
}
