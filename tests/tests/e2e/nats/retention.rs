//! Exactly once across retention, over NATS: once `[log.retention]` pruned a
//! command's records, the same command published again is answered from the log and
//! never carried out again, both as a re-post (re-signed with a fresh `issued_at`, as
//! the coordinator does; published here without a `Nats-Msg-Id`, as one after
//! JetStream's 2-minute duplicate window is) and as a redelivery issued long ago
//! (older than `[signing] max_age_secs`, which is only admitted because the log knows
//! the id). Its id with other content is `id_conflict`.

use super::Fleet;
use crate::core::retention::{history, prune_everything, reissued};
use async_nats::jetstream;
use capstan_common::signing::Signer;
use capstan_common::Command;
use capstan_tests::nats::runtime;
use capstan_tests::process::Exit;
use capstan_tests::{wait_until, READY};

#[test]
fn a_pruned_command_published_again_is_answered_from_the_log_and_runs_once() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let mut h1 = fleet.agent("h1").build();
    let c = h1.commands("ns");
    let lines = history(&c);
    // `web` on r1 then r2 through the coordinator; the 400 namespaces after them
    // through `apply` (quicker), published by the outbox when `run` starts again.
    let daemon = h1.run();
    coordinator.run_all(&lines[..5]);
    daemon.signal_expecting(libc::SIGUSR2, Exit::OK);
    h1.apply_ok(&lines[5..]);
    prune_everything(&mut h1);
    let daemon = h1.run();
    wait_until("the activation of r1 to be pruned", READY, || {
        h1.log_of("a.web.r1").is_empty()
    });

    let signer = Signer::from_hex(&fleet.keys.secret_hex()).expect("our key");
    let issued = |revision: &str, ago: chrono::Duration| {
        let line =
            reissued(&c, revision).with("issued_at", (chrono::Utc::now() - ago).to_rfc3339());
        signer.signed_json(&Command::parse(&line.to_string()).expect("a command"))
    };
    let messages = [
        issued("r1", chrono::Duration::zero()),
        issued("r1", chrono::Duration::hours(2)),
        issued("r2", chrono::Duration::zero()),
    ];
    runtime().block_on(async {
        let client = async_nats::connect(fleet.server.url())
            .await
            .expect("connect");
        let js = jetstream::new(client);
        for text in messages {
            js.publish("capstan.v1.cmd.h1", text.into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }
    });

    // Both copies answered from the log; the other content refused.
    wait_until("two duplicates answered from the log", READY, || {
        let answered = daemon.lines().into_iter().filter(|l| {
            l["fields"]["message"] == "duplicate command answered from the log"
                && l["fields"]["command_id"] == "a.web.r1"
        });
        answered.count() == 2
    });
    let conflict = wait_until("the id_conflict in CAPSTAN_EVT", READY, || {
        coordinator
            .events("h1")
            .into_iter()
            .find(|e| e["kind"] == "command_rejected" && e["command_id"] == "a.web.r1")
    });
    assert_eq!(conflict["code"], "id_conflict", "{conflict}");
    let sim = h1.sim_host();
    assert_eq!(sim["revisions"]["ns/web@r1"]["starts"], 1, "{sim}");
    let intent = coordinator.cli_json(&["intent", "h1"], 0);
    assert_eq!(
        intent["workloads"]["ns/web"]["active_revision"], "r2",
        "{intent}"
    );
    daemon.signal_expecting(libc::SIGUSR2, Exit::OK);
    fleet.stop();
}
