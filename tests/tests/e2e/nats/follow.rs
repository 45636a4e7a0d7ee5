//! `capstan log HOST` reads a host's whole log from `CAPSTAN_EVT` however many pages
//! it takes, and `--follow` prints each new record once, in order, as it arrives —
//! waiting out an outage of NATS (the coordinator answers 503 meanwhile) and going on
//! from where it was.

use super::{shop, Fleet};
use capstan_tests::process::{Exit, Process};
use capstan_tests::{parse_lines, unique, wait_until, READY};
use serde_json::Value;
use std::process::{Command, Stdio};

/// The seqs of `records`, asserting they are 1, 2, 3, … with none missing or twice.
fn seqs(records: &[Value]) -> u64 {
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["seq"].as_u64(), Some(i as u64 + 1), "record {i}: {r}");
    }
    records.len() as u64
}

#[test]
fn log_reads_every_page_and_follow_prints_each_new_record_once_through_an_outage() {
    let mut fleet = Fleet::start();
    let host = unique("follow");
    let agent = fleet.agent(&host).build();
    // 400 namespaces applied before the agent joins NATS: 1,200 records, more than one
    // page of the events API (1,000), all published by the outbox once it runs.
    let c = agent.commands("n");
    let lines: Vec<_> = (0..400)
        .map(|i| c.in_ns(&format!("n{i}")).ensure_namespace(&format!("n{i}")))
        .collect();
    agent.apply_ok(&lines);
    let daemon = agent.run();
    let logged = agent.log().len();
    assert_eq!(logged, 1_200);
    let all = wait_until("the 1,200 records in CAPSTAN_EVT", READY, || {
        let events = fleet.coordinator.events(&host);
        (events.len() >= logged).then_some(events)
    });
    assert_eq!(seqs(&all), 1_200, "capstan log read every page");

    let dir = tempfile::tempdir().expect("a temp dir");
    let out = dir.path().join("follow.out");
    // SIGINT's default action, whatever the test run inherited: a run started in the
    // background by a shell without job control ignores SIGINT, and so would
    // every process it starts (`env --default-signal`, coreutils).
    let mut command = Command::new("env");
    command
        .arg("--default-signal=INT")
        .arg(capstan_tests::binary("capstan"))
        .args(["--json", "--coordinator", &fleet.coordinator.url])
        .args(["log", &host, "--since", "1000", "--follow"])
        .env("CAPSTAN_TOKEN", &fleet.coordinator.token)
        .env_remove("CAPSTAN_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"));
    let follower = Process::spawn("capstan log --follow", command, &dir.path().join("err"));
    let followed = |n: usize| {
        wait_until(format!("{n} records followed"), READY, || {
            let lines = parse_lines(&std::fs::read(&out).expect("read its stdout"));
            (lines.len() >= n).then_some(lines)
        })
    };
    let from_1001 = |records: Vec<Value>| -> Vec<u64> {
        records
            .iter()
            .map(|r| r["seq"].as_u64().expect("seq"))
            .collect()
    };
    assert_eq!(
        from_1001(followed(200)),
        (1_001..=1_200).collect::<Vec<_>>()
    );

    // New records while it follows.
    fleet.coordinator.run_all(&shop(&agent, false));
    let now = agent_records(&fleet, &host);
    let seen = from_1001(followed(now - 1_000));
    assert_eq!(seen, (1_001..=now as u64).collect::<Vec<_>>());

    // NATS goes away: the follower says so once and waits; the agent logs on.
    fleet.server.stop();
    follower.wait_for_text("retrying every second");
    fleet.server.restart();
    wait_until("the agent to answer again", READY, || {
        fleet.coordinator.cli(&["intent", &host]).status.success()
    });
    fleet
        .coordinator
        .run_all(&[agent.commands("shop").activate("act", "web", "r1")]);
    let now = agent_records(&fleet, &host);
    let seen = from_1001(followed(now - 1_000));
    assert_eq!(
        seen,
        (1_001..=now as u64).collect::<Vec<_>>(),
        "each once, in order"
    );
    follower.wait_for_text("following again from seq");

    follower.signal_expecting(libc::SIGINT, Exit::Signal(libc::SIGINT));
    daemon.stop();
    fleet.stop();
}

/// How many records the host has in `CAPSTAN_EVT` once its outbox caught up with
/// the commands run so far (each command's records end with `command_completed`).
fn agent_records(fleet: &Fleet, host: &str) -> usize {
    wait_until("the outbox to catch up", READY, || {
        let events = fleet.coordinator.events(host);
        let done = events
            .last()
            .is_some_and(|e| e["kind"] == "command_completed");
        done.then(|| seqs(&events) as usize)
    })
}
