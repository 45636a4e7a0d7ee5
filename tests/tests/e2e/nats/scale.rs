//! The control path under many commands: results read in one get, agents with many
//! commands in flight, one namespace at a time in order.

use super::Fleet;
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::hooks::Hook;
use capstan_tests::nats::runtime;
use capstan_tests::{wait_until, READY};
use futures::{stream, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;

/// How long the coordinator waits for each command (`/wait?timeout=`).
const WAIT: Duration = Duration::from_secs(120);

/// POSTs `commands` (8 at a time); their ids, in order.
async fn submit_all(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    commands: &[Cmd],
) -> Vec<String> {
    stream::iter(commands)
        .map(|c| async move {
            let body = c.clone().without("issued_at").to_string();
            let answer: Value = http
                .post(format!("{base}/v1/commands"))
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("POST")
                .json()
                .await
                .expect("JSON");
            answer["id"]
                .as_str()
                .unwrap_or_else(|| panic!("{answer}"))
                .to_string()
        })
        .buffered(8)
        .collect()
        .await
}

/// Waits for each id (8 at a time); the answers, in order.
async fn wait_all(http: &reqwest::Client, base: &str, token: &str, ids: &[String]) -> Vec<Value> {
    stream::iter(ids)
        .map(|id| async move {
            http.get(format!(
                "{base}/v1/commands/{id}/wait?timeout={}s",
                WAIT.as_secs()
            ))
            // The server's own wait, and a margin for its answer.
            .timeout(WAIT + READY)
            .bearer_auth(token)
            .send()
            .await
            .expect("GET wait")
            .json::<Value>()
            .await
            .expect("JSON")
        })
        .buffered(8)
        .collect()
        .await
}

fn kinds(status: &Value) -> Vec<&str> {
    status["events"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| e["kind"].as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn a_thousand_commands_to_one_host_are_each_answered_once_and_correctly() {
    let fleet = Fleet::start();
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    // 16 namespaces, each made ready first, then workloads prepared in it: a
    // preparation before its namespace is ready would fail, so order shows too.
    let mut commands = Vec::new();
    for i in 0..1000 {
        let c = h1.commands(&format!("ns{:02}", i % 16));
        commands.push(if i < 16 {
            c.ensure_namespace(&format!("c{i:04}"))
        } else {
            c.prepare(&format!("c{i:04}"), &format!("w{i:04}"), "r1", Spec::sim())
        });
    }
    let coordinator = &fleet.coordinator;
    let answers = runtime().block_on(async {
        // Every request bounded (connect to last body byte).
        let http = reqwest::Client::builder()
            .timeout(READY)
            .build()
            .expect("HTTP client");
        let ids = submit_all(&http, &coordinator.url, &coordinator.token, &commands).await;
        assert_eq!(ids.len(), 1000);
        wait_all(&http, &coordinator.url, &coordinator.token, &ids).await
    });
    for (command, answer) in commands.iter().zip(&answers) {
        let id = command.id();
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["host"], "h1", "{answer}");
        assert_eq!(answer["status"], "succeeded", "{answer}");
        assert_eq!(answer["done"], true, "{answer}");
        let effect = if id < "c0016" {
            "namespace_ready"
        } else {
            "revision_prepared"
        };
        assert_eq!(
            kinds(answer),
            ["command_received", effect, "command_completed"],
            "{answer}"
        );
        assert!(
            answer["events"]
                .as_array()
                .expect("events")
                .iter()
                .all(|e| e["command_id"] == id && e["host"] == "h1"),
            "{answer}"
        );
    }
    // A status read now is the same answer as the wait's.
    let again = coordinator.cli_json(&["status", "c0999"], 0);
    assert_eq!(again, answers[999]);
    daemon.stop();
    // The agent carried each out once.
    let received = h1.events("command_received");
    assert_eq!(received.len(), 1000);
    fleet.stop();
}

#[test]
fn a_namespace_waits_for_its_own_commands_only() {
    let fleet = Fleet::start();
    // The hook holds namespace `slow` until the test opens the gate.
    let gate = "gate-slow";
    let body = format!(
        "[ \"$phase\" = after_namespace_prepared ] || exit 0; case \"$req\" in *'\"namespace\":\"slow\"'*) \
           while [ ! -e \"$(dirname \"$0\")/{gate}\" ]; do sleep 0.05; done;; esac"
    );
    let h1 = fleet
        .agent("h1")
        .hook(
            Hook::new(
                "holder",
                &["after_namespace_prepared", "before_namespace_delete"],
                &body,
            )
            .timeout(120.0),
        )
        .build();
    let daemon = h1.run();
    let coordinator = &fleet.coordinator;
    let slow = h1.commands("slow");
    let fast = h1.commands("fast");
    let a1 = coordinator.submit(&slow.ensure_namespace("a1"));
    let a2 = coordinator.submit(&slow.prepare("a2", "web", "r1", Spec::sim()));
    let b1 = coordinator.submit(&fast.ensure_namespace("b1"));
    let b2 = coordinator.submit(&fast.prepare("b2", "web", "r1", Spec::sim()));
    // B's commands finish while A's hook still holds a1 …
    for id in [&b1, &b2] {
        let done = coordinator.cli_json(&["wait", id, "--timeout", "60s"], 0);
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    let held = wait_until("a1 in its hook", READY, || {
        let s = coordinator.cli_json(&["status", &a1], 0);
        kinds(&s).contains(&"hook_started").then_some(s)
    });
    assert_eq!(held["status"], "running", "{held}");
    // … and a2, behind a1 in namespace `slow`, has not begun.
    let waiting = coordinator.cli_json(&["status", &a2], 0);
    assert_eq!(waiting["status"], "pending", "{waiting}");
    std::fs::write(h1.path(gate), "").expect("open the gate");
    for id in [&a1, &a2] {
        let done = coordinator.cli_json(&["wait", id, "--timeout", "60s"], 0);
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    // In the host's records, a2 was received only after a1 completed.
    let log = coordinator.events("h1");
    let at = |kind: &str, id: &str| {
        log.iter()
            .position(|r| r["kind"] == kind && r["command_id"] == id)
            .unwrap_or_else(|| panic!("no {kind} of {id}: {}", json!(log)))
    };
    assert!(at("command_completed", &a1) < at("command_received", &a2));
    assert!(at("command_completed", &b2) < at("command_completed", &a1));
    daemon.stop();
    fleet.stop();
}
