//! Commands over NATS end to end: HTTP submit → coordinator → JetStream → agent →
//! log → CAPSTAN_EVT → HTTP status, including an agent that is down when the command
//! is sent, one killed between logging and acking, and two coordinators side by side.

use capstan_tests::nats::{
    command, wait_until, Coordinator, Keys, NatsAgent, NatsServer, ACTIVATE_WEB_R1, ENSURE_SHOP,
    PREPARE_WEB_R1,
};
use serde_json::Value;

fn kinds(status: &Value) -> Vec<String> {
    status["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn round_trip_and_offline_delivery() {
    let server = NatsServer::start();
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let mut agent = NatsAgent::start("h1", &server.url(), &keys.public, "");

    // Round trip: HTTP submit, result visible at /v1/commands/{id}.
    let id = coordinator.submit(&command(
        "h1",
        "ns-1",
        r#""op":"ensure_namespace","namespace":"shop""#,
    ));
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        kinds(&done),
        ["command_received", "namespace_ready", "command_completed"]
    );
    let status = coordinator.cli_json(&["status", &id], 0);
    assert_eq!(status["status"], "succeeded");
    assert!(status["events"][0]["command"]
        .as_str()
        .is_some_and(|c| !c.contains("sig")));

    // The registry shows the host alive; the intent comes from the agent.
    let hosts = wait_until("h1 in the registry", || {
        let v = coordinator.cli_json(&["hosts"], 0);
        (v["hosts"][0]["status"] == "alive").then_some(v)
    });
    assert_eq!(hosts["hosts"][0]["beat"]["drivers"][0], "sim");
    let intent = coordinator.cli_json(&["intent", "h1"], 0);
    assert!(intent["namespaces"]["shop"].is_object(), "{intent}");

    // Offline delivery: stopped agent, command submitted, agent started → it completes.
    agent.stop();
    let id = coordinator.submit(&command(
        "h1",
        "ns-2",
        r#""op":"ensure_namespace","namespace":"later""#,
    ));
    let pending = coordinator.cli_json(&["status", &id], 0);
    assert_eq!(pending["status"], "pending", "{pending}");
    agent.run(&[]);
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");

    // A failed command makes the CLI exit non-zero.
    let id = coordinator.submit(&command(
        "h1",
        "start-nothing",
        r#""op":"start_workload","namespace":"shop","workload":"ghost""#,
    ));
    let failed = coordinator.cli_json(&["wait", &id], 1);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["error"]["code"].is_string());

    // Unknown ids and bad input are JSON errors with codes.
    let out = coordinator.cli(&["status", "no-such-id"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("command_not_found"));
    let bad =
        capstan_tests::nats::temp_file(r#"{"host":"H1!","op":"ensure_namespace","namespace":"a"}"#);
    let out = coordinator.cli(&["submit", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_name"));
}

#[test]
fn redelivery_after_a_kill_between_log_and_ack_is_answered_from_the_log() {
    let server = NatsServer::start();
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let mut agent = NatsAgent::start("h1", &server.url(), &keys.public, "");
    coordinator.run_all("h1", &[("ns", ENSURE_SHOP), ("prep", PREPARE_WEB_R1)]);
    agent.stop();

    // Hold before the ack, then SIGKILL: the command is in the log, not acked.
    agent.run(&[("CAPSTAN_FAULT_HOLD_BEFORE_ACK", "1")]);
    let id = coordinator.submit(&command("h1", "act", ACTIVATE_WEB_R1));
    capstan_tests::nats::wait_for_line(
        &agent.log_file(agent.runs()),
        "holding before the ack of act",
    );
    agent.kill();
    assert_eq!(agent.sim_host()["revisions"]["shop/web@r1"]["starts"], 1);

    agent.run(&[]);
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    let log = capstan_tests::nats::wait_for_line(
        &agent.log_file(agent.runs()),
        "duplicate command answered from the log",
    );
    assert!(log.contains("command redelivered"), "{log}");
    // The effect happened once; the log holds one completion.
    assert_eq!(agent.sim_host()["revisions"]["shop/web@r1"]["starts"], 1);
    let completions = kinds(&done)
        .iter()
        .filter(|k| *k == "command_completed")
        .count();
    assert_eq!(completions, 1, "{done}");
}

#[test]
fn two_coordinators_serve_the_same_fleet() {
    let server = NatsServer::start();
    let keys = Keys::generate();
    let c1 = Coordinator::start(&server.url(), &keys, "");
    let c2 = Coordinator::start(&server.url(), &keys, "");
    let _h1 = NatsAgent::start("h1", &server.url(), &keys.public, "");
    let _h2 = NatsAgent::start("h2", &server.url(), &keys.public, "");

    let a = c1.submit(&command(
        "h1",
        "a",
        r#""op":"ensure_namespace","namespace":"one""#,
    ));
    let b = c2.submit(&command(
        "h2",
        "b",
        r#""op":"ensure_namespace","namespace":"two""#,
    ));
    for id in [&a, &b] {
        let from1 = c1.cli_json(&["wait", id], 0);
        let from2 = c2.cli_json(&["wait", id], 0);
        assert_eq!(from1, from2);
        assert_eq!(from1["status"], "succeeded");
    }
    let both_alive = |c: &Coordinator| {
        let v = c.cli_json(&["hosts"], 0);
        let hosts = v["hosts"].as_array().cloned().unwrap_or_default();
        (hosts.len() == 2 && hosts.iter().all(|h| h["status"] == "alive")).then_some(())
    };
    wait_until("both hosts alive at c1", || both_alive(&c1));
    wait_until("both hosts alive at c2", || both_alive(&c2));
    let e1 = c1.cli(&["log", "h2"]);
    let e2 = c2.cli(&["log", "h2"]);
    assert!(e1.status.success());
    assert_eq!(e1.stdout, e2.stdout);

    // A rollout through either coordinator.
    let template = capstan_tests::nats::temp_file(
        r#"{"id":"ro","op":"ensure_namespace","namespace":"three"}"#,
    );
    let summary = c2.cli_json(
        &["rollout", template.to_str().unwrap(), "--hosts", "h1,h2"],
        0,
    );
    assert_eq!(summary["succeeded"], 2, "{summary}");
    assert_eq!(c1.cli_json(&["status", "ro.h1"], 0)["status"], "succeeded");
}
