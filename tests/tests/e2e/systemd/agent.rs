//! The agent on the systemd driver, against a real systemd: commands through `apply`,
//! hooks' placeholders reaching the process and never the log, agent restarts that leave units alone (or stop and
//! start them when the agent manages their lifecycle), a crash loop reported once
//! systemd gives up, failed starts and hostile specs. The driver called directly is
//! `driver.rs`.

use super::{
    argv, dump, dump_file, spec_crashing_once_flagged, spec_hostile, spec_running,
    start_crash_loop, systemd_own,
};
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::command::Spec;
use capstan_tests::hooks::{hook_records, Hook};
use capstan_tests::process::{Exit, Process};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{unique, wait_until, READY};
use serde_json::Value;
use std::collections::BTreeMap;

const ALL: &[&str] = &[
    "after_namespace_prepared",
    "before_workload_start",
    "before_workload_stop",
    "before_namespace_delete",
];

/// An agent named `name` (made unique) on `host`'s systemd.
fn agent(host: &SystemdHost, name: &str) -> AgentBuilder {
    Agent::builder(&unique(name)).systemd(host)
}

/// Owner `name`, in every phase: contributes `var=value` to every start.
fn owner(name: &str, var: &str, value: &str) -> Hook {
    let body = format!(
        "[ \"$phase\" = before_workload_start ] && echo '{{\"env\":{{\"{var}\":\"{value}\"}}}}'\nexit 0"
    );
    Hook::new(name, ALL, &body)
}

fn iam() -> Hook {
    owner("iam", "DB_TOKEN", "opaque-db.tok:42")
}

fn net() -> Hook {
    owner("net", "NET_ID", "opaque-net-7")
}

/// `ns/workload@revision`'s spec: `capstan-envdump` with two env variables of its own.
fn spec(host: &SystemdHost, workload: &str, revision: &str) -> Spec {
    Spec::from(spec_running(host, "ns", workload))
        .env("MODE", "spec \"quoted\" $HOME %h")
        .env("REV", revision)
}

fn unit(workload: &str, revision: &str) -> String {
    naming::unit_name(RevisionRef {
        namespace: "ns",
        workload,
        revision,
    })
}

/// What the process's environment holds besides systemd's own variables.
fn own_env(env: &Value) -> BTreeMap<String, String> {
    env.as_object()
        .unwrap_or_else(|| panic!("env is an object: {env}"))
        .iter()
        .filter(|(name, _)| !systemd_own(name))
        .map(|(name, value)| {
            let value = value
                .as_str()
                .unwrap_or_else(|| panic!("{name} is UTF-8: {value}"));
            (name.clone(), value.to_string())
        })
        .collect()
}

fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Waits for `workload`'s dump (removing it, so the next start's is waited for) and
/// asserts its argv and environment are exactly `env` plus systemd's own; returns
/// its pid.
#[track_caller]
fn running_with(host: &SystemdHost, workload: &str, env: &BTreeMap<String, String>) -> u64 {
    let seen = dump(host, "ns", workload);
    std::fs::remove_file(dump_file(host, "ns", workload)).expect("remove the dump");
    let wanted = spec_running(host, "ns", workload).command;
    assert_eq!(argv(&seen), wanted, "argv");
    assert_eq!(&own_env(&seen["env"]), env, "the process's environment");
    seen["pid"].as_u64().expect("pid")
}

/// The parts of intent the controller owns (not `applied_seq`).
fn owned_intent(a: &Agent) -> (Value, Value) {
    let i = a.intent();
    (i["namespaces"].clone(), i["workloads"].clone())
}

/// The daemon's "startup reconciliation done" line's fields.
fn reconciled(daemon: &Process) -> Value {
    daemon.wait_for_line("startup reconciliation done", |l| {
        l["fields"]["message"] == "startup reconciliation done"
    })["fields"]
        .clone()
}

#[track_caller]
fn assert_reconciled(daemon: &Process, started: u64) {
    let fields = reconciled(daemon);
    for (key, want) in [
        ("started", started),
        ("stopped", 0),
        ("failed", 0),
        ("drift", 0),
    ] {
        assert_eq!(fields[key], want, "{key}: {fields}");
    }
}

