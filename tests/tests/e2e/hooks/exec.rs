//! Exec hooks end to end: real hook scripts called by `capstan-agent apply` on the
//! sim driver. (docker projection: `hooks::docker`; systemd: `systemd::agent`.)

use super::{rollout, web};
use capstan_tests::agent::Agent;
use capstan_tests::hooks::{hook_records, Hook};
use capstan_tests::process::Exit;

const ALL: &[&str] = &[
    "after_namespace_prepared",
    "before_workload_start",
    "before_workload_stop",
    "before_namespace_delete",
];

#[test]
fn the_placeholder_reaches_the_sim_hosts_recorded_env_and_never_the_log() {
    let iam = r#"printf '%s' "$req" > "$(dirname "$0")/request-$phase"
[ "$phase" = before_workload_start ] && echo '{"env":{"DB_TOKEN":"opaque-db.tok:42"}}'
exit 0"#;
    let net = r#"[ "$phase" = before_workload_start ] && echo '{"env":{"NET_ID":"opaque-net-7"}}'
exit 0"#;
    let agent = Agent::builder("h1")
        .hook(Hook::new("iam", ALL, iam))
        .hook(Hook::new("net", ALL, net))
        .build();
    let (_, lines) = rollout(&agent, &[("PLAIN", "value")]);
    let applied = agent.apply_ok(&lines);
    let env = &web(&agent)["env"];
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
    let log = agent.log();
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
    assert!(
        !applied.stderr.contains("opaque-"),
        "nor traced: {}",
        applied.stderr
    );
}

#[test]
fn a_failing_hook_is_named_by_phase_and_owner_never_by_its_words() {
    let vault = r#"if [ "$phase" = before_workload_start ]; then
  echo '{"error":"token hunter2-SECRET for https://vault.internal"}'
  echo 'hunter2-SECRET' >&2
  exit 7
fi"#;
    let agent = Agent::builder("h1")
        .hook(Hook::plain("iam", ALL))
        .hook(Hook::new("vault", ALL, vault))
        .build();
    let (_, lines) = rollout(&agent, &[]);
    let applied = agent.apply(&lines);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let r = applied.result("a1");
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
    let everything = format!("{applied}{}", serde_json::to_string(&agent.log()).unwrap());
    assert!(!everything.contains("hunter2"), "the hook's words leaked");
    assert!(
        !everything.contains("vault.internal"),
        "the hook's words leaked"
    );
    assert_eq!(web(&agent)["starts"], 0);
}

#[test]
fn a_hanging_exec_hook_is_killed_at_its_timeout_and_counts_as_failed() {
    let slow = r#"[ "$phase" = before_workload_start ] || exit 0
sleep 3600 &
echo $! > "$(dirname "$0")/sleeper.pid"
wait"#;
    let agent = Agent::builder("h1")
        .hook(
            Hook::new(
                "slow",
                &["before_workload_start", "before_workload_stop"],
                slow,
            )
            .timeout(3.0),
        )
        .build();
    let (_, lines) = rollout(&agent, &[]);
    let applied = agent.apply(&lines);
    let r = applied.result("a1");
    assert_eq!(r["error"]["code"], "hook_failed", "{applied}");
    let message = r["error"]["message"].as_str().unwrap();
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
    let failed = hook_records(&agent.log_of("a1")).into_iter().any(|r| {
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
    // net fails its first before_workload_stop, then recovers.
    let net = r#"if [ "$phase" = before_workload_stop ] && [ ! -e "$(dirname "$0")/net-failed" ]; then
  touch "$(dirname "$0")/net-failed"; exit 1
fi"#;
    let agent = Agent::builder("h1")
        .hook(Hook::plain("iam", ALL))
        .hook(Hook::new("net", ALL, net))
        .build();
    let (c, mut lines) = rollout(&agent, &[]);
    lines.push(c.stop("s1", "web"));
    let applied = agent.apply(&lines);
    let r = applied.result("s1");
    assert_eq!(r["error"]["code"], "hook_failed", "{applied}");
    assert_eq!(r["retryable"], true);
    assert_eq!(web(&agent)["state"], "running");
    assert!(
        !agent
            .calls("iam")
            .contains(&"before_workload_stop false".to_string()),
        "teardown stopped at net"
    );
    agent.apply_ok(&[c.stop("s2", "web")]);
    assert_eq!(web(&agent)["state"], "stopped");
    assert_eq!(
        agent.calls("iam").last().unwrap(),
        "before_workload_stop false"
    );
}
