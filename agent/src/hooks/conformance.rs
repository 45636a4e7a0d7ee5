//! The hook conformance rules, each its own test, against the real executor, log and
//! sim driver with a scripted [`HookRunner`] (the exec runner and crashes are covered
//! end to end in `tests/tests/e2e/hooks/`). The hardening rules (commands that change
//! nothing, what compensation may revoke, timed-out owners) are in [`hardening`]; grants
//! following what runs across revisions, failures and crashes in [`revisions`]; a failed
//! re-grant of what runs, which revokes nothing, in [`regrant`].

use super::{CallFailure, HookKind, HookOwner, HookReply, HookRequest, HookRunner, Hooks, Phase};
use crate::event::Event;
use crate::testkit::{self, line as cmd};
use capstan_common::{CommandResult, ErrorCode, Outcome};
use capstan_driver::sim::{SimConfig, SimHost};
use capstan_driver::BackendState;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use Phase::*;

/// What the fake does when an owner is called for a phase.
#[derive(Clone)]
enum Act {
    Reply(Vec<(String, String)>),
    /// Fail this many times (then succeed with an empty reply).
    Fail(u32),
    Hang,
    /// Fail this way every time.
    Break(CallFailure),
}

#[derive(Default)]
struct Fake {
    script: Mutex<HashMap<(String, Phase), Act>>,
    /// (owner, phase, compensating), in call order.
    calls: Mutex<Vec<(String, Phase, bool)>>,
    /// Every request, in call order.
    requests: Mutex<Vec<HookRequest>>,
    called: tokio::sync::Notify,
}

impl Fake {
    fn on(&self, owner: &str, phase: Phase, act: Act) {
        self.script
            .lock()
            .unwrap()
            .insert((owner.to_string(), phase), act);
    }

    fn calls(&self) -> Vec<(String, Phase, bool)> {
        self.calls.lock().unwrap().clone()
    }

    fn calls_in(&self, phase: Phase) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.1 == phase)
            .map(|c| c.0)
            .collect()
    }

    fn clear(&self) {
        self.calls.lock().unwrap().clear();
        self.requests.lock().unwrap().clear();
    }
}

#[async_trait::async_trait]
impl HookRunner for Fake {
    async fn call(
        &self,
        owner: &HookOwner,
        request: &HookRequest,
    ) -> Result<HookReply, CallFailure> {
        self.calls
            .lock()
            .unwrap()
            .push((owner.name.clone(), request.phase, request.compensating));
        self.requests.lock().unwrap().push(request.clone());
        self.called.notify_waiters();
        let key = (owner.name.clone(), request.phase);
        let act = self.script.lock().unwrap().get(&key).cloned();
        match act {
            None => Ok(HookReply::default()),
            Some(Act::Reply(env)) => Ok(HookReply {
                env: env.into_iter().collect(),
                ..HookReply::default()
            }),
            Some(Act::Fail(0)) => Ok(HookReply::default()),
            Some(Act::Fail(n)) => {
                self.on(&owner.name, request.phase, Act::Fail(n - 1));
                Err(CallFailure::Exit)
            }
            Some(Act::Hang) => std::future::pending().await,
            Some(Act::Break(failure)) => Err(failure),
        }
    }
}

struct Rig {
    base: testkit::Rig,
    fake: Arc<Fake>,
}

fn owner(name: &str, timeout: Duration) -> HookOwner {
    HookOwner {
        name: name.into(),
        kind: HookKind::Exec {
            argv: vec!["/bin/true".into()],
        },
        timeout,
        phases: Phase::ALL.to_vec(),
    }
}

fn rig_with(owners: Vec<HookOwner>, budget: Duration) -> Rig {
    rig_on(owners, budget, SimConfig::default())
}

fn rig_on(owners: Vec<HookOwner>, budget: Duration, sim: SimConfig) -> Rig {
    let fake = Arc::new(Fake::default());
    let hooks = Hooks::new(owners, fake.clone()).with_cleanup_budget(budget);
    let base = testkit::Rig::with(sim, |e| e.with_hooks(hooks));
    Rig { base, fake }
}

fn rig(names: &[&str]) -> Rig {
    let owners = names
        .iter()
        .map(|n| owner(n, Duration::from_secs(30)))
        .collect();
    rig_with(owners, Duration::from_secs(5))
}

const W: &str = r#""namespace":"ns","workload":"web""#;

fn prepare(rev: &str, spec_env: &str) -> String {
    format!(
        r#"{W},"revision":"{rev}","spec":{{"driver":"sim","image":null,"command":[],"env":{{{spec_env}}}}}"#
    )
}

/// How long a test waits for the executor: a hook that is not cut as it should be
/// fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(60);

/// `f`, or a failure naming `what` if it has not finished within [`BOUND`].
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {BOUND:?}"))
}

