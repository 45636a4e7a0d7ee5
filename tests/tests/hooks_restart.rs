//! An infrastructure restart keeps the hooks' placeholders: the graceful-stop sweep
//! and startup reconciliation run no hooks, so they must resume the workload exactly
//! as its last command-driven start configured it — never drop its launch env.

use capstan_tests::hooks::{activate, staging, HookAgent, Owner};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `capstan-agent run`, with its stderr lines on a channel.
fn start_daemon(agent: &HookAgent) -> (Child, mpsc::Receiver<String>) {
    let mut child = agent
        .command()
        .args(["--log-format", "json", "run"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn capstan-agent run");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for a stderr line containing `needle` (the readiness or exit line).
fn wait_for(rx: &mpsc::Receiver<String>, needle: &str) {
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(e) => panic!("no line containing {needle:?} from capstan-agent run: {e}"),
        }
    }
}

fn sigterm_and_wait(mut child: Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let exit = child.wait().expect("reap capstan-agent run");
    assert!(exit.success(), "capstan-agent run exited {exit}");
}

#[test]
fn a_sweep_and_a_startup_restart_keep_the_launch_env() {
    let agent = HookAgent::new(&[Owner {
        name: "iam",
        phases: &["before_workload_start", "before_workload_stop"],
        body: r#"[ "$phase" = before_workload_start ] && echo '{"env":{"DB_TOKEN":"opaque-db.tok:42"}}'
exit 0"#,
        timeout: None,
    }]);
    let mut lines = staging(r#""PLAIN":"value""#);
    lines.push(activate("a1"));
    let out = agent.apply(&lines);
    assert!(out.status.success(), "{out:?}");
    let revision = |agent: &HookAgent| agent.sim_host()["revisions"]["ns/web@r1"].clone();
    assert_eq!(revision(&agent)["env"]["DB_TOKEN"], "opaque-db.tok:42");

    // Graceful stop: the sweep stops the workload, intent unchanged.
    let (child, rx) = start_daemon(&agent);
    wait_for(&rx, "capstan-agent ready");
    sigterm_and_wait(child);
    assert_eq!(revision(&agent)["state"], "stopped");

    // Startup: reconciliation starts it again, with the placeholder it had.
    let (child, rx) = start_daemon(&agent);
    wait_for(&rx, "capstan-agent ready");
    let r = revision(&agent);
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(
        r["env"]["DB_TOKEN"], "opaque-db.tok:42",
        "launch env kept: {r}"
    );
    assert_eq!(r["env"]["PLAIN"], "value");
    sigterm_and_wait(child);
}
