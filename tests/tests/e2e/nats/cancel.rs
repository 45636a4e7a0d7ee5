//! The controller's cancel over NATS (`POST /v1/commands/{id}/cancel`, `capstan
//! cancel`): it cuts a hook in flight short (the owner's call killed, the command
//! `cancelled`, retryable), keeps a command waiting behind it in its namespace from
//! ever beginning, leaves a command that is done as it is, and is refused for a
//! command the coordinator never took or for another host.

use super::Fleet;
use capstan_tests::hooks::Hook;
use capstan_tests::{unique, wait_until, READY};
use serde_json::Value;

fn kinds(status: &Value) -> Vec<&str> {
    status["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect()
}

#[test]
fn a_cancel_cuts_a_hook_in_flight_keeps_the_next_from_beginning_and_leaves_done_ones_alone() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    // The owner's grant for namespace `slow` never ends by itself.
    let body = "[ \"$phase\" = after_namespace_prepared ] || exit 0; \
                case \"$req\" in *'\"namespace\":\"slow\"'*) while :; do sleep 0.05; done;; esac";
    let host = unique("cancel");
    let h1 = fleet
        .agent(&host)
        .hook(
            Hook::new(
                "holder",
                &["after_namespace_prepared", "before_namespace_delete"],
                body,
            )
            .timeout(300.0),
        )
        .build();
    let daemon = h1.run();
    let slow = h1.commands("slow");
    let a1 = coordinator.submit(&slow.ensure_namespace("a1"));
    let a2 = coordinator.submit(&slow.ensure_namespace("a2"));
    let held = wait_until("a1 in its hook", READY, || {
        let s = coordinator.cli_json(&["status", &a1], 0);
        kinds(&s).contains(&"hook_started").then_some(s)
    });
    assert_eq!(held["status"], "running", "{held}");

    // a2 waits behind a1 in its namespace: cancelled there, it never begins.
    let queued = coordinator.cli_json(&["cancel", &a2], 0);
    assert_eq!(queued["command"]["status"], "pending", "{queued}");
    let a2_cancel = queued["cancel_id"].as_str().expect("a cancel was sent");
    assert!(a2_cancel.starts_with("cancel-"), "{queued}");
    let sent = coordinator.cli_json(&["cancel", &a1], 0);
    let a1_cancel = sent["cancel_id"].as_str().expect("a cancel was sent");
    assert_ne!(a1_cancel, a2_cancel);

    let done = coordinator.cli_json(&["wait", &a1, "--timeout", "60s"], 1);
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "cancelled", "{done}");
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "cancelled at the controller's request (cancel_command {a1_cancel}): "
        )),
        "{message}"
    );
    assert!(kinds(&done).contains(&"cancel_requested"), "{done}");
    let calls = std::fs::read_to_string(h1.path("calls-holder")).unwrap_or_default();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "after_namespace_prepared false",
            "before_namespace_delete true"
        ],
        "the cut call compensated"
    );
    let done = coordinator.cli_json(&["wait", &a2, "--timeout", "60s"], 1);
    assert_eq!(done["error"]["code"], "cancelled", "{done}");
    assert_eq!(
        done["error"]["message"],
        format!(
            "cancelled at the controller's request (cancel_command {a2_cancel}) before it began; nothing was done"
        )
    );
    assert_eq!(
        kinds(&done),
        ["cancel_requested", "command_received", "command_completed"]
    );
    for cancel in [a1_cancel, a2_cancel] {
        let s = coordinator.cli_json(&["status", cancel], 0);
        assert_eq!(s["status"], "succeeded", "{s}");
    }

    // Done: asked again, nothing is sent and nothing changes.
    let again = coordinator.cli_json(&["cancel", &a1], 0);
    assert_eq!(again["cancel_id"], Value::Null, "{again}");
    assert_eq!(again["command"]["status"], "failed", "{again}");
    let fast = coordinator.submit(&h1.commands("fast").ensure_namespace("b1"));
    let ok = coordinator.cli_json(&["wait", &fast, "--timeout", "60s"], 0);
    let cancelled = coordinator.cli_json(&["cancel", &fast], 0);
    assert_eq!(cancelled["cancel_id"], Value::Null, "{cancelled}");
    let after = coordinator.cli_json(&["status", &fast], 0);
    assert_eq!(after["events"], ok["events"], "nothing recorded about b1");

    // Refused: a command never submitted, and a cancel for another host.
    // An API error is exit 2, its code on stderr (`docs/nats.md`, *The CLI*).
    let out = coordinator.cli(&["cancel", "never-submitted"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("command_not_found"), "{stderr}");
    let other = serde_json::json!({"host": "elsewhere", "op": "cancel_command", "target": fast});
    let file = coordinator.write("other-host.json", &other.to_string());
    let out = coordinator.cli(&["submit", file.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid_command"), "{stderr}");
    daemon.stop();
    fleet.stop();
}
