//! Authorisation: agents reject unsigned, mis-signed, wrong-host and old commands
//! (logged `command_rejected`, reported through CAPSTAN_EVT), and the shipped
//! nats-server permissions keep agent h1 out of h2's commands.

use super::Fleet;
use async_nats::jetstream;
use capstan_common::signing::Signer;
use capstan_common::Command;
use capstan_tests::command::Commands;
use capstan_tests::nats::runtime;
use capstan_tests::{wait_until, READY};
use std::path::PathBuf;

fn wire(id: &str, host: &str, issued_at: chrono::DateTime<chrono::Utc>) -> Command {
    let line = Commands::new(host, "stolen")
        .ensure_namespace(id)
        .with("issued_at", issued_at.to_rfc3339());
    Command::parse(&line.to_string()).expect("valid command")
}

#[test]
fn unsigned_mis_signed_wrong_host_and_old_commands_are_rejected() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    let ours = Signer::from_hex(&fleet.keys.secret_hex()).expect("our key");
    let stranger = Signer::generate().expect("a stranger's key");
    let now = chrono::Utc::now();
    let old = now - chrono::Duration::hours(2);
    let messages = [
        (
            "unsigned-1",
            wire("unsigned-1", "h1", now).to_json(),
            "unsigned",
        ),
        (
            "wrongkey-1",
            stranger.signed_json(&wire("wrongkey-1", "h1", now)),
            "bad_signature",
        ),
        (
            "wronghost-1",
            ours.signed_json(&wire("wronghost-1", "h2", now)),
            "wrong_host",
        ),
        (
            "old-1",
            ours.signed_json(&wire("old-1", "h1", old)),
            "expired",
        ),
    ];
    runtime().block_on(async {
        let client = async_nats::connect(fleet.server.url())
            .await
            .expect("connect");
        let js = jetstream::new(client);
        for (_, text, _) in &messages {
            js.publish("capstan.v1.cmd.h1", text.clone().into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }
    });
    let rejections = wait_until("four rejections in CAPSTAN_EVT", READY, || {
        let rejected: Vec<_> = coordinator
            .events("h1")
            .into_iter()
            .filter(|e| e["kind"] == "command_rejected")
            .collect();
        (rejected.len() == messages.len()).then_some(rejected)
    });
    for ((id, _, code), event) in messages.iter().zip(&rejections) {
        assert_eq!(
            (&event["command_id"], &event["code"]),
            (&(*id).into(), &(*code).into())
        );
    }
    // Nothing was carried out.
    let intent = coordinator.cli_json(&["intent", "h1"], 0);
    assert!(intent["namespaces"]["stolen"].is_null(), "{intent}");
    // A properly signed command still works.
    coordinator.run_all(&[h1.commands("fine").ensure_namespace("fine")]);
    daemon.stop();
    fleet.stop();
}

pub(super) fn shipped_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/nats-server.conf")
}

pub(super) const AS_COORDINATOR: &str =
    "user = \"coordinator\"\npassword = \"change-me-coordinator\"";

#[test]
fn with_the_shipped_permissions_h1_cannot_read_h2s_commands() {
    let fleet = Fleet::start_with(Some(&shipped_config()), "", AS_COORDINATOR);
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").nats_user("h1", "change-me-h1").build();
    let h1_daemon = h1.run();
    // The permissions are enough for h1's whole job: commands, events, RPC, registry.
    coordinator.run_all(&[h1.commands("a").ensure_namespace("mine")]);
    assert_eq!(coordinator.cli_json(&["intent", "h1"], 0)["applied_seq"], 3);
    coordinator.wait_for_hosts("h1 in the registry", |v| v["hosts"][0]["status"] == "alive");

    // A command for h2, whose agent is not running yet.
    let h2 = fleet.agent("h2").nats_user("h2", "change-me-h2").build();
    let theirs = coordinator.submit(&h2.commands("b").ensure_namespace("theirs"));

    // h1's credentials try to read it three ways; the server refuses each.
    runtime().block_on(async {
        let (tx, mut violations) = tokio::sync::mpsc::unbounded_channel();
        let client =
            async_nats::ConnectOptions::with_user_and_password("h1".into(), "change-me-h1".into())
                .custom_inbox_prefix("_INBOX_h1")
                .event_callback(move |event| {
                    let tx = tx.clone();
                    async move {
                        if let async_nats::Event::ServerError(e) = event {
                            let _ = tx.send(e.to_string());
                        }
                    }
                })
                .connect(fleet.server.url())
                .await
                .expect("connect as h1");
        let _sub = client
            .subscribe("capstan.v1.cmd.h2")
            .await
            .expect("subscribe call");
        client
            .publish(
                "$JS.API.CONSUMER.MSG.NEXT.CAPSTAN_CMD.agent-h2",
                "{\"batch\":1}".into(),
            )
            .await
            .expect("publish call");
        client
            .publish(
                "$JS.API.CONSUMER.CREATE.CAPSTAN_CMD.steal.capstan.v1.cmd.h2",
                "{}".into(),
            )
            .await
            .expect("publish call");
        client.flush().await.expect("flush");
        let mut seen = Vec::new();
        for needle in [
            "Subscription to \"capstan.v1.cmd.h2\"",
            "Publish to \"$JS.API.CONSUMER.MSG.NEXT.CAPSTAN_CMD.agent-h2\"",
            "Publish to \"$JS.API.CONSUMER.CREATE.CAPSTAN_CMD.steal.capstan.v1.cmd.h2\"",
        ] {
            while !seen.iter().any(|s: &String| s.contains(needle)) {
                let v = tokio::time::timeout(READY, violations.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {needle} violation within {READY:?}"))
                    .expect("server errors");
                assert!(v.to_lowercase().contains("permissions violation"), "{v}");
                seen.push(v);
            }
        }
    });

    // h2's command is still h2's: its agent gets it when it starts.
    assert_eq!(
        coordinator.cli_json(&["status", &theirs], 0)["status"],
        "pending"
    );
    let h2_daemon = h2.run();
    assert_eq!(
        coordinator.cli_json(&["wait", &theirs], 0)["status"],
        "succeeded"
    );
    h2_daemon.stop();
    h1_daemon.stop();
    fleet.stop();
}