impl Rig {
    async fn run(&self, id: &str, op: &str, fields: &str) -> CommandResult {
        bounded(id, self.base.executor.submit(&cmd(id, op, fields))).await
    }

    async fn ok(&self, id: &str, op: &str, fields: &str) {
        let r = self.run(id, op, fields).await;
        assert_eq!(r.outcome, Outcome::Succeeded, "{id}: {r:?}");
    }

    /// A namespace and a prepared revision `r1`, with no hook calls remembered.
    async fn staged(&self) {
        self.ok("ns", "ensure_namespace", r#""namespace":"ns""#)
            .await;
        self.ok("p1", "prepare_revision", &prepare("r1", "")).await;
        self.fake.clear();
    }

    async fn activate(&self, id: &str) -> CommandResult {
        self.run(id, "activate_revision", &format!(r#"{W},"revision":"r1""#))
            .await
    }

    fn host(&self) -> SimHost {
        SimHost::load(self.base.dir.path()).unwrap()
    }

    fn r1(&self) -> capstan_driver::sim::SimRevision {
        self.host().revisions["ns/web@r1"].clone()
    }

    fn log_text(&self) -> String {
        let records = self.base.records();
        let lines: Vec<String> = records.iter().map(|r| r.to_json().to_string()).collect();
        lines.join("\n")
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn owners_run_in_config_order_revoke_in_reverse_and_env_merges() {
    let rig = rig(&["a", "b", "c"]);
    rig.fake.on(
        "a",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("A_TOKEN", "opaque-a"), ("SHARED", "opaque-1")])),
    );
    rig.fake.on(
        "c",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("C_TOKEN", "opaque-c"), ("SHARED", "opaque-3")])),
    );
    rig.ok("ns", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(
        rig.fake.calls_in(AfterNamespacePrepared),
        names(&["a", "b", "c"])
    );
    rig.ok("p1", "prepare_revision", &prepare("r1", r#""PLAIN":"x""#))
        .await;
    rig.ok(
        "a1",
        "activate_revision",
        &format!(r#"{W},"revision":"r1""#),
    )
    .await;
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStart),
        names(&["a", "b", "c"])
    );
    let want: BTreeMap<String, String> = pairs(&[
        ("A_TOKEN", "opaque-a"),
        ("C_TOKEN", "opaque-c"),
        ("PLAIN", "x"),
        ("SHARED", "opaque-3"),
    ])
    .into_iter()
    .collect();
    assert_eq!(rig.r1().env, want, "spec env plus the merged launch env");
    rig.ok("s1", "stop_workload", W).await;
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStop),
        names(&["c", "b", "a"])
    );
    rig.fake.clear();
    rig.ok("r1", "retire_revision", &format!(r#"{W},"revision":"r1""#))
        .await;
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStop),
        names(&["c", "b", "a"])
    );
    rig.ok("d1", "delete_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(
        rig.fake.calls_in(BeforeNamespaceDelete),
        names(&["c", "b", "a"])
    );
    assert!(rig.fake.calls().iter().all(|c| !c.2), "no compensation");
    assert!(!rig.log_text().contains("opaque-"), "values never logged");
}

