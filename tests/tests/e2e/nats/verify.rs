//! `capstan verify HOST`: the central copy in `CAPSTAN_EVT` is a second witness of a
//! host's log. A log restored from an older copy after publication is found
//! truncated, and one that then went on differently is found forked, each at the
//! first seq where it departs from what was published.

use super::{shop, Fleet};
use capstan_tests::nats::Coordinator;
use capstan_tests::{wait_until, READY};
use serde_json::Value;
use std::process::Command;

/// `capstan --json verify HOST`: its verdict, asserting the exit code.
fn verify(coordinator: &Coordinator, host: &str, code: i32) -> Value {
    coordinator.cli_json(&["verify", host], code)
}

/// Waits until every record of the agent's log is in `CAPSTAN_EVT`; its last seq.
fn published(coordinator: &Coordinator, host: &str) -> u64 {
    let intent = coordinator.cli_json(&["intent", host], 0);
    let last = intent["applied_seq"].as_u64().expect("applied_seq");
    wait_until("the outbox to catch up", READY, || {
        let events = coordinator.events(host);
        (events.last().and_then(|e| e["seq"].as_u64()) == Some(last)).then_some(last)
    });
    last
}

/// Waits until the host answers through the coordinator (a run is ready before it
/// has reached NATS).
fn answering(coordinator: &Coordinator, host: &str) {
    wait_until("the host to answer", READY, || {
        coordinator
            .cli(&["intent", host])
            .status
            .success()
            .then_some(())
    });
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

#[test]
fn a_log_restored_after_publication_is_found_truncated_and_then_forked() {
    let host = capstan_tests::unique("witness");
    restored(Fleet::with_accounts(&[&host], "256M"), &host);
}

/// The same on one account for the whole fleet, where the agent reads the command
/// stream and the results itself.
#[test]
fn a_log_restored_on_the_shared_account_runs_nothing_again() {
    restored(Fleet::start(), &capstan_tests::unique("shared-witness"));
}

/// A log restored from an older copy after publication: its host runs none of the
/// commands since the copy again (their results are final), `verify` finds it
/// truncated, and after another command in their place, forked.
fn restored(fleet: Fleet, host: &str) {
    let coordinator = &fleet.coordinator;
    let host = host.to_string();
    let agent = fleet.agent(&host).build();
    let commands = shop(&agent, true);

    let daemon = agent.run();
    coordinator.run_all(&commands[..2]);
    let early = published(coordinator, &host);
    daemon.stop();
    let backup = agent.path("data.before");
    copy_dir(&agent.data_dir(), &backup);

    let daemon = agent.run();
    coordinator.run_all(&commands[2..]);
    let last = published(coordinator, &host);
    assert!(last > early);
    let ok = verify(coordinator, &host, 0);
    assert_eq!(ok["result"], "ok", "{ok}");
    assert_eq!(ok["compared"], last);
    assert_eq!(
        (ok["host_seq"].as_u64(), ok["published_seq"].as_u64()),
        (Some(last), Some(last))
    );
    assert_eq!(ok["first_difference"], Value::Null);
    daemon.stop();

    // The older copy put back: the records after it are gone from the host.
    std::fs::remove_dir_all(agent.data_dir()).expect("remove the data dir");
    std::fs::rename(&backup, agent.data_dir()).expect("restore the older copy");
    let daemon = agent.run();
    answering(coordinator, &host);
    // Its log no longer knows the commands after the copy, but their results are
    // final: they are not carried out again (nothing after `early` on the host).
    let last_id = commands.last().expect("commands").id().to_string();
    daemon.wait_for_line("the last command passed over", |l| {
        l["fields"]["command_id"] == last_id.as_str()
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not carried out again"))
    });
    let truncated = verify(coordinator, &host, 1);
    assert_eq!(truncated["result"], "truncated", "{truncated}");
    assert_eq!(truncated["compared"], early);
    assert_eq!(truncated["first_difference"]["seq"], early + 1);
    assert_eq!(truncated["first_difference"]["host"], Value::Null);
    assert_eq!(truncated["first_difference"]["published"]["seq"], early + 1);
    daemon.stop();

    // It goes on with other records in their place: a fork at the same seq.
    agent.apply_ok(&[agent.commands("other").ensure_namespace("other-ns")]);
    let daemon = agent.run();
    answering(coordinator, &host);
    let forked = verify(coordinator, &host, 1);
    assert_eq!(forked["result"], "differs", "{forked}");
    assert_eq!(forked["first_difference"]["seq"], early + 1);
    assert_eq!(forked["first_difference"]["host"]["command_id"], "other-ns");
    assert_ne!(
        forked["first_difference"]["published"]["command_id"],
        "other-ns"
    );
    daemon.stop();
    fleet.stop();
}

/// A log whose first thousand records take more than a NATS message (1 MiB): the
/// host answers `log` a page at a time within its byte bound, and `verify` goes on
/// after each page until it has compared every record.
#[test]
fn a_log_whose_first_page_is_over_a_mebibyte_verifies() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let agent = fleet.agent("big").build();
    let daemon = agent.run();
    let c = agent.commands("shop");
    let big = "x".repeat(200 * 1024);
    let mut commands = vec![c.ensure_namespace("ns")];
    for n in 1..=6 {
        let spec = capstan_tests::command::Spec::sim().env("BIG", &big);
        commands.push(c.prepare(&format!("p{n}"), &format!("w{n}"), "r1", spec));
    }
    coordinator.run_all(&commands);
    let last = published(coordinator, "big");
    let bytes: usize = coordinator
        .events("big")
        .iter()
        .map(|e| e.to_string().len())
        .sum();
    assert!(bytes > 1 << 20, "the records take {bytes} bytes");
    let ok = verify(coordinator, "big", 0);
    assert_eq!(ok["result"], "ok", "{ok}");
    assert_eq!(ok["compared"], last, "{ok}");
    daemon.stop();
    fleet.stop();
}