/// The process environment of `unit`'s main process now, read from `/proc`.
fn process_env(host: &SystemdHost, unit: &str) -> Vec<String> {
    let pid = host.property(unit, "MainPID");
    let out = host.nsenter(&["cat", &format!("/proc/{pid}/environ")]);
    assert!(out.status.success(), "read the environ of {pid}");
    out.stdout
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

#[test]
fn a_rollout_through_the_agent_runs_each_start_with_the_spec_env_and_both_placeholders() {
    let host = SystemdHost::boot();
    let a = agent(&host, "sdroll").hook(iam()).hook(net()).build();
    let c = a.commands("ns");
    let (u1, u2) = (unit("web", "r1"), unit("web", "r2"));
    let with = |rev: &str| {
        env_of(&[
            ("MODE", "spec \"quoted\" $HOME %h"),
            ("REV", rev),
            ("DB_TOKEN", "opaque-db.tok:42"),
            ("NET_ID", "opaque-net-7"),
        ])
    };
    let mut outputs = Vec::new();

    outputs.push(a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", spec(&host, "web", "r1")),
    ]));
    assert!(host.unit_dir().join(naming::slice_name("ns")).exists());
    // systemd makes the namespace's state directory when a unit of it first starts.
    assert!(!host.inside(&host.state_dir().join("ns")).exists());
    assert_eq!(
        host.property(&u1, "ActiveState"),
        "inactive",
        "prepared, not started"
    );
    assert!(!dump_file(&host, "ns", "web").exists());

    outputs.push(a.apply_ok(&[c.activate("a1", "web", "r1")]));
    let first = running_with(&host, "web", &with("r1"));
    assert!(host.inside(&host.state_dir().join("ns")).is_dir());

    outputs.push(a.apply_ok(&[c.stop("s1", "web")]));
    assert_eq!(host.property(&u1, "ActiveState"), "inactive");

    outputs.push(a.apply_ok(&[c.start("st1", "web")]));
    let second = running_with(&host, "web", &with("r1"));
    assert_ne!(second, first, "started again");

    outputs.push(a.apply_ok(&[
        c.prepare("p2", "web", "r2", spec(&host, "web", "r2")),
        c.activate("a2", "web", "r2"),
    ]));
    running_with(&host, "web", &with("r2"));
    assert_eq!(
        host.property(&u1, "ActiveState"),
        "inactive",
        "r2 replaced r1"
    );
    assert_eq!(host.property(&u2, "ActiveState"), "active");
    let entered = host.property(&u2, "ActiveEnterTimestamp");

    outputs.push(a.apply_ok(&[c.retire("x1", "web", "r1")]));
    assert!(!host.unit_dir().join(&u1).exists(), "r1's unit is gone");
    assert!(!host.unit_dir().join(naming::dropin_dir(&u1)).exists());
    assert_eq!(host.property(&u2, "ActiveState"), "active");
    assert_eq!(
        host.property(&u2, "ActiveEnterTimestamp"),
        entered,
        "retiring r1 left r2 alone"
    );

    outputs.push(a.apply_ok(&[
        c.stop("s2", "web"),
        c.retire("x2", "web", "r2"),
        c.delete_namespace("dn"),
    ]));
    let left: Vec<String> = std::fs::read_dir(host.unit_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "nothing of ours is left: {left:?}");
    assert!(!host.inside(&host.state_dir().join("ns")).exists());
    assert!(
        !super::private_state(&host, "ns").exists(),
        "its state is gone"
    );
    assert_eq!(host.property(&u2, "LoadState"), "not-found");
    let intent = a.intent();
    assert_eq!(intent["namespaces"], serde_json::json!({}), "{intent}");

    // Each owner was called in each phase, in config order to prepare and in reverse
    // to revoke.
    let log = a.log();
    let calls: Vec<(String, String)> = hook_records(&log)
        .into_iter()
        .filter(|r| r.0 == "hook_started")
        .map(|r| (r.1, r.2))
        .collect();
    let pair = |phase: &str, owner: &str| (phase.to_string(), owner.to_string());
    let (start, stop) = ("before_workload_start", "before_workload_stop");
    assert_eq!(
        calls,
        [
            pair("after_namespace_prepared", "iam"),
            pair("after_namespace_prepared", "net"),
            pair(start, "iam"),
            pair(start, "net"),
            pair(stop, "net"),
            pair(stop, "iam"),
            pair(start, "iam"),
            pair(start, "net"),
            pair(start, "iam"),
            pair(start, "net"),
            // activating r2 revokes r1 once r2 runs
            pair(stop, "net"),
            pair(stop, "iam"),
            // retire r1: a revision that does not run still has its access revoked
            pair(stop, "net"),
            pair(stop, "iam"),
            pair(stop, "net"),
            pair(stop, "iam"),
            pair(stop, "net"),
            pair(stop, "iam"),
            pair("before_namespace_delete", "net"),
            pair("before_namespace_delete", "iam"),
        ],
        "hook calls"
    );
    // Placeholder reaches the workload env, never the log (nor the agent's output).
    let text = format!(
        "{}{}",
        serde_json::to_string(&log).unwrap(),
        outputs.iter().map(ToString::to_string).collect::<String>()
    );
    for value in ["opaque-db.tok:42", "opaque-net-7", "opaque-"] {
        assert!(!text.contains(value), "{value} reached the log or output");
    }
}

