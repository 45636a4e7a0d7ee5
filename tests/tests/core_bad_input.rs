//! Bad input is rejected line by line with a stable code and logged; every valid line
//! around it still succeeds.

use capstan_tests::agent::{command, Agent};

#[test]
fn each_bad_line_is_rejected_with_its_code_and_the_rest_succeed() {
    let agent = Agent::new("input-host");
    let h = agent.host.clone();
    let big = "x".repeat(300 * 1024);
    let cases: Vec<(String, Option<&str>)> = vec![
        (
            command(&h, "ok1", r#""op":"ensure_namespace","namespace":"a""#),
            None,
        ),
        (
            "{\"v\":1, this is not json".to_string(),
            Some("invalid_json"),
        ),
        (
            command(&h, "bad-op", r#""op":"format_disk","namespace":"a""#),
            Some("unknown_op"),
        ),
        (
            command(
                &h,
                "bad-name",
                r#""op":"ensure_namespace","namespace":"Not_A_Label""#,
            ),
            Some("invalid_name"),
        ),
        (
            command(
                &h,
                "ok2",
                r#""op":"prepare_revision","namespace":"a","workload":"w","revision":"r1","spec":{"driver":"sim","env":{"A":"1"}}"#,
            ),
            None,
        ),
        (
            command(
                &h,
                "big",
                &format!(
                    r#""op":"prepare_revision","namespace":"a","workload":"w","revision":"r2","spec":{{"driver":"sim","env":{{"PAD":"{big}"}}}}"#
                ),
            ),
            Some("too_large"),
        ),
        (
            command(
                &h,
                "nul",
                r#""op":"prepare_revision","namespace":"a","workload":"w","revision":"r3","spec":{"driver":"sim","env":{"A":"x\u0000y"}}"#,
            ),
            Some("invalid_env"),
        ),
        (
            command(
                &h,
                "eq",
                r#""op":"prepare_revision","namespace":"a","workload":"w","revision":"r4","spec":{"driver":"sim","env":{"A=B":"x"}}"#,
            ),
            Some("invalid_env"),
        ),
        (
            command(
                "other-host",
                "wrong-host",
                r#""op":"ensure_namespace","namespace":"b""#,
            ),
            Some("wrong_host"),
        ),
        (
            r#"{"v":9,"id":"future","op":"ensure_namespace"}"#.to_string(),
            Some("unsupported_version"),
        ),
        (
            command(
                &h,
                "ok3",
                r#""op":"activate_revision","namespace":"a","workload":"w","revision":"r1""#,
            ),
            None,
        ),
    ];
    let lines: Vec<String> = cases.iter().map(|(l, _)| l.clone()).collect();
    let input = agent.write_input("mixed.jsonl", &lines);
    let (out, results) = agent.apply(&input);
    assert_eq!(out.status.code(), Some(1), "some lines were rejected");
    assert_eq!(results.len(), cases.len(), "one answer per line");
    for ((line, want), got) in cases.iter().zip(&results) {
        match want {
            None => assert_eq!(
                got["outcome"],
                "succeeded",
                "{got} for {}",
                &line[..line.len().min(120)]
            ),
            Some(code) => {
                assert_eq!(got["outcome"], "rejected", "{got}");
                assert_eq!(got["error"]["code"], *code, "{got}");
            }
        }
    }
    // Each rejection is in the log, and nothing was created for them.
    let log = agent.log_json();
    let rejected = log
        .iter()
        .filter(|r| r["kind"] == "command_rejected")
        .count();
    assert_eq!(rejected, cases.iter().filter(|(_, w)| w.is_some()).count());
    let intent = agent.intent();
    assert_eq!(
        intent["workloads"]["a/w"]["revisions"],
        serde_json::json!({"r1": "active"})
    );
    assert!(intent["namespaces"].get("b").is_none());
    let (ok, _) = agent.verify();
    assert!(ok);
}
