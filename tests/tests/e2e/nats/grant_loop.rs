//! The grant loop: a controller sends one command at a time over NATS, and sends it
//! again under a new id while it fails retryably (a kill inside a hook ends it
//! `interrupted`), as the controller's contract says; meanwhile the agent is SIGKILLed
//! at random moments and started again. The drivers' tests (`docker::grants`,
//! `systemd::grants`) then check that grants follow what runs.

use super::crash::killed_mid_command;
use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Commands, Spec};
use capstan_tests::nats::Coordinator;
use capstan_tests::process::Process;
use capstan_tests::Rng;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};

/// Workloads `w0`… in namespace `ns`, `rounds` rounds: each workload's next revision
/// (`spec(workload, revision)`) prepared and activated, the one before retired; every
/// second round a stop and a start.
pub(crate) fn plan(
    c: &Commands,
    workloads: usize,
    rounds: usize,
    spec: impl Fn(&str, &str) -> Spec,
) -> Vec<Cmd> {
    let mut plan = vec![c.ensure_namespace("ns")];
    for round in 1..=rounds {
        for w in 0..workloads {
            let (wl, rev) = (format!("w{w}"), format!("r{round}"));
            let id = |what: &str| format!("{wl}.{round}.{what}");
            plan.push(c.prepare(&id("prepare"), &wl, &rev, spec(&wl, &rev)));
            plan.push(c.activate(&id("activate"), &wl, &rev));
            if round > 1 {
                plan.push(c.retire(&id("retire"), &wl, &format!("r{}", round - 1)));
            }
            if round % 2 == 0 {
                plan.push(c.stop(&id("stop"), &wl));
                plan.push(c.start(&id("start"), &wl));
            }
        }
    }
    plan
}

/// Carries `plan` out through `coordinator` while `agent` is SIGKILLed up to `kills`
/// times, each after a random life below `max_life_ms`. Returns the daemon left
/// running and how many kills landed mid-command; none fails the test.
pub(crate) fn under_kills(
    coordinator: &Coordinator,
    agent: &Agent,
    plan: &[Cmd],
    kills: usize,
    max_life_ms: u64,
) -> Process {
    let done = AtomicBool::new(false);
    let controller = Controller {
        url: coordinator.url.clone(),
        token: coordinator.token.clone(),
        dir: tempfile::tempdir().expect("a temp dir"),
    };
    let (daemon, retries, mid_command) = std::thread::scope(|s| {
        // The controller: one command at a time, each until it succeeded.
        let controller = s.spawn(|| {
            let mut retries = 0;
            for command in plan {
                retries += controller.until_succeeded(command);
            }
            done.store(true, Ordering::SeqCst);
            retries
        });
        // The chaos: SIGKILL after a random life, start again, while it works.
        let mut rng = Rng::from_env_or_time("grantloop");
        let mut daemon = agent.run();
        let mut mid_command = 0;
        for kill in 0..kills {
            let life = std::time::Duration::from_millis(rng.below(max_life_ms));
            std::thread::sleep(life);
            if done.load(Ordering::SeqCst) {
                break;
            }
            mid_command += usize::from(killed_mid_command(agent, daemon, kill));
            daemon = agent.run();
        }
        let retries = controller.join().expect("the controller thread");
        (daemon, retries, mid_command)
    });
    eprintln!("{mid_command} of {kills} kills mid-command; {retries} commands sent again");
    assert!(
        mid_command > 0,
        "no kill landed mid-command: nothing was tested"
    );
    daemon
}

/// The codes a crash can end a command with that the same command, sent again under a
/// new id, may not (docs/protocol.md).
const RETRYABLE: [&str; 4] = [
    "interrupted",
    "cancelled",
    "hook_failed",
    "driver_unavailable",
];

/// The controller's side, on a thread of its own: the `capstan` CLI against the
/// coordinator.
struct Controller {
    url: String,
    token: String,
    dir: tempfile::TempDir,
}

impl Controller {
    fn cli(&self, args: &[&str]) -> std::process::Output {
        capstan_tests::nats::capstan_cli(&self.url, &self.token, args)
    }

    /// Sends `command` (first under its own id, then as `<id>.again<k>`) until it
    /// succeeds, waiting for each answer; a failure that is not retryable fails the
    /// test. Returns how many times it was sent again.
    fn until_succeeded(&self, command: &Cmd) -> usize {
        for attempt in 0..20 {
            let id = match attempt {
                0 => command.id().to_string(),
                k => format!("{}.again{k}", command.id()),
            };
            let line = command.clone().with("id", id.as_str()).without("issued_at");
            let file = self.dir.path().join(format!("{id}.jsonl"));
            std::fs::write(&file, format!("{line}\n")).expect("write the command");
            let sent = self.cli(&["submit", file.to_str().expect("a path")]);
            assert!(sent.status.success(), "submit {id}: {sent:?}");
            let out = self.cli(&["wait", &id, "--timeout", "120s"]);
            let status: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("wait {id}: {e}: {out:?}"));
            let code = status["error"]["code"].as_str().unwrap_or_default();
            match status["status"].as_str() {
                Some("succeeded") => return attempt,
                Some("failed") if RETRYABLE.contains(&code) => {
                    eprintln!("{id}: {code}, sent again");
                }
                _ => panic!("{id}: {status}"),
            }
        }
        panic!("{} never succeeded in 20 attempts", command.id());
    }
}
