//! The restart contract with the docker driver (it manages lifecycle): a graceful
//! agent stop stops running-intent containers without changing intent, startup starts
//! them again (the same containers), explicitly stopped ones stay stopped,
//! leave-running adopts without restarting, and a missing container marks the
//! workload failed while the rest carries on.

use super::a_running_b_stopped;
use capstan_tests::agent::Agent;
use capstan_tests::docker::{agent, serve, Engine};
use serde_json::Value;

capstan_tests::each_engine!(
    gateway_restart_stops_on_sigterm_and_restarts_the_same_container,
    leave_running_keeps_containers_up_and_adopts_them,
    a_missing_container_marks_the_workload_failed_and_the_rest_starts
);

/// The parts of intent the controller owns (not `applied_seq`, which moves with every
/// record the agent adds).
fn owned_intent(a: &Agent) -> (Value, Value) {
    let i = a.intent();
    (i["namespaces"].clone(), i["workloads"].clone())
}

fn gateway_restart_stops_on_sigterm_and_restarts_the_same_container(engine: Engine) {
    let (a, c) = a_running_b_stopped(engine, "gw");
    let intent = owned_intent(&a);
    assert_eq!(intent.1[format!("{}/a", c.ns)]["intent"], "running");
    assert_eq!(intent.1[format!("{}/b", c.ns)]["intent"], "stopped");

    let daemon = a.run();
    let a1 = a.container("a", "r1");
    assert!(a1.running, "A runs under the agent");
    assert!(!a.container("b", "r1").running, "B stays stopped");

    let said = daemon.stop();
    assert!(
        !a.container("a", "r1").running,
        "SIGTERM stops A's container: {said}"
    );
    assert_eq!(owned_intent(&a), intent, "a shutdown never changes intent");

    let daemon = a.run();
    let a2 = a.container("a", "r1");
    assert!(a2.running, "A runs again after the restart");
    assert_eq!(a2.id, a1.id, "the same container, not a new one");
    assert!(!a.container("b", "r1").running, "B stays stopped");
    daemon.stop();
    assert_eq!(owned_intent(&a), intent);
    let startup: Vec<Value> = a
        .events("workload_started")
        .into_iter()
        .filter(|e| e["cause"] == "agent_startup")
        .collect();
    assert_eq!(
        startup.len(),
        1,
        "only A was started at startup: {startup:?}"
    );
    assert_eq!(startup[0]["workload"], "a");
    let stopped: Vec<Value> = a
        .events("workload_stopped")
        .into_iter()
        .filter(|e| e["cause"] == "agent_shutdown")
        .collect();
    assert_eq!(stopped.len(), 2, "one per SIGTERM, A only: {stopped:?}");
    assert!(stopped.iter().all(|e| e["workload"] == "a"), "{stopped:?}");
}

fn leave_running_keeps_containers_up_and_adopts_them(engine: Engine) {
    let a = agent(engine, "lr").build();
    a.apply_ok(&a.commands(&a.host).rollout(&["web"], "r1", serve));
    let daemon = a.run_with(&["--leave-running"], &[]);
    let before = a.container("web", "r1");
    assert!(before.running);
    daemon.stop();

    let during = a.container("web", "r1");
    assert!(during.running, "leave-running stops nothing");
    assert_eq!(during.started_at, before.started_at);

    let daemon = a.run();
    let after = a.container("web", "r1");
    assert!(after.running);
    assert_eq!(after.id, before.id, "adopted, not recreated");
    assert_eq!(
        after.started_at, before.started_at,
        "adopted, not restarted"
    );
    daemon.stop();
    assert_eq!(
        a.events("workload_started").len(),
        1,
        "only the activation started it"
    );
    assert!(
        a.events("drift_detected").is_empty(),
        "it is known, not drift"
    );
}

fn a_missing_container_marks_the_workload_failed_and_the_rest_starts(engine: Engine) {
    let a = agent(engine, "miss").build();
    let c = a.commands(&a.host);
    a.apply_ok(&c.rollout(&["a", "c"], "r1", serve));
    a.run().stop();
    let gone = a.container("a", "r1");
    a.docker(&["rm", "-f", &gone.id]);

    let daemon = a.run();
    assert!(a.container("c", "r1").running, "C starts despite A");
    daemon.stop();
    let failed = a.events("workload_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["workload"], "a");
    assert_eq!(failed[0]["code"], "backend_missing");
    let intent = a.intent();
    let w = &intent["workloads"][format!("{}/a", c.ns)];
    assert_eq!(w["intent"], "running", "failure does not change intent");
    assert_eq!(w["failed"], "backend_missing");
}
