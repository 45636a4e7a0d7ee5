//! Tamper evidence: one flipped byte in a stored record is found and named, and the
//! agent refuses to act on a log it cannot trust, without panicking.

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::process::Exit;

#[test]
fn a_flipped_byte_is_named_and_the_agent_refuses_to_act() {
    let agent = Agent::builder("tamper-host").build();
    let a = agent.commands("a");
    let mut lines = vec![a.ensure_namespace("ns")];
    for i in 0..6 {
        lines.push(a.prepare(&format!("p{i}"), &format!("w{i}"), "r1", Spec::sim()));
    }
    agent.apply_ok(&lines);
    let (ok, verify) = agent.verify();
    assert!(ok, "{verify}");
    assert_eq!(verify.trim(), "ok 21 records");

    capstan_agent::log::tamper_flip_byte(&agent.log_dir(), 8, 12).expect("tamper");

    let (ok, verify) = agent.verify();
    assert!(!ok, "verify must fail");
    assert!(verify.contains("bad record 8"), "names the seq: {verify}");

    let applied = agent.apply(&[agent.commands("b").ensure_namespace("late")]);
    assert_eq!(applied.exit, Exit::Code(3), "degraded exit code: {applied}");
    assert!(!applied.stderr.contains("panicked"), "{applied}");
    assert_eq!(applied.results.len(), 1);
    assert_eq!(applied.results[0]["outcome"], "rejected");
    assert_eq!(applied.results[0]["error"]["code"], "log_degraded");
    // Nothing was appended: the log still ends where it did, and reading it shows
    // every trustworthy record while naming the bad one.
    let out = agent.cli(&["log", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad record 8"));
    let records = capstan_tests::parse_lines(&out.stdout);
    assert_eq!(records.len(), 20);
    assert_eq!(records.last().unwrap()["seq"], 21);
    let host = agent.sim_host().to_string();
    assert!(host.contains("\"a\"") && !host.contains("\"b\""), "{host}");
}
