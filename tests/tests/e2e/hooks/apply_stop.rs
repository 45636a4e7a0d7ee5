//! `capstan-agent apply` stops like `run`: SIGTERM or SIGINT cancels the command in
//! flight (its hooks are cut short and compensated), prints its result, carries out
//! no further input line and exits 143 / 130 (SIGUSR2, as `run` takes it from the
//! package's upgrade: 140).

use super::{rollout, web};
use capstan_tests::agent::Agent;
use capstan_tests::hooks::{hook_records, Hook};
use capstan_tests::process::{send_signal, Exit};
use capstan_tests::{parse_lines, wait_until, READY};
use std::io::Write as _;

const PHASES: &[&str] = &["before_workload_start", "before_workload_stop"];

#[test]
fn sigterm_during_a_hook_cancels_the_command_and_compensates_its_owners() {
    // b blocks in its grant until it is killed.
    let blocks = r#"if [ "$phase" = before_workload_start ] && [ "$compensating" = false ]; then
  sleep 3600
fi"#;
    let agent = Agent::builder("h1")
        .hook(Hook::plain("a", PHASES))
        .hook(Hook::new("b", PHASES, blocks))
        .build();
    let (c, mut lines) = rollout(&agent, &[]);
    lines.push(c.stop("s1", "web"));
    let input = agent.write_input(&lines);
    let mut apply = agent.start_apply(Some(&input));
    let stdout = apply.stdout_lines();
    wait_until("b to be granting", READY, || {
        agent.calls("b") == ["before_workload_start false"]
    });
    apply.stop_expecting(Exit::Code(143));
    let out = stdout.rest("apply's results").join("\n");
    let results = parse_lines(out.as_bytes());
    let ids: Vec<_> = results.iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, ["ns", "p1", "a1"], "s1 was not read: {results:?}");
    let a1 = &results[2];
    assert_eq!(a1["outcome"], "failed", "{a1}");
    assert_eq!(a1["error"]["code"], "cancelled", "{a1}");
    assert_eq!(a1["retryable"], true, "{a1}");
    // b was cut short and may have granted: compensated first, then a.
    assert_eq!(
        agent.calls("b"),
        ["before_workload_start false", "before_workload_stop true"]
    );
    assert_eq!(
        agent.calls("a"),
        ["before_workload_start false", "before_workload_stop true"]
    );
    let log = agent.log_of("a1");
    assert_eq!(log.last().unwrap()["code"], "cancelled", "{log:?}");
    let undo: Vec<_> = hook_records(&log)
        .into_iter()
        .filter(|(k, p, _)| k == "hook_succeeded" && p == "before_workload_stop")
        .map(|(_, _, o)| o)
        .collect();
    assert_eq!(undo, ["b", "a"]);
    assert!(agent.log_of("s1").is_empty(), "s1 never reached the log");
    assert_eq!(web(&agent)["starts"], 0);
    // Nothing is left for a restart to compensate.
    let applied = agent.recover();
    assert_eq!(applied.exit, Exit::OK, "{applied}");
    assert_eq!(agent.calls("a").len(), 2);
}

#[test]
fn sigint_while_waiting_for_input_stops_at_once_with_130() {
    stops_while_waiting_for_input(libc::SIGINT, 130);
}

#[test]
fn sigusr2_while_waiting_for_input_stops_at_once_with_140() {
    stops_while_waiting_for_input(libc::SIGUSR2, 140);
}

/// `apply` answers a first line, then, blocked reading stdin, gets `signal`: it exits
/// `code` at once (README's exit codes), a clean exit, not the signal's default action.
fn stops_while_waiting_for_input(signal: i32, code: i32) {
    let agent = Agent::builder("h1").without_hooks().build();
    let c = agent.commands("ns");
    let mut apply = agent.start_apply(None);
    let mut stdin = apply.stdin();
    let stdout = apply.stdout_lines();
    writeln!(stdin, "{}", c.ensure_namespace("ns")).unwrap();
    stdin.flush().unwrap();
    let line = stdout
        .next_line("the result of ns")
        .expect("a result line before the end of stdout");
    assert!(line.contains(r#""outcome":"succeeded""#), "{line}");
    // stdin stays open: apply is blocked reading it.
    send_signal(apply.id(), signal);
    apply.wait_expecting(Exit::Code(code));
    drop(stdin);
}
