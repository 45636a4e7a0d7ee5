//! Exec hooks end to end: real hook scripts called by `capstan-agent apply` on the
//! sim driver. (docker projection: `hooks_docker.rs`; systemd: pending that driver.)

use capstan_tests::hooks::{activate, command, hook_records, staging, HookAgent, Owner};

const ALL: &[&str] = &[
    "after_namespace_prepared",
    "before_workload_start",
    "before_workload_stop",
    "before_namespace_delete",
];

#[test]
fn the_placeholder_reaches_the_sim_hosts_recorded_env_and_never_the_log() {
    let agent = HookAgent::new(&[
        Owner {
            name: "iam",
            phases: ALL,
            body: r#"printf '%s' "$req" > "$(dirname "$0")/request-$phase"
[ "$phase" = before_workload_start ] && echo '{"env":{"DB_TOKEN":"opaque-db.tok:42"}}'
exit 0"#,
            timeout: None,
        },
        Owner {
            name: "net",
            phases: ALL,
            body: r#"[ "$phase" = before_workload_start ] && echo '{"env":{"NET_ID":"opaque-net-7"}}'
exit 0"#,
            timeout: None,
        },
    ]);
    let mut lines = staging(r#""PLAIN":"value""#);
    lines.push(activate("a1"));
    let out = agent.apply(&lines);
    assert!(out.status.success(), "{out:?}");
    let env = &agent.sim_host()["revisions"]["ns/web@r1"]["env"];
    assert_eq!(env["DB_TOKEN"], "opaque-db.tok:42");
    assert_eq!(env["NET_ID"], "opaque-net-7");
    assert_eq!(env["PLAIN"], "value");
    // The request the hook read on stdin.
    let req: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(agent.path("request-before_workload_start")).unwrap(),
    )
    .unwrap();
    assert_eq!(req["v"], 1);
    assert_eq!(req["owner"], "iam");
    assert_eq!(req["host"], "h1");
    assert_eq!(req["command_id"], "a1");
    assert_eq!(req["namespace"], "ns");
    assert_eq!(req["workload"], "web");
    assert_eq!(req["revision"], "r1");
    assert_eq!(req["compensating"], false);
    // Order: config order for preparing phases.
    let log = agent.log(None);
    let started: Vec<_> = hook_records(&log)
        .into_iter()
        .filter(|r| r.0 == "hook_started" && r.1 == "before_workload_start")
        .map(|r| r.2)
        .collect();
    assert_eq!(started, ["iam", "net"]);
    let text = serde_json::to_string(&log).unwrap();
    assert!(
        !text.contains("opaque-"),
        "launch env values are never logged"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("opaque-"), "nor traced: {stderr}");
}

#[test]
fn a_failing_hook_is_named_by_phase_and_owner_never_by_its_words() {
    let agent = HookAgent::new(&[
        Owner::plain("iam", ALL),
        Owner {
            name: "vault",
            phases: ALL,
            body: r#"if [ "$phase" = before_workload_start ]; then
  echo '{"error":"token hunter2-SECRET for https://vault.internal"}'
  echo 'hunter2-SECRET' >&2
  exit 7
fi"#,
            timeout: None,
        },
    ]);
    let mut lines = staging("");
    lines.push(activate("a1"));
    let out = agent.apply(&lines);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let results = HookAgent::results(&out);
    let r = &results[2];
    assert_eq!(r["outcome"], "failed");
    assert_eq!(r["error"]["code"], "hook_failed");
    assert_eq!(r["retryable"], true);
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("before_workload_start hook of owner vault failed"),
        "{message}"
    );
    assert_eq!(
        agent.calls("iam").last().unwrap(),
        "before_workload_stop true"
    );
    assert_eq!(
        agent.calls("vault"),
        [
            "after_namespace_prepared false",
            "before_workload_start false"
        ]
    );
    let everything = format!(
        "{}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        serde_json::to_string(&agent.log(None)).unwrap()
    );
    assert!(!everything.contains("hunter2"), "the hook's words leaked");
    assert!(
        !everything.contains("vault.internal"),
        "the hook's words leaked"
    );
    assert_eq!(agent.sim_host()["revisions"]["ns/web@r1"]["starts"], 0);
}

#[test]
fn a_hanging_exec_hook_is_killed_at_its_timeout_and_counts_as_failed() {
    let agent = HookAgent::new(&[Owner {
        name: "slow",
        phases: &["before_workload_start"],
        body: r#"sleep 3600 &
echo $! > "$(dirname "$0")/sleeper.pid"
wait"#,
        timeout: Some(3.0),
    }]);
    let mut lines = staging("");
    lines.push(activate("a1"));
    let out = agent.apply(&lines);
    let results = HookAgent::results(&out);
    assert_eq!(results[2]["error"]["code"], "hook_failed", "{out:?}");
    let message = results[2]["error"]["message"].as_str().unwrap();
    assert!(message.contains("owner slow timed out"), "{message}");
    let pid = std::fs::read_to_string(agent.path("sleeper.pid")).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|s| s.split_whitespace().next());
    assert!(
        matches!(state, None | Some("Z") | Some("X")),
        "the hook's process group was not killed: {stat}"
    );
    let failed = hook_records(&agent.log(Some("a1"))).into_iter().any(|r| {
        r == (
            "hook_failed".into(),
            "before_workload_start".into(),
            "slow".into(),
        )
    });
    assert!(failed);
}

#[test]
fn a_revocation_failure_keeps_the_workload_running_until_a_retry() {
    let agent = HookAgent::new(&[
        Owner::plain("iam", ALL),
        Owner {
            name: "net",
            phases: ALL,
            // Fails its first before_workload_stop, then recovers.
            body: r#"if [ "$phase" = before_workload_stop ] && [ ! -e "$(dirname "$0")/net-failed" ]; then
  touch "$(dirname "$0")/net-failed"; exit 1
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
    let results = HookAgent::results(&out);
    assert_eq!(results[3]["error"]["code"], "hook_failed", "{out:?}");
    assert_eq!(results[3]["retryable"], true);
    assert_eq!(
        agent.sim_host()["revisions"]["ns/web@r1"]["state"],
        "running"
    );
    assert!(
        !agent
            .calls("iam")
            .contains(&"before_workload_stop false".to_string()),
        "teardown stopped at net"
    );
    let out = agent.apply(&[command(
        "s2",
        "stop_workload",
        r#""namespace":"ns","workload":"web""#,
    )]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        agent.sim_host()["revisions"]["ns/web@r1"]["state"],
        "stopped"
    );
    assert_eq!(
        agent.calls("iam").last().unwrap(),
        "before_workload_stop false"
    );
}
