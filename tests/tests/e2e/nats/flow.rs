//! Commands over NATS end to end: HTTP submit → coordinator → JetStream → agent →
//! log → CAPSTAN_EVT → HTTP status, including an agent that is down when the command
//! is sent, one killed between logging and acking, and two coordinators side by side;
//! the first two also on per-host accounts.

use super::{shop, Fleet};
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
    round_trip(Fleet::start(), "host_unreachable: ");
}

/// The same on per-host accounts (`capstan-coordinator nats-config`): every part of
/// an agent's job goes through its account's imports (also in the smoke run against
/// the oldest supported nats-server).
#[test]
fn round_trip_and_offline_delivery_on_per_host_accounts() {
    round_trip(
        Fleet::with_accounts(&["h1"], "256M"),
        "host_not_found: host h9 has no account",
    );
}

/// `unknown_host`: what asking about a host without an agent (h9) says.
fn round_trip(fleet: Fleet, unknown_host: &str) {
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();

    // Round trip: HTTP submit, result visible at /v1/commands/{id}.
    let id = coordinator.submit(&h1.commands("shop").ensure_namespace("ns-1"));
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
    let hosts =
        coordinator.wait_for_hosts("h1 in the registry", |v| v["hosts"][0]["status"] == "alive");
    assert_eq!(hosts["hosts"][0]["beat"]["drivers"][0], "sim");
    let intent = coordinator.cli_json(&["intent", "h1"], 0);
    assert!(intent["namespaces"]["shop"].is_object(), "{intent}");

    // Offline delivery: stopped agent, command submitted, agent started → it completes.
    daemon.stop();
    let id = coordinator.submit(&h1.commands("later").ensure_namespace("ns-2"));
    let pending = coordinator.cli_json(&["status", &id], 0);
    assert_eq!(pending["status"], "pending", "{pending}");
    let daemon = h1.run();
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");

    // A failed command makes the CLI exit non-zero.
    let shop = h1.commands("shop");
    let id = coordinator.submit(&shop.start("start-nothing", "ghost"));
    let failed = coordinator.cli_json(&["wait", &id], 1);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "workload_not_found", "{failed}");
    assert_eq!(
        failed["error"]["message"],
        format!("workload {}/ghost is unknown", shop.ns),
        "{failed}"
    );

    // Unknown ids and bad input are JSON errors with codes.
    let out = coordinator.cli(&["status", "no-such-id"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("command_not_found"));
    let bad = coordinator.write(
        "bad.json",
        r#"{"host":"H1!","op":"ensure_namespace","namespace":"a"}"#,
    );
    let out = coordinator.cli(&["submit", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_name"));

    // A command for a host nobody registered (a misspelt name) is refused at once,
    // not queued for days; asked to, it is queued for a host being provisioned (on
    // per-host accounts only one with an account: h9 has none).
    let typo = coordinator.write(
        "typo.json",
        r#"{"id":"typo","host":"h9","op":"ensure_namespace","namespace":"a"}"#,
    );
    let typo = typo.to_str().unwrap();
    for args in [&["submit", typo][..], &["submit", typo, "--wait"]] {
        let out = coordinator.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("host_not_found"), "{args:?}: {stderr}");
    }
    let out = coordinator.cli(&["status", "typo"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("command_not_found"));
    let queued = coordinator.cli(&["submit", typo, "--queue-unknown-host"]);
    let stderr = String::from_utf8_lossy(&queued.stderr);
    if unknown_host.starts_with("host_not_found") {
        assert_eq!(queued.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("has no account"), "{stderr}");
    } else {
        assert_eq!(queued.status.code(), Some(0), "{stderr}");
        assert_eq!(
            coordinator.cli_json(&["status", "typo"], 0)["status"],
            "pending"
        );
    }

    // The host's log is what it published; a host nobody serves cannot be verified.
    let verdict = coordinator.cli_json(&["verify", "h1"], 0);
    assert_eq!(verdict["result"], "ok", "{verdict}");
    let out = coordinator.cli(&["verify", "h9"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(unknown_host), "{stderr}");
    daemon.stop();
    fleet.stop();
}

#[test]
fn redelivery_after_a_kill_between_log_and_ack_is_answered_from_the_log() {
    redelivery(Fleet::start());
}

#[test]
fn redelivery_after_a_kill_between_log_and_ack_on_per_host_accounts() {
    redelivery(Fleet::with_accounts(&["h1"], "256M"));
}

fn redelivery(fleet: Fleet) {
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    let mut lines = shop(&h1, true);
    let activate = lines.pop().expect("the activation");
    coordinator.run_all(&lines);
    daemon.stop();

    // Hold before the ack, then SIGKILL: the command is in the log, not acked.
    let daemon = h1.run_with(&[], &[("CAPSTAN_FAULT_HOLD_BEFORE_ACK", "1")]);
    let id = coordinator.submit(&activate);
    daemon.wait_for_text("holding before the ack of act");
    daemon.kill();
    assert_eq!(h1.sim_host()["revisions"]["shop/web@r1"]["starts"], 1);

    // The new process re-creates its consumer, which hands the unacked command over
    // again at once (not after the ack wait).
    let daemon = h1.run();
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    daemon.wait_for_text("duplicate command answered from the log");
    // The effect happened once; the log holds one completion.
    assert_eq!(h1.sim_host()["revisions"]["shop/web@r1"]["starts"], 1);
    let completions = kinds(&done)
        .iter()
        .filter(|k| *k == "command_completed")
        .count();
    assert_eq!(completions, 1, "{done}");
    daemon.stop();
    fleet.stop();
}

#[test]
fn two_coordinators_serve_the_same_fleet() {
    let fleet = Fleet::start();
    let c2 = fleet.coordinator();
    let c1 = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let h2 = fleet.agent("h2").build();
    let daemons = [h1.run(), h2.run()];

    let a = c1.submit(&h1.commands("one").ensure_namespace("a"));
    let b = c2.submit(&h2.commands("two").ensure_namespace("b"));
    for id in [&a, &b] {
        let from1 = c1.cli_json(&["wait", id], 0);
        let from2 = c2.cli_json(&["wait", id], 0);
        assert_eq!(from1, from2);
        assert_eq!(from1["status"], "succeeded");
    }
    let both_alive = |v: &Value| {
        v["hosts"]
            .as_array()
            .is_some_and(|h| h.len() == 2 && h.iter().all(|h| h["status"] == "alive"))
    };
    c1.wait_for_hosts("both hosts alive at c1", both_alive);
    c2.wait_for_hosts("both hosts alive at c2", both_alive);
    assert_eq!(c1.events("h2"), c2.events("h2"));

    // A rollout through either coordinator.
    let template = c2.write(
        "template.json",
        r#"{"id":"ro","op":"ensure_namespace","namespace":"three"}"#,
    );
    let summary = c2.cli_json(
        &["rollout", template.to_str().unwrap(), "--hosts", "h1,h2"],
        0,
    );
    assert_eq!(summary["succeeded"], 2, "{summary}");
    assert_eq!(c1.cli_json(&["status", "ro.h1"], 0)["status"], "succeeded");
    // A host the API refuses a command for is a result of its own, not the end of the
    // rollout.
    let template = c2.write(
        "template2.json",
        r#"{"id":"ro2","op":"ensure_namespace","namespace":"four"}"#,
    );
    let template = template.to_str().unwrap();
    let summary = c2.cli_json(&["rollout", template, "--hosts", "h1,Not_A_Host,h2"], 1);
    assert_eq!(summary["succeeded"], 2, "{summary}");
    let refused = &summary["results"][0];
    assert_eq!(refused["host"], "Not_A_Host", "{summary}");
    assert_eq!(refused["status"], "unsubmitted", "{summary}");
    assert_eq!(refused["error"]["code"], "invalid_name", "{summary}");

    // A file of several commands runs whole, in order, on each host; a host the
    // coordinator does not know is named, and gets none of them.
    let steps = c2.write(
        "steps.json",
        r#"[{"id":"st-ns","op":"ensure_namespace","namespace":"five"},
            {"id":"st-del","op":"delete_namespace","namespace":"five"},
            {"op":"ensure_namespace","namespace":"six"}]"#,
    );
    let steps = steps.to_str().unwrap();
    let summary = c2.cli_json(&["rollout", steps, "--hosts", "h1,h2,h3-typo"], 1);
    let counts = [
        &summary["total"],
        &summary["succeeded"],
        &summary["commands"],
    ];
    assert_eq!(counts, [3, 2, 3], "{summary}");
    for (i, host) in ["h1", "h2"].iter().enumerate() {
        let result = &summary["results"][i];
        assert_eq!(result["host"], *host, "{summary}");
        assert_eq!(result["step"], 3, "{summary}");
        assert_eq!(result["status"], "succeeded", "{summary}");
        // The third command has no id of its own: the rollout's, numbered.
        let id = result["id"].as_str().unwrap_or_default();
        assert!(
            id.starts_with("rollout-") && id.ends_with(&format!("-3.{host}")),
            "{summary}"
        );
        for id in [format!("st-ns.{host}"), format!("st-del.{host}")] {
            assert_eq!(
                c1.cli_json(&["status", &id], 0)["status"],
                "succeeded",
                "{id}"
            );
        }
    }
    let unknown = &summary["results"][2];
    assert_eq!(unknown["host"], "h3-typo", "{summary}");
    assert_eq!(unknown["step"], 1, "{summary}");
    assert_eq!(unknown["status"], "unsubmitted", "{summary}");
    assert_eq!(unknown["error"]["code"], "host_not_found", "{summary}");

    for daemon in daemons {
        daemon.stop();
    }
    c2.stop();
    fleet.stop();
}

/// A command's `deadline` travels signed through the coordinator: one delivered to an
/// agent that was down until after it is recorded and not begun; one with time left
/// runs.
#[test]
fn a_command_delivered_past_its_deadline_is_not_begun() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent(&capstan_tests::unique("deadline")).build();
    let c = h1.commands("shop");
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(200);
    let late = c
        .ensure_namespace("late")
        .with("deadline", soon.to_rfc3339());
    let id = coordinator.submit(&late);
    // Started only once the deadline is behind it.
    let behind = (soon - chrono::Utc::now()).to_std().unwrap_or_default();
    std::thread::sleep(behind);
    let daemon = h1.run();
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 1);
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "cancelled", "{done}");
    assert_eq!(kinds(&done), ["command_received", "command_completed"]);
    assert!(done["events"][0]["command"]
        .as_str()
        .is_some_and(|c| c.contains(r#""deadline":"#)));
    let later = chrono::Utc::now() + chrono::Duration::seconds(60);
    let ok = c
        .ensure_namespace("in-time")
        .with("deadline", later.to_rfc3339());
    let id = coordinator.submit(&ok);
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    daemon.stop();
    fleet.stop();
}