#[test]
fn agent_restarts_rebuild_intent_from_the_log_and_leave_the_units_running() {
    let host = SystemdHost::boot();
    let a = agent(&host, "sdkeep").hook(iam()).build();
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web"], "r1", |r| spec(&host, "web", r)));
    let u = unit("web", "r1");
    let seen = dump(&host, "ns", "web");
    let pid = seen["pid"].to_string();
    assert_eq!(host.property(&u, "MainPID"), pid);
    let entered = host.property(&u, "ActiveEnterTimestamp");
    let intent = owned_intent(&a);
    assert_eq!(intent.1["ns/web"]["intent"], "running", "{intent:?}");

    // A crash, then a graceful stop, then another start: none touches the unit.
    let daemon = a.run();
    assert_reconciled(&daemon, 0);
    daemon.kill();
    assert_eq!(
        owned_intent(&a),
        intent,
        "rebuilt from the log after a kill"
    );
    let daemon = a.run();
    assert_reconciled(&daemon, 0);
    daemon.stop();
    assert_eq!(owned_intent(&a), intent, "a shutdown never changes intent");
    let daemon = a.run();
    assert_reconciled(&daemon, 0);
    daemon.stop();
    assert_eq!(owned_intent(&a), intent);

    assert_eq!(host.property(&u, "ActiveState"), "active");
    assert_eq!(
        host.property(&u, "ActiveEnterTimestamp"),
        entered,
        "never restarted"
    );
    assert_eq!(host.property(&u, "MainPID"), pid, "the same process");
    assert_eq!(host.property(&u, "NRestarts"), "0");
    let env = process_env(&host, &u);
    assert!(
        env.iter().any(|v| v == "DB_TOKEN=opaque-db.tok:42"),
        "the placeholder is still in the process's env: {env:?}"
    );
    assert!(env.iter().any(|v| v == "REV=r1"), "{env:?}");
    for kind in [
        "workload_stopped",
        "workload_exited",
        "workload_failed",
        "drift_detected",
    ] {
        assert_eq!(a.events(kind), Vec::<Value>::new(), "{kind}");
    }
    assert_eq!(a.events("workload_started").len(), 1, "the activation only");
}