#[tokio::test]
async fn namespace_preparation_failure_rolls_back_completed_owners_in_reverse() {
    let rig = rig(&["a", "b", "c"]);
    rig.fake.on("c", AfterNamespacePrepared, Act::Fail(1));
    let r = rig
        .run("ns", "ensure_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(r.outcome, Outcome::Failed);
    let e = r.error.unwrap();
    assert_eq!(e.code, ErrorCode::HookFailed);
    assert!(r.retryable);
    assert!(
        e.message
            .starts_with("after_namespace_prepared hook of owner c failed"),
        "{}",
        e.message
    );
    assert_eq!(rig.fake.calls_in(BeforeNamespaceDelete), names(&["b", "a"]));
    assert!(rig
        .fake
        .calls_in(BeforeNamespaceDelete)
        .iter()
        .all(|o| o != "c"));
    assert!(
        rig.base.executor.log().intent().namespaces.is_empty(),
        "not ready"
    );
}

#[tokio::test]
async fn workload_start_failure_compensates_completed_owners_not_the_failing_one() {
    let rig = rig(&["a", "b", "c"]);
    rig.staged().await;
    rig.fake.on("b", BeforeWorkloadStart, Act::Fail(1));
    let r = rig.activate("a1").await;
    assert_eq!(
        r.error.as_ref().unwrap().code,
        ErrorCode::HookFailed,
        "{r:?}"
    );
    assert_eq!(
        rig.fake.calls(),
        vec![
            ("a".into(), BeforeWorkloadStart, false),
            ("b".into(), BeforeWorkloadStart, false),
            ("a".into(), BeforeWorkloadStop, true),
        ]
    );
    assert_eq!(rig.r1().starts, 0, "nothing started");
}

#[tokio::test]
async fn a_rejected_launch_env_revokes_all_owners_in_reverse_and_starts_nothing() {
    let many: Vec<(String, String)> = (0..65)
        .map(|i| (format!("V{i}"), "opaque-x".to_string()))
        .collect();
    let cases: Vec<Vec<(String, String)>> = vec![
        pairs(&[("HOME", "opaque-x")]),
        pairs(&[("LD_PRELOAD", "opaque-x")]),
        pairs(&[("CAPSTAN_X", "opaque-x")]),
        pairs(&[("bad-name", "opaque-x")]),
        pairs(&[("TOKEN", "hunter2-secret")]),
        pairs(&[("PLAIN", "opaque-x")]), // the spec sets PLAIN
        many,
    ];
    for env in cases {
        let rig = rig(&["a", "b"]);
        rig.ok("ns", "ensure_namespace", r#""namespace":"ns""#)
            .await;
        rig.ok("p1", "prepare_revision", &prepare("r1", r#""PLAIN":"x""#))
            .await;
        rig.fake.clear();
        rig.fake
            .on("b", BeforeWorkloadStart, Act::Reply(env.clone()));
        let r = rig.activate("a1").await;
        let e = r.error.clone().unwrap();
        assert_eq!(e.code, ErrorCode::LaunchEnvRejected, "{env:?}: {r:?}");
        assert!(!r.retryable);
        for (k, v) in &env {
            assert!(!e.message.contains(k.as_str()) && !e.message.contains(v.as_str()));
        }
        assert_eq!(rig.fake.calls_in(BeforeWorkloadStop), names(&["b", "a"]));
        assert_eq!(rig.r1().starts, 0, "nothing started");
        assert_eq!(rig.r1().state, BackendState::Stopped);
    }
}

#[tokio::test]
async fn only_the_final_merged_env_is_validated() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    rig.fake.on(
        "a",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("TOKEN", "not-opaque")])),
    );
    rig.fake.on(
        "b",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("TOKEN", "opaque-fixed")])),
    );
    let r = rig.activate("a1").await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(rig.r1().env["TOKEN"], "opaque-fixed");
}

