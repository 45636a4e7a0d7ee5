//! A crash (SIGKILL) between two owners' `before_workload_start`: on restart the
//! agent compensates the owners that began, completes the command as `interrupted`,
//! and the log shows which owners were compensated.

use capstan_tests::hooks::{activate, command, hook_records, staging, HookAgent, Owner};

#[test]
fn a_crash_between_two_owners_is_compensated_on_restart() {
    let phases = &["before_workload_start", "before_workload_stop"];
    let agent = HookAgent::new(&[
        Owner::plain("a", phases),
        Owner {
            name: "b",
            phases,
            // The first time b is asked to prepare, it kills the agent (its parent).
            body: r#"if [ "$phase" = before_workload_start ] && [ ! -e "$(dirname "$0")/crashed" ]; then
  touch "$(dirname "$0")/crashed"; kill -KILL $PPID; exit 1
fi"#,
            timeout: None,
        },
        Owner::plain("c", phases),
    ]);
    let mut lines = staging("");
    lines.push(activate("a1"));
    let out = agent.apply(&lines);
    assert_eq!(out.status.code(), None, "the agent was killed: {out:?}");
    assert!(agent.calls("c").is_empty());
    // Restart: recovery runs before any new command.
    let out = agent.apply(&[]);
    assert!(out.status.success(), "{out:?}");
    let log = agent.log(Some("a1"));
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
    assert_eq!(agent.sim_host()["revisions"]["ns/web@r1"]["starts"], 0);
    // A retry under a new id goes through.
    let out = agent.apply(&[activate("a2")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        agent.sim_host()["revisions"]["ns/web@r1"]["state"],
        "running"
    );
}

#[test]
fn a_crash_in_the_middle_of_a_revocation_finishes_the_teardown_on_restart() {
    let phases = &["before_workload_start", "before_workload_stop"];
    let agent = HookAgent::new(&[
        Owner::plain("a", phases),
        Owner {
            name: "b",
            phases,
            // The first time b is asked to revoke, it kills the agent (its parent).
            body: r#"if [ "$phase" = before_workload_stop ] && [ ! -e "$(dirname "$0")/crashed" ]; then
  touch "$(dirname "$0")/crashed"; kill -KILL $PPID; exit 1
fi"#,
            timeout: None,
        },
    ]);
    let mut lines = staging("");
    lines.push(activate("a1"));
    lines.push(command(
        "s1",
        "stop_workload",
        r#""namespace":"ns","workload":"web""#,
    ));
    let out = agent.apply(&lines);
    assert_eq!(out.status.code(), None, "the agent was killed: {out:?}");
    assert_eq!(
        agent.sim_host()["revisions"]["ns/web@r1"]["state"],
        "running"
    );
    assert!(!agent
        .calls("a")
        .contains(&"before_workload_stop false".to_string()));
    let out = agent.apply(&[]);
    assert!(out.status.success(), "{out:?}");
    // Revocations are idempotent: the phase is simply run again, then the stop.
    assert_eq!(
        agent.sim_host()["revisions"]["ns/web@r1"]["state"],
        "stopped"
    );
    let log = agent.log(Some("s1"));
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
