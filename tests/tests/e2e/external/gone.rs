//! SIGKILL the driver process while it holds an `activate`: the command fails
//! retryably (`driver_unavailable`); after the driver is back, the retry under a new
//! id succeeds, and the workload was started once.

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::external::SimDriver;
use capstan_tests::process::Exit;
use std::io::Read as _;

#[test]
fn a_driver_killed_mid_command_fails_it_retryably_and_the_retry_acts_once() {
    let sim = SimDriver::new();
    let agent = Agent::builder("ext-gone").external(&sim.socket()).build();
    let c = agent.commands("shop");
    let driver = sim.start(&["--hold", "activate"]);
    let input = agent.write_input(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", Spec::sim().command(&["serve"])),
        c.activate("a1", "web", "r1"),
    ]);
    let mut apply = agent.start_apply(Some(&input));
    let mut stdout = apply.stdout();
    driver.wait_for_text("holding activate");
    assert!(apply.exited().is_none(), "apply waits on the held activate");
    driver.kill();
    apply.wait_expecting(Exit::Code(1));
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let results: Vec<serde_json::Value> = capstan_tests::parse_lines(out.as_bytes());
    assert_eq!(results.len(), 3, "{out}");
    let failed = &results[2];
    assert_eq!(
        (&failed["id"], &failed["outcome"]),
        (&"a1".into(), &"failed".into()),
        "{failed}"
    );
    assert_eq!(failed["error"]["code"], "driver_unavailable", "{failed}");
    assert_eq!(failed["retryable"], true, "{failed}");
    assert_eq!(sim.host().revisions["shop/web@r1"].starts, 0);
    // Log first: a1 was received before the driver was asked, and completed failed.
    let log = agent.log_of("a1");
    let kinds: Vec<&str> = log.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"command_received"), "{log:?}");
    assert_eq!(log.last().unwrap()["code"], "driver_unavailable", "{log:?}");

    let driver = sim.start(&[]);
    agent.apply_ok(&[c.activate("a2", "web", "r1")]);
    let host = sim.host();
    let web = &host.revisions["shop/web@r1"];
    assert_eq!(web.state, capstan_driver::BackendState::Running);
    assert_eq!(web.starts, 1, "one activation, not two: {host:?}");
    let started = agent.events("workload_started");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(
        agent.intent()["workloads"]["shop/web"]["active_revision"],
        "r1"
    );
    driver.kill();
}