#[test]
fn with_managed_lifecycle_sigterm_stops_running_units_and_startup_starts_them() {
    let host = SystemdHost::boot();
    let a = agent(&host, "sdmanage")
        .systemd_lifecycle(true)
        .hook(iam())
        .build();
    let c = a.commands("ns");
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("pa", "a", "r1", spec(&host, "a", "r1")),
        c.activate("aa", "a", "r1"),
        c.prepare("pb", "b", "r1", spec(&host, "b", "r1")),
        c.activate("ab", "b", "r1"),
        c.stop("sb", "b"),
    ]);
    let (ua, ub) = (unit("a", "r1"), unit("b", "r1"));
    let with = env_of(&[
        ("MODE", "spec \"quoted\" $HOME %h"),
        ("REV", "r1"),
        ("DB_TOKEN", "opaque-db.tok:42"),
    ]);
    let first = running_with(&host, "a", &with);
    assert_eq!(host.property(&ub, "ActiveState"), "inactive");
    let intent = owned_intent(&a);

    let daemon = a.run();
    assert_reconciled(&daemon, 0);
    daemon.stop();
    assert_eq!(
        host.property(&ua, "ActiveState"),
        "inactive",
        "SIGTERM stopped A"
    );
    assert_eq!(host.property(&ub, "ActiveState"), "inactive");
    assert_eq!(owned_intent(&a), intent, "a shutdown never changes intent");

    let daemon = a.run();
    assert_reconciled(&daemon, 1);
    assert_eq!(host.property(&ua, "ActiveState"), "active");
    let again = running_with(&host, "a", &with);
    assert_ne!(again, first, "a new process, with the placeholder it had");
    assert_eq!(
        host.property(&ub, "ActiveState"),
        "inactive",
        "B stays stopped"
    );
    daemon.stop();
    assert_eq!(host.property(&ua, "ActiveState"), "inactive");
    assert_eq!(owned_intent(&a), intent);

    let by = |kind: &str, cause: &str| -> Vec<Value> {
        a.events(kind)
            .into_iter()
            .filter(|e| e["cause"] == cause)
            .collect()
    };
    let started = by("workload_started", "agent_startup");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["workload"], "a");
    let stopped = by("workload_stopped", "agent_shutdown");
    assert_eq!(stopped.len(), 2, "one per SIGTERM: {stopped:?}");
    assert!(stopped.iter().all(|e| e["workload"] == "a"), "{stopped:?}");
    assert_eq!(a.events("workload_exited"), Vec::<Value>::new());
}

#[test]
fn a_crash_loop_under_a_running_agent_is_recorded_until_systemd_gives_up() {
    let host = SystemdHost::boot();
    let a = agent(&host, "sdcrash").systemd_tuning(3, 100).build();
    let c = a.commands("ns");
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare(
            "p1",
            "crash",
            "r1",
            spec_crashing_once_flagged(&host, "ns", "crash").into(),
        ),
        c.activate("a1", "crash", "r1"),
    ]);
    dump(&host, "ns", "crash");
    let daemon = a.run();
    start_crash_loop(&host, "ns", "crash", &unit("crash", "r1"));
    let u = unit("crash", "r1");
    wait_until(
        format_args!("{u} to be failed; systemd's log:\n{}", host.log()),
        READY,
        || host.property(&u, "ActiveState") == "failed",
    );
    daemon.wait_for_text("the backend gave up on it");
    daemon.stop();

    let log = a.log();
    let of = |kind: &str| -> Vec<&Value> { log.iter().filter(|r| r["kind"] == kind).collect() };
    let exits = of("workload_exited");
    let failed = of("workload_failed");
    assert_eq!(failed.len(), 1, "reported once: {failed:#?}");
    let failed = failed[0];
    assert_eq!(failed["cause"], "supervisor", "{failed}");
    assert_eq!(failed["code"], "backend_failed", "{failed}");
    // systemd's own words for it: the unit's Result, and how often it restarted it.
    let message = failed["message"].as_str().unwrap();
    let result = host.property(&u, "Result");
    let restarts = host.property(&u, "NRestarts");
    assert!(
        message.contains(&format!("{result} after {restarts} restarts")),
        "{message}"
    );
    let before: Vec<&&Value> = exits
        .iter()
        .filter(|e| e["seq"].as_u64() < failed["seq"].as_u64())
        .collect();
    assert!(
        before.len() >= 3,
        "each of the 3 runs' exits before the failure: {exits:#?}"
    );
    // The kill (status 9), then the runs that exit 3.
    for (i, e) in exits.iter().enumerate() {
        assert_eq!(e["workload"], "crash", "{e}");
        assert_eq!(e["revision"], "r1", "{e}");
        assert_eq!(e["exit_code"], if i == 0 { 9 } else { 3 }, "{e}");
    }
    let intent = a.intent();
    let w = &intent["workloads"]["ns/crash"];
    assert_eq!(w["intent"], "running", "giving up does not change intent");
    assert_eq!(w["failed"], "backend_failed");

    // systemd stopped at its start limit: three runs, and it stays failed.
    assert_eq!(host.property(&u, "ActiveState"), "failed");
    assert_eq!(restarts, "3", "burst 3: the first run and 3 restarts asked");
    let starts = host
        .journal(&["-u", &u, "-o", "cat"])
        .lines()
        .filter(|l| l.starts_with("Started "))
        .count();
    assert_eq!(starts, 3, "{}", host.log());
}

