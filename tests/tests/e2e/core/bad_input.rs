//! Bad input is rejected line by line with a stable code and logged; every valid line
//! around it still succeeds.

use capstan_tests::agent::Agent;
use capstan_tests::command::{Commands, Spec};
use capstan_tests::process::Exit;

#[test]
fn each_bad_line_is_rejected_with_its_code_and_the_rest_succeed() {
    let agent = Agent::builder("input-host").build();
    let a = agent.commands("a");
    let w = |id: &str, rev: &str, name: &str, value: &str| {
        a.prepare(id, "w", rev, Spec::sim().env(name, value))
            .to_string()
    };
    let cases: Vec<(String, Option<&str>)> = vec![
        (a.ensure_namespace("ok1").into(), None),
        (
            "{\"v\":1, this is not json".to_string(),
            Some("invalid_json"),
        ),
        (a.ns_op("bad-op", "format_disk").into(), Some("unknown_op")),
        (
            a.in_ns("Not_A_Label").ensure_namespace("bad-name").into(),
            Some("invalid_name"),
        ),
        (w("ok2", "r1", "A", "1"), None),
        (
            w("big", "r2", "PAD", &"x".repeat(300 * 1024)),
            Some("too_large"),
        ),
        (w("nul", "r3", "A", "x\u{0}y"), Some("invalid_env")),
        (w("eq", "r4", "A=B", "x"), Some("invalid_env")),
        (
            Commands::new("other-host", "b")
                .ensure_namespace("wrong-host")
                .into(),
            Some("wrong_host"),
        ),
        (
            r#"{"v":9,"id":"future","op":"ensure_namespace"}"#.to_string(),
            Some("unsupported_version"),
        ),
        (a.activate("ok3", "w", "r1").into(), None),
    ];
    let lines: Vec<&String> = cases.iter().map(|(l, _)| l).collect();
    let applied = agent.apply(&lines);
    assert_eq!(applied.exit, Exit::Code(1), "some lines were rejected");
    assert_eq!(applied.results.len(), cases.len(), "one answer per line");
    for ((line, want), got) in cases.iter().zip(&applied.results) {
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
    let rejected = agent.events("command_rejected").len();
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