#[tokio::test]
async fn a_revocation_failure_stops_teardown_and_a_retry_finishes_it() {
    let rig = rig(&["a", "b", "c"]);
    rig.staged().await;
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.fake.clear();
    rig.fake.on("b", BeforeWorkloadStop, Act::Fail(1));
    let r = rig.run("s1", "stop_workload", W).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::HookFailed);
    assert!(r.retryable, "{r:?}");
    assert!(e
        .message
        .contains("before_workload_stop hook of owner b failed"));
    assert_eq!(rig.fake.calls_in(BeforeWorkloadStop), names(&["c", "b"]));
    assert_eq!(rig.r1().state, BackendState::Running, "runtime kept");
    rig.fake.clear();
    rig.ok("s2", "stop_workload", W).await;
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStop),
        names(&["c", "b", "a"])
    );
    assert_eq!(rig.r1().state, BackendState::Stopped);

    // The same holds for retire and for delete_namespace.
    rig.fake.on("a", BeforeWorkloadStop, Act::Fail(1));
    let r = rig
        .run("r1", "retire_revision", &format!(r#"{W},"revision":"r1""#))
        .await;
    assert_eq!(r.error.unwrap().code, ErrorCode::HookFailed);
    assert!(rig.host().revisions.contains_key("ns/web@r1"), "kept");
    rig.ok("r2", "retire_revision", &format!(r#"{W},"revision":"r1""#))
        .await;
    assert!(!rig.host().revisions.contains_key("ns/web@r1"));
    rig.fake.on("c", BeforeNamespaceDelete, Act::Fail(1));
    let r = rig
        .run("d1", "delete_namespace", r#""namespace":"ns""#)
        .await;
    assert_eq!(r.error.unwrap().code, ErrorCode::HookFailed);
    assert!(rig.host().namespaces.contains("ns"), "kept");
    rig.ok("d2", "delete_namespace", r#""namespace":"ns""#)
        .await;
    assert!(!rig.host().namespaces.contains("ns"));
}

#[tokio::test]
async fn cancelling_mid_preparation_revokes_the_cut_owner_and_every_completed_one_under_a_fresh_budget(
) {
    let rig = rig(&["a", "b", "c"]);
    rig.staged().await;
    rig.fake.on("c", BeforeWorkloadStart, Act::Hang);
    let cancel = tokio_util::sync::CancellationToken::new();
    let command = capstan_common::Command::parse(&cmd(
        "a1",
        "activate_revision",
        &format!(r#"{W},"revision":"r1""#),
    ))
    .unwrap();
    let run = rig.base.executor.execute_until(command, &cancel);
    tokio::pin!(run);
    // Cancel once c is in its call.
    loop {
        let called = rig.fake.called.notified();
        tokio::pin!(called);
        called.as_mut().enable();
        if rig.fake.calls_in(BeforeWorkloadStart).len() == 3 {
            break;
        }
        tokio::select! {
            r = &mut run => panic!("finished before c was called: {r:?}"),
            () = called => {}
            () = tokio::time::sleep(BOUND) => panic!("c was not called within {BOUND:?}"),
        }
    }
    cancel.cancel();
    let r = bounded("the cancelled a1", run).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.code, ErrorCode::Cancelled, "{r:?}");
    assert!(r.retryable);
    assert!(e
        .message
        .contains("before_workload_start hook of owner c was cancelled"));
    assert!(
        e.message.contains("completed owners were compensated"),
        "{}",
        e.message
    );
    let undo: Vec<_> = rig
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.1 == BeforeWorkloadStop)
        .collect();
    assert_eq!(
        undo,
        vec![
            ("c".into(), BeforeWorkloadStop, true),
            ("b".into(), BeforeWorkloadStop, true),
            ("a".into(), BeforeWorkloadStop, true)
        ],
        "the cancelled owner may have granted: compensated first"
    );
    assert_eq!(rig.r1().starts, 0);
}

#[tokio::test]
async fn the_cleanup_budget_bounds_compensation_that_hangs() {
    let owners = vec![
        owner("a", Duration::from_secs(3600)),
        owner("b", Duration::from_secs(3600)),
    ];
    let rig = rig_with(owners, Duration::from_millis(200));
    rig.staged().await;
    rig.fake.on("a", BeforeWorkloadStop, Act::Hang);
    rig.fake.on("b", BeforeWorkloadStart, Act::Fail(1));
    let r = rig.activate("a1").await;
    let e = r.error.unwrap();
    assert_eq!(e.code, ErrorCode::HookFailed);
    assert!(
        e.message
            .contains("compensation incomplete: before_workload_stop hook of owner a failed"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_hook_that_hangs_is_cut_at_its_timeout_counts_as_failed_and_is_compensated() {
    let owners = vec![
        owner("a", Duration::from_secs(30)),
        owner("slow", Duration::from_millis(100)),
    ];
    let rig = rig_with(owners, Duration::from_secs(5));
    rig.staged().await;
    rig.fake.on("slow", BeforeWorkloadStart, Act::Hang);
    let r = rig.activate("a1").await;
    let e = r.error.unwrap();
    assert_eq!(e.code, ErrorCode::HookFailed);
    assert!(e
        .message
        .starts_with("before_workload_start hook of owner slow timed out"));
    assert_eq!(
        rig.fake.calls_in(BeforeWorkloadStop),
        names(&["slow", "a"]),
        "the timed-out owner may have granted: compensated first"
    );
    let failed = rig
        .base
        .executor
        .log()
        .for_command("a1")
        .unwrap()
        .into_iter()
        .any(|r| matches!(&r.event, Event::HookFailed { owner, code: ErrorCode::HookTimeout, .. } if owner == "slow"));
    assert!(failed, "hook_failed recorded for slow, code hook_timeout");
}

#[tokio::test]
async fn hook_progress_is_recorded_without_values() {
    let rig = rig(&["a", "b"]);
    rig.staged().await;
    rig.fake.on(
        "a",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("TOKEN", "opaque-s3cr3t")])),
    );
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    let kinds: Vec<String> = rig
        .base
        .executor
        .log()
        .for_command("a1")
        .unwrap()
        .iter()
        .map(|r| r.event.kind().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "command_received",
            "hook_started",
            "hook_succeeded",
            "hook_started",
            "hook_succeeded",
            "workload_started",
            "command_completed"
        ]
    );
    assert!(!rig.log_text().contains("s3cr3t"));
}

#[tokio::test]
async fn start_workload_grants_again_and_projects_the_launch_env() {
    let rig = rig(&["a"]);
    rig.staged().await;
    rig.fake.on(
        "a",
        BeforeWorkloadStart,
        Act::Reply(pairs(&[("TOKEN", "opaque-again")])),
    );
    assert_eq!(rig.activate("a1").await.outcome, Outcome::Succeeded);
    rig.ok("s1", "stop_workload", W).await;
    rig.fake.clear();
    rig.ok("t1", "start_workload", W).await;
    assert_eq!(rig.fake.calls_in(BeforeWorkloadStart), names(&["a"]));
    assert_eq!(rig.r1().state, BackendState::Running);
    assert_eq!(rig.r1().env["TOKEN"], "opaque-again");
}

mod cancel;
mod deadline;
mod hardening;
mod readiness;
mod regrant;
mod revisions;
mod strategy;
