//! Supervision and drift with the docker driver: an exit is recorded with its code
//! and a running-intent workload is started again (an explicitly stopped one is
//! not); a container labelled as ours that intent does not know is reported, keeps
//! its namespace from being deleted, and is removed only with `reap_orphans = true`;
//! one made while the agent runs is seen by the reconciler's look, without a restart.

use super::a_running_b_stopped;
use capstan_tests::command::Spec;
use capstan_tests::docker::{agent, Engine, IMAGE};
use capstan_tests::process::Exit;
use capstan_tests::{wait_until, READY};

capstan_tests::each_engine!(
    a_killed_container_is_restarted_and_its_exit_recorded,
    drift_is_reported_and_reaped_only_when_configured,
    drift_made_while_the_agent_runs_is_seen_without_a_restart,
    a_crash_looping_workload_is_retried_with_growing_logged_delays
);

fn a_killed_container_is_restarted_and_its_exit_recorded(engine: Engine) {
    let (a, c) = a_running_b_stopped(engine, "sup");
    let daemon = a.run();
    let before = a.container("a", "r1");
    assert!(before.running);
    // B is explicitly stopped: someone starts its container behind our back and it
    // dies again; that exit is recorded but never "restarted".
    let b = a.container("b", "r1");
    a.docker(&["start", &b.id]);
    a.docker(&["kill", &b.id]);
    a.docker(&["kill", &before.id]);
    wait_until("the supervisor to restart A", READY, || {
        let now = a.container("a", "r1");
        now.running && now.started_at != before.started_at
    });
    assert_eq!(
        a.container("a", "r1").id,
        before.id,
        "restarted, not recreated"
    );
    daemon.stop();

    assert!(!a.container("b", "r1").running, "B stays stopped");
    let exits = a.events("workload_exited");
    let a_exit = exits
        .iter()
        .find(|e| e["workload"] == "a")
        .unwrap_or_else(|| panic!("no exit recorded for A: {exits:#?}"));
    assert_eq!(a_exit["exit_code"], 137, "SIGKILL: {a_exit}");
    assert!(exits.iter().any(|e| e["workload"] == "b"), "{exits:#?}");
    let restarts: Vec<_> = a
        .events("workload_started")
        .into_iter()
        .filter(|e| e["cause"] == "supervisor")
        .collect();
    assert!(!restarts.is_empty());
    assert!(
        restarts.iter().all(|e| e["workload"] == "a"),
        "{restarts:#?}"
    );
    let intent = a.intent();
    assert_eq!(
        intent["workloads"][format!("{}/b", c.ns)]["intent"],
        "stopped"
    );
}

/// Creates (not starts) a container labelled as `a`'s host's, workload `ghost` r1 in
/// namespace `ns`, which intent does not know; its name.
fn ghost(a: &capstan_tests::agent::Agent, ns: &str) -> String {
    let name = format!("capstan-ghost-{ns}");
    a.docker(&[
        "create",
        "--name",
        &name,
        "--network",
        "none",
        "--label",
        "io.capstan.managed=true",
        "--label",
        &format!("io.capstan.host={}", a.host),
        "--label",
        &format!("io.capstan.namespace={ns}"),
        "--label",
        "io.capstan.workload=ghost",
        "--label",
        "io.capstan.revision=r1",
        IMAGE,
        "true",
    ]);
    name
}

fn drift_is_reported_and_reaped_only_when_configured(engine: Engine) {
    let mut a = agent(engine, "drift").build();
    let c = a.commands(&a.host);
    a.apply_ok(&[c.ensure_namespace("ns")]);
    ghost(&a, &c.ns);

    a.run().stop();
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert_eq!(drift[0]["workload"], "ghost");
    assert_eq!(drift[0]["reaped"], false);
    assert_eq!(a.containers().len(), 1, "reported, not removed");
    // Intent holds no workload there, but a container of ours is left: the driver
    // itself refuses to delete the namespace.
    let applied = a.apply(&[c.delete_namespace("d1")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    assert_eq!(
        applied.results[0]["error"]["code"], "namespace_not_empty",
        "{applied}"
    );

    a.reconfigure(|b| b.reap_orphans(true));
    a.run().stop();
    // Every startup (the daemon's and `apply`'s) reports it; the last one reaped it.
    let drift = a.events("drift_detected");
    let (last, earlier) = drift.split_last().expect("drift events");
    assert_eq!(last["reaped"], true, "{drift:#?}");
    assert!(earlier.iter().all(|d| d["reaped"] == false), "{drift:#?}");
    assert!(a.containers().is_empty(), "reaped");
    a.apply_ok(&[c.delete_namespace("d2")]);
}

/// Docker-side `docker create` of a container labelled ours while the agent runs: no
/// exit, no startup, only the reconciler's look (every second here) can see it.
fn drift_made_while_the_agent_runs_is_seen_without_a_restart(engine: Engine) {
    let a = agent(engine, "look").reconcile_every(1).build();
    let c = a.commands(&a.host);
    a.apply_ok(&[c.ensure_namespace("ns")]);
    let daemon = a.run();
    let ghost = ghost(&a, &c.ns);
    let found = daemon.wait_for_line("the reconciler's look to find the drift", |l| {
        l["fields"]["message"] == "the reconciler found the host away from intent"
    });
    assert_eq!(found["fields"]["drift"], 1, "{found}");
    daemon.stop();
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert_eq!(drift[0]["workload"], "ghost");
    assert_eq!(drift[0]["reaped"], false);
    assert_eq!(a.containers().len(), 1, "reported, not removed");
    a.docker(&["rm", "-f", &ghost]);
}

fn a_crash_looping_workload_is_retried_with_growing_logged_delays(engine: Engine) {
    let a = agent(engine, "loop").build();
    let c = a.commands(&a.host);
    let crashy = |_: &str| Spec::docker(IMAGE).command(&["sh", "-c", "exit 3"]);
    a.apply_ok(&c.rollout(&["crashy"], "r1", crashy));
    let daemon = a.run();
    let delays: Vec<u64> = (1..=3u64)
        .map(|attempt| {
            let line = daemon.wait_for_line(&format!("restart attempt {attempt}"), |l| {
                l["fields"]["message"] == "restart scheduled" && l["fields"]["attempt"] == attempt
            });
            line["fields"]["delay_ms"].as_u64().expect("delay_ms")
        })
        .collect();
    assert_eq!(delays, [500, 1000, 2000], "capped exponential backoff");
    daemon.stop();

    let exits = a.events("workload_exited");
    assert!(exits.len() >= 3, "{exits:#?}");
    assert!(exits.iter().all(|e| e["exit_code"] == 3), "{exits:#?}");
    let restarts = a
        .events("workload_started")
        .into_iter()
        .filter(|e| e["cause"] == "supervisor")
        .count();
    // Three exits were handled; at most two came without the supervisor (the
    // activation's run and startup reconciliation's), so it restarted at least once.
    assert!(restarts >= 1, "restarts recorded: {restarts}");
    assert_eq!(
        a.intent()["workloads"][format!("{}/crashy", c.ns)]["intent"],
        "running",
        "restarts never change intent"
    );
}
