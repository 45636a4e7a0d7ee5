//! Confinement with the shipped permissions (`packaging/nats-server.conf`): agent h1,
//! inside its own subjects, tries to harm h2 — suppress its events with message ids,
//! purge or forge heartbeats, fill the store — and h2's events, beats and commands
//! are unaffected.

use super::auth::{shipped_config, AS_COORDINATOR};
use super::Fleet;
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use capstan_tests::agent::Agent;
use capstan_tests::nats::{runtime, Coordinator};
use capstan_tests::{wait_until, READY};
use serde_json::{json, Value};

fn shipped_fleet() -> Fleet {
    Fleet::start_with(Some(&shipped_config()), "", AS_COORDINATOR)
}

async fn connect(fleet: &Fleet, user: &str, password: &str) -> jetstream::Context {
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .custom_inbox_prefix(format!("_INBOX_{user}"))
        .connect(fleet.server.url())
        .await
        .expect("connect");
    jetstream::new(client)
}

async fn as_h1(fleet: &Fleet) -> jetstream::Context {
    connect(fleet, "h1", "change-me-h1").await
}

async fn as_coordinator(fleet: &Fleet) -> jetstream::Context {
    connect(fleet, "coordinator", "change-me-coordinator").await
}

/// The current config of stream `name`.
async fn config(js: &jetstream::Context, name: &str) -> stream::Config {
    js.get_stream(name)
        .await
        .expect("stream")
        .cached_info()
        .config
        .clone()
}

/// Puts `body` under h1's own key of `capstan_hosts`, as h1.
fn put_as_h1(fleet: &Fleet, body: Vec<u8>) {
    runtime().block_on(async {
        let js = as_h1(fleet).await;
        publish(&js, "$KV.capstan_hosts.h1", &[], body)
            .await
            .expect("h1 may put its own key");
    });
}

/// A JetStream publish with `headers`; the server's answer.
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<jetstream::publish::PublishAck, String> {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.insert(*k, *v);
    }
    match js
        .publish_with_headers(subject.to_string(), map, body.into())
        .await
    {
        Ok(ack) => ack.await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// h2 runs a command; every record of its log is in CAPSTAN_EVT, seq 1, 2, … in
/// order, and its beat is alive without an outbox alarm.
fn h2_is_unaffected(fleet: &Fleet, h2: &Agent, name: &str) {
    let coordinator = &fleet.coordinator;
    coordinator.run_all(&[h2.commands(name).ensure_namespace(name)]);
    let applied = coordinator.cli_json(&["intent", "h2"], 0)["applied_seq"]
        .as_u64()
        .expect("applied_seq");
    let events = wait_until("h2's records in CAPSTAN_EVT", READY, || {
        let events = coordinator.events("h2");
        (events.last().and_then(|e| e["seq"].as_u64()) >= Some(applied)).then_some(events)
    });
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "h2's records, in order, none missing");
    coordinator.wait_for_hosts("h2 alive", |v| {
        v["hosts"].as_array().is_some_and(|hosts| {
            hosts.iter().any(|h| {
                h["host"] == "h2" && h["status"] == "alive" && h["beat"]["outbox_alarm"].is_null()
            })
        })
    });
}

#[test]
fn with_the_shipped_permissions_h1_cannot_suppress_h2s_events_with_message_ids() {
    let fleet = shipped_fleet();
    let h2 = fleet.agent("h2").nats_user("h2", "change-me-h2").build();
    // On its own subject, h1 publishes messages carrying the message ids h2's
    // records would have (`h2:<seq>`, and the bare seq for good measure).
    runtime().block_on(async {
        let js = as_h1(&fleet).await;
        for n in 1..=20u64 {
            for id in [format!("h2:{n}"), n.to_string()] {
                let body = json!({"host": "h1", "seq": n}).to_string().into_bytes();
                publish(&js, "capstan.v1.evt.h1", &[("Nats-Msg-Id", &id)], body)
                    .await
                    .expect("h1 may publish on its own subject");
            }
        }
        // What the outbox relies on instead: a publish that expects the subject to be
        // empty (or at another message than its last) is refused.
        let body = json!({"host": "h1", "seq": 41}).to_string().into_bytes();
        for expected in ["0", "1"] {
            let refused = publish(
                &js,
                "capstan.v1.evt.h1",
                &[("Nats-Expected-Last-Subject-Sequence", expected)],
                body.clone(),
            )
            .await;
            assert!(refused.is_err(), "expected {expected}: {refused:?}");
        }
    });
    let daemon = h2.run();
    h2_is_unaffected(&fleet, &h2, "theirs");
    daemon.stop();
    fleet.stop();
}

