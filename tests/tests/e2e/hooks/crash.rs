//! A crash (SIGKILL) between two owners' `before_workload_start`: on restart the
//! agent compensates the owners that began, completes the command as `interrupted`,
//! and the log shows which owners were compensated.

use super::{rollout, web};
use capstan_tests::agent::Agent;
use capstan_tests::hooks::{hook_records, Hook};
use capstan_tests::process::Exit;

const PHASES: &[&str] = &["before_workload_start", "before_workload_stop"];

/// Owner `b`, which kills the agent (its parent) the first time it is called in
/// `phase`.
fn killer(phase: &str) -> Hook {
    let body = format!(
        r#"if [ "$phase" = {phase} ] && [ ! -e "$(dirname "$0")/crashed" ]; then
  touch "$(dirname "$0")/crashed"; kill -KILL $PPID; exit 1
fi"#
    );
    Hook::new("b", PHASES, &body)
}

#[test]
fn a_crash_between_two_owners_is_compensated_on_restart() {
    let agent = Agent::builder("h1")
        .hook(Hook::plain("a", PHASES))
        .hook(killer("before_workload_start"))
        .hook(Hook::plain("c", PHASES))
        .build();
    let (c, lines) = rollout(&agent, &[]);
    let applied = agent.apply(&lines);
    assert_eq!(
        applied.exit,
        Exit::KILLED,
        "the agent was killed: {applied}"
    );
    assert!(agent.calls("c").is_empty());
    // Restart: recovery runs before any new command.
    let applied = agent.recover();
    assert_eq!(applied.exit, Exit::OK, "{applied}");
    let log = agent.log_of("a1");
    let hooks: Vec<_> = hook_records(&log)
        .into_iter()
        .map(|(k, p, o)| format!("{k} {p} {o}"))
        .collect();
    assert_eq!(
        hooks,
        [
            "hook_started before_workload_start a",
            "hook_succeeded before_workload_start a",
            "hook_started before_workload_start b",
            // After the restart: every owner that began, in reverse.
            "hook_started before_workload_stop b",
            "hook_succeeded before_workload_stop b",
            "hook_started before_workload_stop a",
            "hook_succeeded before_workload_stop a",
        ]
    );
    let done = log.last().unwrap();
    assert_eq!(done["kind"], "command_completed");
    assert_eq!(done["outcome"], "failed");
    assert_eq!(done["code"], "interrupted");
    assert_eq!(
        agent.calls("a"),
        ["before_workload_start false", "before_workload_stop true"]
    );
    assert!(agent.calls("c").is_empty(), "c never began");
    assert_eq!(web(&agent)["starts"], 0);
    // A retry under a new id goes through.
    agent.apply_ok(&[c.activate("a2", "web", "r1")]);
    assert_eq!(web(&agent)["state"], "running");
}

#[test]
fn a_crash_in_the_middle_of_a_revocation_finishes_the_teardown_on_restart() {
    let agent = Agent::builder("h1")
        .hook(Hook::plain("a", PHASES))
        .hook(killer("before_workload_stop"))
        .build();
    let (c, mut lines) = rollout(&agent, &[]);
    lines.push(c.stop("s1", "web"));
    let applied = agent.apply(&lines);
    assert_eq!(
        applied.exit,
        Exit::KILLED,
        "the agent was killed: {applied}"
    );
    assert_eq!(web(&agent)["state"], "running");
    assert!(!agent
        .calls("a")
        .contains(&"before_workload_stop false".to_string()));
    let applied = agent.recover();
    assert_eq!(applied.exit, Exit::OK, "{applied}");
    // Revocations are idempotent: the phase is simply run again, then the stop.
    assert_eq!(web(&agent)["state"], "stopped");
    let log = agent.log_of("s1");
    let done = log.last().unwrap();
    assert_eq!(done["kind"], "command_completed");
    assert_eq!(done["outcome"], "succeeded");
    assert_eq!(
        agent.calls("b"),
        [
            "before_workload_start false",
            "before_workload_stop false",
            "before_workload_stop false"
        ]
    );
    assert_eq!(
        agent.calls("a").last().unwrap(),
        "before_workload_stop false"
    );
}