#[test]
fn a_start_systemd_refuses_fails_the_command_with_its_results_and_the_agent_carries_on() {
    let host = SystemdHost::boot();
    // A quick RestartSec=, so that a unit systemd kept retrying would show it.
    let a = agent(&host, "sdfail").systemd_tuning(10, 100).build();
    let c = a.commands("ns");
    let mut bad = spec_running(&host, "ns", "bad");
    // A program that is not there: the start job fails (`Type=exec`).
    bad.command[0] = "/nonexistent/capstan-envdump".into();
    let applied = a.apply(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "bad", "r1", bad.into()),
        c.activate("a1", "bad", "r1"),
        c.prepare("p2", "good", "r1", spec(&host, "good", "r1")),
        c.activate("a2", "good", "r1"),
    ]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let r = applied.result("a1");
    assert_eq!(r["outcome"], "failed", "{r}");
    assert_eq!(r["error"]["code"], "driver_failed", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("`failed`"), "the job result: {message}");
    assert!(
        message.contains("exit-code"),
        "the unit's Result: {message}"
    );
    for id in ["ns", "p1", "p2", "a2"] {
        assert_eq!(applied.result(id)["outcome"], "succeeded", "{applied}");
    }
    running_with(
        &host,
        "good",
        &env_of(&[("MODE", "spec \"quoted\" $HOME %h"), ("REV", "r1")]),
    );
    let intent = a.intent();
    let w = &intent["workloads"]["ns/bad"];
    assert_ne!(w["active_revision"], "r1", "{w}");
    // The command failed, so systemd must not keep trying (`Restart=on-failure`): a
    // later success would run a revision the agent reported as not activated.
    let bad = unit("bad", "r1");
    let state = host.property(&bad, "ActiveState");
    assert!(matches!(state.as_str(), "inactive" | "failed"), "{state}");
    assert_eq!(host.property(&bad, "NRestarts"), "0", "{}", host.log());
}

#[test]
fn hostile_specs_through_the_agent_reach_the_process_byte_for_byte_or_are_refused() {
    let host = SystemdHost::boot();
    let a = agent(&host, "sdhostile").build();
    let c = a.commands("ns");

    // Accepted at intake, but no unit file can carry them.
    let mut program = spec_running(&host, "ns", "prog");
    program.command[0] = format!("{}/$HOME", host.state_dir().display());
    let mut quote = spec_running(&host, "ns", "quote");
    quote.command[0] = format!("{}/it's", host.state_dir().display());
    let mut big = spec_running(&host, "ns", "big");
    // 140 KiB of JSON, twice that as a unit-file line (`%` is written `%%`).
    big.env.insert("BIG".into(), "%".repeat(140 * 1024));
    let refused = a.apply(&[
        c.ensure_namespace("ns"),
        c.prepare("prog", "prog", "r1", program.into()),
        c.prepare("quote", "quote", "r1", quote.into()),
        c.prepare("big", "big", "r1", big.into()),
    ]);
    assert_eq!(refused.exit, Exit::Code(1), "{refused}");
    for (id, code) in [
        ("prog", "invalid_spec"),
        ("quote", "invalid_spec"),
        ("big", "invalid_env"),
    ] {
        let r = refused.result(id);
        assert_eq!(r["outcome"], "failed", "{r}");
        assert_eq!(r["error"]["code"], code, "{r}");
        assert!(
            !host.unit_dir().join(unit(id, "r1")).exists(),
            "{id}: no unit written"
        );
    }

    let spec = spec_hostile(&host, "ns", "hostile");
    let command = spec.command.clone();
    let env = spec.env.clone();
    a.apply_ok(&[
        c.prepare("p", "hostile", "r1", spec.into()),
        c.activate("a", "hostile", "r1"),
    ]);
    let seen = dump(&host, "ns", "hostile");
    assert_eq!(argv(&seen), command, "argv byte for byte");
    assert_eq!(
        own_env(&seen["env"]),
        env,
        "env byte for byte, nothing else"
    );
    assert!(!std::path::Path::new("/pwned").exists());
}
