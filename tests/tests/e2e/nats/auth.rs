//! Authorisation: agents reject unsigned, mis-signed, wrong-host and old commands
//! (logged `command_rejected`, reported through CAPSTAN_EVT). What keeps one host
//! out of another's subjects is in `attack.rs`.

use super::Fleet;
use async_nats::jetstream;
use capstan_common::signing::Signer;
use capstan_common::Command;
use capstan_tests::command::Commands;
use capstan_tests::nats::runtime;
use capstan_tests::{wait_until, READY};

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
