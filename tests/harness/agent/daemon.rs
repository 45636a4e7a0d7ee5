//! The agent's daemons: `run` and `sim-fleet` started and waited on until ready, and
//! the check that a binary given `CAPSTAN_FAULT_*` has the fault seams.

use super::Agent;
use crate::process::Process;
use std::path::Path;
use std::process::{Command, Stdio};

impl Agent {
    /// Starts `capstan-agent run` (JSON diagnostics) and waits until it is ready: it
    /// takes commands from NATS with a `[nats]` section, else says "capstan-agent ready".
    #[track_caller]
    pub fn run(&self) -> Process {
        self.run_with(&[], &[])
    }

    /// [`Agent::run`] with extra `run` args and env vars.
    #[track_caller]
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Process {
        let daemon = self.start(args, env);
        let ready = if self.config.nats.is_some() {
            "taking commands"
        } else {
            "capstan-agent ready"
        };
        daemon.wait_for_text(ready);
        daemon
    }

    /// Starts `capstan-agent run` without waiting for it.
    pub fn start(&self, args: &[&str], env: &[(&str, &str)]) -> Process {
        self.spawn("run", &self.host, args, env)
    }

    /// Starts `capstan-agent sim-fleet --hosts N --prefix P` on this agent's config
    /// (the hosts' data dirs under [`Agent::data_dir`]; `--host` is not used) and
    /// waits until every host has started.
    #[track_caller]
    pub fn sim_fleet(&self, hosts: usize, prefix: &str) -> Process {
        let fleet = self.spawn_sim_fleet(hosts, prefix);
        fleet.wait_for_text("sim fleet ready");
        fleet
    }

    /// [`Agent::sim_fleet`] without waiting: the caller waits for `sim fleet ready`
    /// (a large fleet takes longer than [`crate::READY`]).
    pub fn spawn_sim_fleet(&self, hosts: usize, prefix: &str) -> Process {
        self.spawn_sim_fleet_with(hosts, prefix, &[])
    }

    /// [`Agent::spawn_sim_fleet`] with more arguments (`--nats-credentials DIR`).
    pub fn spawn_sim_fleet_with(&self, hosts: usize, prefix: &str, more: &[&str]) -> Process {
        let hosts = hosts.to_string();
        let mut args = vec!["--hosts", hosts.as_str(), "--prefix", prefix];
        args.extend_from_slice(more);
        self.spawn("sim-fleet", prefix, &args, &[])
    }

    /// Starts daemon `subcommand` (JSON diagnostics into `run-<n>.log`).
    fn spawn(&self, subcommand: &str, what: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        if env.iter().any(|(k, _)| k.starts_with("CAPSTAN_FAULT_")) {
            assert_testing_build();
        }
        let mut c = self.command();
        c.args(["--log-format", "json", subcommand])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let n = self.next_run();
        Process::spawn(
            format!("capstan-agent {subcommand} ({what}, run {n})"),
            c,
            &self.path(&format!("run-{n}.log")),
        )
    }
}

/// Panics unless the agent binary has the fault-injection seams (feature `testing`,
/// its `--version`'s third line): a release build ignores `CAPSTAN_FAULT_*`.
fn assert_testing_build() {
    let agent = crate::binary("capstan-agent");
    assert!(
        has_fault_seams(&agent),
        "the agent binary {} has no fault seams: build it with \
         `cargo build --workspace --bins --features capstan-agent/testing` (scripts/test.sh does)",
        agent.display()
    );
}

/// Whether the agent binary `agent` is a test build, with the fault-injection seams
/// (feature `testing`): its `--version` says `testing seams: on` on a line of its own.
pub fn has_fault_seams(agent: &Path) -> bool {
    let mut c = Command::new(agent);
    c.arg("--version");
    let out = crate::process::output("capstan-agent --version", crate::READY, c);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with("testing seams: on"))
}
