//! The real engines from `.ci/services.sh` — dockerd and podman's Docker-compatible
//! service, each on its own socket ([`Engine`]) — the docker CLI against them, and
//! what an agent on the docker driver made there (found by its host label). Every
//! docker test runs once per engine ([`crate::each_engine!`]). Docker tests give their
//! agent a [`crate::unique`] host named after the test and the engine, and use that
//! name as their namespace too, so tests (and test runs) sharing an engine never see
//! each other's containers or networks.

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

/// An engine the docker driver's tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Debian's docker.io (`CAPSTAN_TEST_DOCKER_HOST`).
    Dockerd,
    /// Debian's podman, `podman system service` (`CAPSTAN_TEST_PODMAN_HOST`).
    Podman,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Dockerd => "dockerd",
            Engine::Podman => "podman",
        }
    }

    /// The variable `.ci/services.sh` exports its socket in.
    fn variable(self) -> &'static str {
        match self {
            Engine::Dockerd => "CAPSTAN_TEST_DOCKER_HOST",
            Engine::Podman => "CAPSTAN_TEST_PODMAN_HOST",
        }
    }

    /// Its socket, `unix:///…`; panics when it is not set.
    pub fn socket(self) -> String {
        std::env::var(self.variable()).unwrap_or_else(|_| {
            panic!(
                "{} is not set: run `eval \"$(.ci/services.sh)\"` first (scripts/test.sh \
                 does); the docker tests need its private {}",
                self.variable(),
                self.name()
            )
        })
    }

    /// Runs the docker CLI against this engine; panics on failure. Returns stdout.
    pub fn docker(self, args: &[&str]) -> String {
        let out = self
            .cli(args)
            .unwrap_or_else(|e| panic!("docker {args:?} ({}): {e}", self.name()));
        assert!(
            out.status.success(),
            "docker {} ({}): {}",
            args.join(" "),
            self.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// An error (never a panic: [`remove_host`] runs while tests unwind) if it has
    /// not ended within [`crate::READY`].
    fn cli(self, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut c = Command::new("docker");
        c.arg("-H").arg(self.socket()).args(args);
        crate::process::output_within(crate::READY, c)
    }

    /// `docker inspect` of one container or network.
    pub fn inspect(self, id: &str) -> Value {
        let all: Value =
            serde_json::from_str(&self.docker(&["inspect", id])).expect("inspect JSON");
        all[0].clone()
    }
}

/// Defines each named docker test once per engine: `fn name(engine: Engine)` becomes
/// the tests `name::dockerd` and `name::podman` (so the filter `::podman` runs the
/// podman half).
#[macro_export]
macro_rules! each_engine {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn dockerd() {
                super::$name($crate::docker::Engine::Dockerd)
            }
            #[test]
            fn podman() {
                super::$name($crate::docker::Engine::Podman)
            }
        }
    )+};
}

/// Like [`serve`], but a stop takes `secs` seconds (a service draining on SIGTERM):
/// the engine then shows a stop under way for that long (podman: `stopping`).
pub fn slow_to_stop(rev: &str, secs: u32) -> Spec {
    Spec::docker(IMAGE)
        .command(&[
            "sh",
            "-c",
            &format!("trap 'sleep {secs}; exit 0' TERM; while :; do sleep 1; done"),
        ])
        .env("REV", rev)
}

/// An agent builder on the docker driver on `engine`, for a host named after the test
/// and the engine.
pub fn agent(engine: Engine, name: &str) -> crate::agent::AgentBuilder {
    Agent::builder(&crate::unique(&format!("{name}-{}", engine.name()))).docker(engine)
}

/// One container as `docker inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub workload: String,
    pub revision: String,
    pub running: bool,
    /// `State.Status`: `running`, `exited`, … (podman: also `stopping`).
    pub status: String,
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
            status: c["State"]["Status"].as_str().unwrap_or_default().into(),
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
        let ids = self.docker(&[
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
        let all: Vec<Value> = serde_json::from_str(&self.docker(&args)).expect("inspect JSON");
        all.iter().map(Container::from_inspect).collect()
    }

    /// Runs the docker CLI against this agent's engine; panics on failure.
    pub fn docker(&self, args: &[&str]) -> String {
        self.engine().docker(args)
    }

    /// `docker inspect` of one container or network on this agent's engine.
    pub fn inspect(&self, id: &str) -> Value {
        self.engine().inspect(id)
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

/// Removes every container and network labelled with `host` on `engine` (an agent's
/// drop). Never panics: it may run while a test unwinds.
pub fn remove_host(engine: Engine, host: &str) {
    if std::env::var_os(engine.variable()).is_none() {
        return;
    }
    let filter = format!("label=io.capstan.host={host}");
    let run = |args: &[&str]| {
        engine
            .cli(args)
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
