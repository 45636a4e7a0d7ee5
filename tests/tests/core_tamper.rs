//! Tamper evidence: one flipped byte in a stored record is found and named, and the
//! agent refuses to act on a log it cannot trust, without panicking.

use capstan_tests::agent::{command, Agent};

#[test]
fn a_flipped_byte_is_named_and_the_agent_refuses_to_act() {
    let agent = Agent::new("tamper-host");
    let mut lines = vec![command(
        &agent.host,
        "ns",
        r#""op":"ensure_namespace","namespace":"a""#,
    )];
    for i in 0..6 {
        lines.push(command(
            &agent.host,
            &format!("p{i}"),
            &format!(r#""op":"prepare_revision","namespace":"a","workload":"w{i}","revision":"r1","spec":{{"driver":"sim"}}"#),
        ));
    }
    let input = agent.write_input("in.jsonl", &lines);
    let (out, _) = agent.apply(&input);
    assert!(out.status.success());
    let (ok, verify) = agent.verify();
    assert!(ok, "{verify}");
    assert_eq!(verify.trim(), "ok 21 records");

    capstan_agent::log::tamper_flip_byte(&agent.log_dir(), 8, 12).expect("tamper");

    let (ok, verify) = agent.verify();
    assert!(!ok, "verify must fail");
    assert!(verify.contains("bad record 8"), "names the seq: {verify}");

    let more = agent.write_input(
        "more.jsonl",
        &[command(
            &agent.host,
            "late",
            r#""op":"ensure_namespace","namespace":"b""#,
        )],
    );
    let (out, results) = agent.apply(&more);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "degraded exit code; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["outcome"], "rejected");
    assert_eq!(results[0]["error"]["code"], "log_degraded");
    // Nothing was appended: the log still ends where it did, and reading it shows
    // every trustworthy record while naming the bad one.
    let out = agent.command().args(["log", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad record 8"));
    let records = capstan_tests::agent::parse_lines(&out.stdout);
    assert_eq!(records.len(), 20);
    assert_eq!(records.last().unwrap()["seq"], 21);
    assert!(
        !std::fs::read_to_string(agent.data_dir().join("sim-host.json"))
            .unwrap()
            .contains("\"b\"")
    );
}
