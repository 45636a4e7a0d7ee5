//! Authorisation: agents reject unsigned, mis-signed, wrong-host and old commands
//! (logged `command_rejected`, reported through CAPSTAN_EVT), and the shipped
//! nats-server permissions keep agent h1 out of h2's commands.

use async_nats::jetstream;
use capstan_common::signing::Signer;
use capstan_common::Command;
use capstan_tests::nats::{command, runtime, wait_until, Coordinator, Keys, NatsAgent, NatsServer};
use std::path::PathBuf;

fn wire(id: &str, host: &str, issued_at: chrono::DateTime<chrono::Utc>) -> Command {
    Command::parse(&format!(
        r#"{{"v":1,"id":"{id}","host":"{host}","issued_at":"{}","op":"ensure_namespace","namespace":"stolen"}}"#,
        issued_at.to_rfc3339()
    ))
    .expect("valid command")
}

#[test]
fn unsigned_mis_signed_wrong_host_and_old_commands_are_rejected() {
    let server = NatsServer::start();
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let _agent = NatsAgent::start("h1", &server.url(), &keys.public, "");
    let ours = Signer::from_hex(&keys.secret_hex()).expect("our key");
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
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = jetstream::new(client);
        for (_, text, _) in &messages {
            js.publish("capstan.v1.cmd.h1", text.clone().into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }
    });
    let rejections = wait_until("four rejections in CAPSTAN_EVT", || {
        let out = coordinator.cli(&["log", "h1"]);
        let events = capstan_tests::agent::parse_lines(&out.stdout);
        let rejected: Vec<_> = events
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
    coordinator.run_all(
        "h1",
        &[("fine", r#""op":"ensure_namespace","namespace":"fine""#)],
    );
}

fn shipped_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/nats-server.conf")
}

const AS_COORDINATOR: &str = "user = \"coordinator\"\npassword = \"change-me-coordinator\"";

#[test]
fn with_the_shipped_permissions_h1_cannot_read_h2s_commands() {
    let server = NatsServer::start_with(Some(&shipped_config()));
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, AS_COORDINATOR);
    let h1 = NatsAgent::start(
        "h1",
        &server.url(),
        &keys.public,
        "user = \"h1\"\npassword = \"change-me-h1\"",
    );
    // The permissions are enough for h1's whole job: commands, events, RPC, registry.
    coordinator.run_all(
        "h1",
        &[("mine", r#""op":"ensure_namespace","namespace":"a""#)],
    );
    assert_eq!(coordinator.cli_json(&["intent", "h1"], 0)["applied_seq"], 3);
    wait_until("h1 in the registry", || {
        let v = coordinator.cli_json(&["hosts"], 0);
        (v["hosts"][0]["status"] == "alive").then_some(())
    });

    // A command for h2, whose agent is not running yet.
    let theirs = coordinator.submit(&command(
        "h2",
        "theirs",
        r#""op":"ensure_namespace","namespace":"b""#,
    ));

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
                .connect(server.url())
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
                let v = violations.recv().await.expect("server errors");
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
    let _h2 = NatsAgent::start(
        "h2",
        &server.url(),
        &keys.public,
        "user = \"h2\"\npassword = \"change-me-h2\"",
    );
    assert_eq!(
        coordinator.cli_json(&["wait", &theirs], 0)["status"],
        "succeeded"
    );
    drop(h1);
}
