//! A NATS outage: nats-server stopped for 10 s and started again with the same store
//! while the agent keeps logging (a restart of the agent during the outage logs its
//! shutdown sweep and startup reconciliation). Every record reaches CAPSTAN_EVT, in
//! order, identical to the local log; the coordinator reports the outage as its own
//! (`nats_unavailable`), never as hosts gone.

use super::{shop, Fleet};
use capstan_tests::{wait_until, READY};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The outage length the issue asks for.
const OUTAGE: Duration = Duration::from_secs(10);

#[test]
fn every_record_logged_during_an_outage_reaches_the_event_stream() {
    let mut fleet = Fleet::start();
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    fleet.coordinator.run_all(&shop(&h1, true));
    let before = fleet.coordinator.events("h1").len();

    fleet.server.stop();
    let outage_began = Instant::now();
    // The coordinator says it cannot see NATS; it does not call the host gone.
    let coordinator = &fleet.coordinator;
    wait_until("the coordinator to notice the outage", READY, || {
        let out = coordinator.cli(&["hosts"]);
        out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stderr).contains("nats_unavailable")
    });
    // The agent logs while NATS is away: a restart sweeps and reconciles.
    daemon.stop();
    let daemon = h1.start(&[], &[]);
    daemon.wait_for_text("capstan-agent ready");
    // Not a wait for anything: the outage lasts as long as the issue asks.
    std::thread::sleep(OUTAGE.saturating_sub(outage_began.elapsed()));
    fleet.server.restart();

    // The running agent reconnects and publishes everything it logged meanwhile.
    let applied = wait_until("the agent to answer again", READY, || {
        let out = coordinator.cli(&["intent", "h1"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).ok())
            .flatten()
            .and_then(|v| v["applied_seq"].as_u64())
    });
    let events = wait_until("every record in CAPSTAN_EVT", READY, || {
        let events = coordinator.events("h1");
        (events.last().and_then(|e| e["seq"].as_u64()) >= Some(applied)).then_some(events)
    });
    assert!(
        events.len() > before,
        "nothing was logged during the outage"
    );
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(
        kinds.contains(&"workload_stopped") && kinds[before..].contains(&"workload_started"),
        "{kinds:?}"
    );
    let hosts = coordinator.cli_json(&["hosts"], 0);
    assert_ne!(hosts["hosts"][0]["status"], "gone", "{hosts}");

    // Identical to the local log: every seq once, in order, same hash chain.
    daemon.stop();
    let local = h1.log();
    for (i, e) in events.iter().enumerate() {
        let l = &local[i];
        assert_eq!(e["seq"], (i + 1) as u64);
        assert_eq!(
            (&e["seq"], &e["kind"], &e["prev_hash"]),
            (&l["seq"], &l["kind"], &l["prev_hash"])
        );
        assert_eq!(e["host"], "h1");
    }
    fleet.stop();
}
