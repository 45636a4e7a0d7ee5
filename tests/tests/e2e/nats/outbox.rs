//! The outbox's alarm (`docs/nats.md`, *outbox*): a `duplicate` publish ack — which an
//! outbox that sends no message ids never gets unless someone interferes with the
//! stream — is an error log and `outbox_alarm` in `status` and the heartbeat, and the
//! record is published again: stored once, the stream without a gap.

use super::Fleet;
use capstan_tests::nats::runtime;
use serde_json::Value;

/// The message id record 2 is sent with (test builds: `CAPSTAN_FAULT_MSG_ID_AT`).
const ID: &str = "capstan-e2e-duplicate";

#[test]
fn a_duplicate_publish_ack_is_an_alarm_and_the_record_is_stored_once_all_the_same() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run_with(&[], &[("CAPSTAN_FAULT_MSG_ID_AT", &format!("2:{ID}"))]);

    // A message under that id, on another subject of the event stream (JetStream
    // de-duplicates ids across the whole stream), once the agent made the stream.
    let rt = runtime();
    let url = fleet.server.url();
    let js = rt.block_on(async {
        async_nats::jetstream::new(async_nats::connect(&url).await.expect("connect"))
    });
    capstan_tests::wait_until("the event stream", capstan_tests::READY, || {
        rt.block_on(js.get_stream("CAPSTAN_EVT")).is_ok()
    });
    let ack = rt.block_on(async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, ID);
        js.publish_with_headers("capstan.v1.evt.elsewhere", headers, "{}".into())
            .await
            .expect("publish")
            .await
            .expect("stored")
    });
    assert!(!ack.duplicate, "the first message under {ID}");

    // Records 1 to 3: command_received, namespace_ready, command_completed. Record 2
    // goes out under the id: the server answers `duplicate` and stores nothing.
    let id = coordinator.submit(&h1.commands("shop").ensure_namespace("ns"));
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    daemon.wait_for_text(&format!("record 2 sent with Nats-Msg-Id {ID}"));
    daemon.wait_for_text("ALARM: unexpected duplicate publish ack");

    // Stored all the same, once: the host's records in CAPSTAN_EVT are 1, 2, 3.
    let events = coordinator.events("h1");
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, [1, 2, 3], "{events:?}");
    assert_eq!(events[1]["kind"], "namespace_ready", "{events:?}");

    // The alarm is in the heartbeat and in `status`, naming the record.
    let alarm = |v: &Value| {
        v.as_str()
            .is_some_and(|a| a.contains("record 2") && a.contains("duplicate"))
    };
    coordinator.wait_for_hosts("h1's heartbeat to carry the alarm", |hosts| {
        hosts["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|h| h["host"] == "h1" && alarm(&h["beat"]["outbox_alarm"]))
    });
    let status = coordinator.host_status("h1");
    assert!(alarm(&status["outbox_alarm"]), "{status}");
    daemon.stop();
    fleet.stop();
}
