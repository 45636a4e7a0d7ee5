//! A NATS outage: nats-server stopped for 10 s and started again with the same store
//! while the agent keeps logging (a restart of the agent during the outage logs its
//! shutdown sweep and startup reconciliation). Every record reaches CAPSTAN_EVT, in
//! order, identical to the local log; the coordinator reports the outage as its own
//! (`nats_unavailable`), never as hosts gone.

use capstan_tests::nats::{
    wait_for_line, wait_until, Coordinator, Keys, NatsAgent, NatsServer, ACTIVATE_WEB_R1,
    ENSURE_SHOP, PREPARE_WEB_R1,
};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The outage length the issue asks for.
const OUTAGE: Duration = Duration::from_secs(10);

fn stream_events(c: &Coordinator) -> Vec<Value> {
    let out = c.cli(&["log", "h1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    capstan_tests::agent::parse_lines(&out.stdout)
}

#[test]
fn every_record_logged_during_an_outage_reaches_the_event_stream() {
    let mut server = NatsServer::start();
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let mut agent = NatsAgent::start("h1", &server.url(), &keys.public, "");
    coordinator.run_all(
        "h1",
        &[
            ("ns", ENSURE_SHOP),
            ("prep", PREPARE_WEB_R1),
            ("act", ACTIVATE_WEB_R1),
        ],
    );
    let before = stream_events(&coordinator).len();

    server.stop();
    let outage_began = Instant::now();
    // The coordinator says it cannot see NATS; it does not call the host gone.
    wait_until("the coordinator to notice the outage", || {
        let out = coordinator.cli(&["hosts"]);
        (out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stderr).contains("nats_unavailable"))
        .then_some(())
    });
    // The agent logs while NATS is away: a restart sweeps and reconciles.
    agent.stop();
    agent.spawn(&[]);
    wait_for_line(&agent.log_file(agent.runs()), "capstan-agent ready");
    std::thread::sleep(OUTAGE.saturating_sub(outage_began.elapsed()));
    server.restart();

    // The running agent reconnects and publishes everything it logged meanwhile.
    let applied = wait_until("the agent to answer again", || {
        let out = coordinator.cli(&["intent", "h1"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).ok())
            .flatten()
            .and_then(|v| v["applied_seq"].as_u64())
    });
    let events = wait_until("every record in CAPSTAN_EVT", || {
        let events = stream_events(&coordinator);
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
    agent.stop();
    let local = agent.agent.log_json();
    for (i, e) in events.iter().enumerate() {
        let l = &local[i];
        assert_eq!(e["seq"], (i + 1) as u64);
        assert_eq!(
            (&e["seq"], &e["kind"], &e["prev_hash"]),
            (&l["seq"], &l["kind"], &l["prev_hash"])
        );
        assert_eq!(e["host"], "h1");
    }
}