#[test]
fn with_the_shipped_permissions_h1_cannot_forge_h2s_results_or_take_its_commands() {
    let fleet = shipped_fleet();
    let h2 = fleet.agent("h2").nats_user("h2", "change-me-h2").build();
    let daemon = h2.run();
    let coordinator = &fleet.coordinator;
    let id = coordinator.submit(&h2.commands("mine").ensure_namespace("n-1"));
    let done = coordinator.cli_json(&["wait", &id, "--timeout", "60s"], 0);
    assert_eq!(done["status"], "succeeded", "{done}");
    runtime().block_on(async {
        let js = as_h1(&fleet).await;
        // h2's result entry, its progress, and a result for a command still to come.
        let forged = json!({"id": "n-1", "host": "h2", "status": "failed", "done": true,
            "error": null, "events": []});
        for key in [
            capstan_common::wire::result_key("h2", "n-1"),
            "h2._progress".to_string(),
            capstan_common::wire::result_key("h2", "n-2"),
        ] {
            let put = publish(
                &js,
                &format!("$KV.capstan_results.{key}"),
                &[],
                forged.to_string().into_bytes(),
            )
            .await;
            assert!(put.is_err(), "h1 put {key}: {put:?}");
        }
        // Nor may h1 delete (or re-create) h2's command consumer.
        let stream = js.get_stream("CAPSTAN_CMD").await;
        let refused = match stream {
            Ok(s) => s
                .delete_consumer("agent-h2")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        assert!(refused.is_err(), "h1 deleted h2's consumer");
    });
    // h2's answer is still its own, and h2 still takes commands.
    assert_eq!(coordinator.cli_json(&["status", &id], 0), done);
    h2_is_unaffected(&fleet, &h2, "after");
    daemon.stop();
    fleet.stop();
}

/// A heartbeat body as an agent writes it.
fn beat(host: &str, at: chrono::DateTime<chrono::Utc>) -> Vec<u8> {
    json!({"host": host, "version": "0", "drivers": ["sim"], "capabilities": {},
           "last_seq": 1, "healthy": true, "at": at})
    .to_string()
    .into_bytes()
}

#[test]
fn with_the_shipped_permissions_h1_cannot_purge_or_forge_heartbeats() {
    let fleet = shipped_fleet();
    let h2 = fleet.agent("h2").nats_user("h2", "change-me-h2").build();
    let daemon = h2.run();
    fleet
        .coordinator
        .wait_for_hosts("h2 alive", |v| v["hosts"][0]["status"] == "alive");

    // Buckets and the event stream made by an older version (rollups and purges
    // allowed, no limits; a stream's deny_purge cannot be turned off, so they are
    // made again) are brought up to date by the next coordinator.
    runtime().block_on(async {
        let js = as_coordinator(&fleet).await;
        for (name, old) in [
            ("KV_capstan_hosts", true),
            ("KV_capstan_commands", true),
            ("CAPSTAN_EVT", false),
        ] {
            let mut config = config(&js, name).await;
            config.allow_rollup = old;
            config.deny_purge = false;
            config.deny_delete = old;
            config.max_message_size = -1;
            config.max_bytes = -1;
            if name == "CAPSTAN_EVT" {
                config.max_messages_per_subject = -1;
            }
            js.delete_stream(name).await.expect("delete");
            js.create_stream(config).await.expect("an old-style stream");
        }
        let mut cmd = config(&js, "CAPSTAN_CMD").await;
        cmd.max_bytes = -1;
        cmd.max_message_size = -1;
        cmd.discard = stream::DiscardPolicy::Old;
        js.update_stream(&cmd)
            .await
            .expect("an old-style CAPSTAN_CMD");
    });
    let second = Coordinator::start(&fleet.server.url(), &fleet.keys, AS_COORDINATOR);
    fleet
        .coordinator
        .wait_for_hosts("h2 alive again", |v| v["hosts"][0]["status"] == "alive");
    runtime().block_on(async {
        let js = as_coordinator(&fleet).await;
        for name in ["KV_capstan_hosts", "KV_capstan_commands"] {
            let config = config(&js, name).await;
            assert!(
                !config.allow_rollup && config.deny_purge && config.deny_delete,
                "{name} is migrated: {config:?}"
            );
        }
        let cmd = config(&js, "CAPSTAN_CMD").await;
        assert!(
            cmd.max_bytes > 0 && cmd.discard == stream::DiscardPolicy::New,
            "CAPSTAN_CMD is migrated: {cmd:?}"
        );
        let evt = config(&js, "CAPSTAN_EVT").await;
        assert!(
            evt.max_bytes > 0
                && evt.max_messages_per_subject > 0
                && evt.max_message_size > 0
                && evt.deny_purge
                && !evt.allow_rollup
                && evt.discard == stream::DiscardPolicy::Old,
            "CAPSTAN_EVT is migrated: {evt:?}"
        );
    });

    runtime().block_on(async {
        let js = as_h1(&fleet).await;
        // A rollup of the whole bucket through h1's own key is refused …
        let rollup = publish(
            &js,
            "$KV.capstan_hosts.h1",
            &[("Nats-Rollup", "all")],
            beat("h1", chrono::Utc::now()),
        )
        .await;
        assert!(rollup.is_err(), "a rollup was accepted: {rollup:?}");
        // … and so h2's entry is still there.
        let coordinator = as_coordinator(&fleet).await;
        let hosts = coordinator
            .get_key_value("capstan_hosts")
            .await
            .expect("bucket");
        assert!(
            hosts.get("h2").await.expect("get").is_some(),
            "h2's beat was purged"
        );
    });
    // Under its own key, h1 claims to be h2, then to be alive an hour from now.
    let in_an_hour = chrono::Utc::now() + chrono::Duration::hours(1);
    put_as_h1(&fleet, beat("h2", in_an_hour));
    let hosts = fleet.coordinator.cli_json(&["hosts"], 0);
    let listed: Vec<(&Value, &Value)> = hosts["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| (&h["host"], &h["status"]))
        .collect();
    assert_eq!(
        listed,
        vec![(&json!("h2"), &json!("alive"))],
        "a beat under h1's key naming h2 is ignored: {hosts}"
    );
    put_as_h1(&fleet, beat("h1", in_an_hour));
    let hosts = fleet.coordinator.cli_json(&["hosts"], 0);
    let h1 = hosts["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .find(|h| h["host"] == "h1")
        .cloned()
        .unwrap_or_default();
    assert_eq!(h1["status"], "stale", "a beat from the future: {hosts}");

    h2_is_unaffected(&fleet, &h2, "after");
    second.stop();
    daemon.stop();
    fleet.stop();
}

#[test]
fn with_the_shipped_permissions_h1_cannot_fill_the_store() {
    let fleet = shipped_fleet();
    let h2 = fleet.agent("h2").nats_user("h2", "change-me-h2").build();
    let daemon = h2.run();
    h2_is_unaffected(&fleet, &h2, "before");
    runtime().block_on(async {
        let js = as_h1(&fleet).await;
        // A message larger than any record (the server takes up to 1 MiB).
        let big = publish(&js, "capstan.v1.evt.h1", &[], vec![b'x'; 900 * 1024]).await;
        assert!(big.is_err(), "an oversized event was stored: {big:?}");

        // Every stream and bucket has a byte or size limit, and the account's
        // JetStream store is bounded.
        let coordinator = as_coordinator(&fleet).await;
        for name in [
            "CAPSTAN_EVT",
            "CAPSTAN_CMD",
            "KV_capstan_hosts",
            "KV_capstan_commands",
            "KV_capstan_results",
        ] {
            let config = config(&coordinator, name).await;
            assert!(config.max_message_size > 0, "{name}: {config:?}");
        }
        let results = config(&coordinator, "KV_capstan_results").await;
        assert!(results.max_bytes > 0, "{results:?}");
        let evt = config(&coordinator, "CAPSTAN_EVT").await;
        assert!(
            evt.max_bytes > 0 && evt.max_messages_per_subject > 0,
            "{evt:?}"
        );
        let cmd = config(&coordinator, "CAPSTAN_CMD").await;
        assert!(
            cmd.max_bytes > 0 && cmd.discard == stream::DiscardPolicy::New,
            "{cmd:?}"
        );
        let info: Value = coordinator
            .request("INFO".to_string(), &json!({}))
            .await
            .expect("account info");
        let max_storage = info["limits"]["max_storage"].as_i64().unwrap_or(-1);
        assert!(
            max_storage > evt.max_bytes + cmd.max_bytes + results.max_bytes,
            "the account's store is bounded above what the streams may hold: {info}"
        );
    });
    h2_is_unaffected(&fleet, &h2, "after");
    daemon.stop();
    fleet.stop();
}
