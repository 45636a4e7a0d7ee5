//! Supervision and drift with the docker driver: an exit is recorded with its code
//! and a running-intent workload is started again (an explicitly stopped one is
//! not); a container labelled as ours that intent does not know is reported, keeps
//! its namespace from being deleted, and is removed only with `reap_orphans = true`.

use capstan_tests::docker::{docker, message, wait_until, DockerAgent, IMAGE};

#[test]
fn a_killed_container_is_restarted_and_its_exit_recorded() {
    let a = DockerAgent::new("sup");
    a.apply_ok(
        "setup.jsonl",
        &[
            a.ensure_ns("ns"),
            a.prepare("pa", "a", "r1"),
            a.activate("aa", "a", "r1"),
            a.prepare("pb", "b", "r1"),
            a.activate("ab", "b", "r1"),
            a.op("sb", "stop_workload", "b", ""),
        ],
    );
    let daemon = a.run(&[]);
    let before = a.container("a", "r1");
    assert!(before.running);
    // B is explicitly stopped: someone starts its container behind our back and it
    // dies again; that exit is recorded but never "restarted".
    let b = a.container("b", "r1");
    docker(&["start", &b.id]);
    docker(&["kill", &b.id]);
    docker(&["kill", &before.id]);
    wait_until("the supervisor to restart A", || {
        let now = a.container("a", "r1");
        now.running && now.started_at != before.started_at
    });
    assert_eq!(
        a.container("a", "r1").id,
        before.id,
        "restarted, not recreated"
    );
    daemon.terminate();

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
    let intent = a.agent.intent();
    assert_eq!(
        intent["workloads"][format!("{}/b", a.ns)]["intent"],
        "stopped"
    );
}

#[test]
fn drift_is_reported_and_reaped_only_when_configured() {
    let a = DockerAgent::new("drift");
    a.apply_ok("setup.jsonl", &[a.ensure_ns("ns")]);
    let ghost = format!("capstan-ghost-{}", a.ns);
    docker(&[
        "create",
        "--name",
        &ghost,
        "--network",
        "none",
        "--label",
        "io.capstan.managed=true",
        "--label",
        &format!("io.capstan.host={}", a.host()),
        "--label",
        &format!("io.capstan.namespace={}", a.ns),
        "--label",
        "io.capstan.workload=ghost",
        "--label",
        "io.capstan.revision=r1",
        IMAGE,
        "true",
    ]);

    a.run(&[]).terminate();
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert_eq!(drift[0]["workload"], "ghost");
    assert_eq!(drift[0]["reaped"], false);
    assert_eq!(a.containers().len(), 1, "reported, not removed");
    // Intent holds no workload there, but a container of ours is left: the driver
    // itself refuses to delete the namespace.
    let delete = |id: &str| {
        a.line(
            id,
            &format!(r#""op":"delete_namespace","namespace":"{}""#, a.ns),
        )
    };
    let (status, results) = a.apply("delete.jsonl", &[delete("d1")]);
    assert!(!status.success());
    assert_eq!(
        results[0]["error"]["code"], "namespace_not_empty",
        "{results:?}"
    );

    a.configure(true);
    a.run(&[]).terminate();
    // Every startup (the daemon's and `apply`'s) reports it; the last one reaped it.
    let drift = a.events("drift_detected");
    let (last, earlier) = drift.split_last().expect("drift events");
    assert_eq!(last["reaped"], true, "{drift:#?}");
    assert!(earlier.iter().all(|d| d["reaped"] == false), "{drift:#?}");
    assert!(a.containers().is_empty(), "reaped");
    a.apply_ok("delete2.jsonl", &[delete("d2")]);
}

#[test]
fn a_crash_looping_workload_is_retried_with_growing_logged_delays() {
    let a = DockerAgent::new("loop");
    a.apply_ok(
        "setup.jsonl",
        &[
            a.ensure_ns("ns"),
            a.op(
                "p",
                "prepare_revision",
                "crashy",
                &format!(
                    r#""revision":"r1","spec":{{"driver":"docker","image":"{IMAGE}","command":["sh","-c","exit 3"]}}"#
                ),
            ),
            a.op("a", "activate_revision", "crashy", r#""revision":"r1""#),
        ],
    );
    let daemon = a.run(&[]);
    let scheduled = |attempt: u64| {
        daemon.wait_for(&format!("restart attempt {attempt}"), |l| {
            message(l) == "restart scheduled" && l["fields"]["attempt"] == attempt
        })
    };
    let delays: Vec<u64> = (1..=3)
        .map(|n| {
            scheduled(n)["fields"]["delay_ms"]
                .as_u64()
                .expect("delay_ms")
        })
        .collect();
    assert_eq!(delays, [500, 1000, 2000], "capped exponential backoff");
    daemon.terminate();

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
        a.agent.intent()["workloads"][format!("{}/crashy", a.ns)]["intent"],
        "running",
        "restarts never change intent"
    );
}
