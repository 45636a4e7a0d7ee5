//! The real dockerd from `.ci/services.sh`: the docker CLI against it, and what an
//! agent on the docker driver made there (found by its host label). Docker tests give
//! their agent a [`crate::unique`] host and use that name as their namespace too, so
//! tests (and test runs) sharing the engine never see each other's containers.

use crate::agent::Agent;
use crate::command::Spec;
use serde_json::Value;
use std::process::Command;

/// The image every docker test runs (built by `.ci/services.sh`).
pub const IMAGE: &str = "capstan-test/busybox:1";

/// A spec that runs until SIGTERM, then exits 0 (sh as PID 1 ignores SIGTERM unless
/// it traps it), with env `REV=<rev>`.
pub fn serve(rev: &str) -> Spec {
    Spec::docker(IMAGE)
        .command(&["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"])
        .env("REV", rev)
}

/// An agent builder on the docker driver for a host named after the test.
pub fn agent(name: &str) -> crate::agent::AgentBuilder {
    Agent::builder(&crate::unique(name)).docker()
}

/// The engine under test, from `CAPSTAN_TEST_DOCKER_HOST`.
pub fn docker_host() -> String {
    std::env::var("CAPSTAN_TEST_DOCKER_HOST").unwrap_or_else(|_| {
        panic!(
            "CAPSTAN_TEST_DOCKER_HOST is not set: run `eval \"$(.ci/services.sh)\"` first \
             (scripts/test.sh does); the docker tests need the private dockerd"
        )
    })
}

/// Runs the docker CLI against the test engine; panics on failure. Returns stdout.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .arg("-H")
        .arg(docker_host())
        .args(args)
        .output()
        .expect("run the docker CLI");
    assert!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `docker inspect` of one container or network.
pub fn inspect(id: &str) -> Value {
    let all: Value = serde_json::from_str(&docker(&["inspect", id])).expect("inspect JSON");
    all[0].clone()
}

/// One container as `docker inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub workload: String,
    pub revision: String,
    pub running: bool,
    pub started_at: String,
    pub env: Vec<String>,
}

impl Container {
    fn from_inspect(c: &Value) -> Container {
        let label = |k: &str| {
            c["Config"]["Labels"][format!("io.capstan.{k}")]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        Container {
            id: c["Id"].as_str().unwrap_or_default().into(),
            name: c["Name"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches('/')
                .into(),
            workload: label("workload"),
            revision: label("revision"),
            running: c["State"]["Running"].as_bool().unwrap_or(false),
            started_at: c["State"]["StartedAt"].as_str().unwrap_or_default().into(),
            env: c["Config"]["Env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(String::from))
                .collect(),
        }
    }

    /// Whether its env holds `NAME=value`.
    pub fn has_env(&self, entry: &str) -> bool {
        self.env.iter().any(|e| e == entry)
    }
}

impl Agent {
    /// Every container labelled with this agent's host.
    pub fn containers(&self) -> Vec<Container> {
        let ids = docker(&[
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            &format!("label=io.capstan.host={}", self.host),
        ]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return Vec::new();
        }
        let mut args = vec!["inspect"];
        args.extend(ids);
        let all: Vec<Value> = serde_json::from_str(&docker(&args)).expect("inspect JSON");
        all.iter().map(Container::from_inspect).collect()
    }

    /// The one container of `workload`@`rev`; panics if there is not exactly one.
    pub fn container(&self, workload: &str, rev: &str) -> Container {
        let found: Vec<Container> = self
            .containers()
            .into_iter()
            .filter(|c| c.workload == workload && c.revision == rev)
            .collect();
        assert_eq!(found.len(), 1, "containers of {workload}@{rev}: {found:?}");
        found.into_iter().next().expect("one")
    }
}

/// Removes every container and network labelled with `host` (an agent's drop).
/// Never panics: it may run while a test unwinds.
pub(crate) fn remove_host(host: &str) {
    let Ok(engine) = std::env::var("CAPSTAN_TEST_DOCKER_HOST") else {
        return;
    };
    let filter = format!("label=io.capstan.host={host}");
    let run = |args: &[&str]| {
        Command::new("docker")
            .arg("-H")
            .arg(&engine)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let ids = run(&["ps", "-aq", "--filter", &filter]);
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(ids);
        run(&args);
    }
    let nets = run(&["network", "ls", "-q", "--filter", &filter]);
    for n in nets.split_whitespace() {
        run(&["network", "rm", n]);
    }
}
