//! Docker-driver tests against the real dockerd from `.ci/services.sh`: an agent
//! configured for it, a `run` daemon waited on by its readiness line, and the docker
//! CLI to look at what the agent did. Every test uses its own host label and
//! namespace (both carry the test name and pid) and removes what it made on drop.

use crate::agent::{parse_lines, Agent};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The image every docker test runs (built by `.ci/services.sh`).
pub const IMAGE: &str = "capstan-test/busybox:1";
/// A workload that runs until SIGTERM, then exits 0 (sh as PID 1 ignores SIGTERM
/// unless it traps it).
pub const SERVE: &str = r#"["sh","-c","trap 'exit 0' TERM; while :; do sleep 1; done"]"#;

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

/// Polls `check` until it holds; panics naming `what` after two minutes (a hang
/// guard, not a timing assertion).
pub fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !check() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// An agent on the docker driver, with its own host label and namespace.
pub struct DockerAgent {
    pub agent: Agent,
    pub ns: String,
    config: PathBuf,
}

impl DockerAgent {
    /// `name`: a short DNS-label-safe test name; made unique with the pid.
    pub fn new(name: &str) -> DockerAgent {
        let unique = format!("{name}{}", std::process::id());
        let agent = Agent::new(&format!("h-{unique}"));
        let config = agent.data_dir().join("agent.toml");
        let me = DockerAgent {
            agent,
            ns: unique,
            config,
        };
        me.configure(false);
        me
    }

    /// Rewrites the config file (`reap_orphans` as given).
    pub fn configure(&self, reap_orphans: bool) {
        std::fs::write(
            &self.config,
            format!(
                "driver = \"docker\"\n[docker]\nsocket = \"{}\"\npull_policy = \"never\"\nreap_orphans = {reap_orphans}\nstop_timeout_secs = 10\n",
                docker_host()
            ),
        )
        .expect("write agent.toml");
    }

    pub fn host(&self) -> &str {
        &self.agent.host
    }

    /// `capstan-agent --config … --data-dir … --host …`, logging at info.
    pub fn command(&self) -> Command {
        let mut c = self.agent.command();
        c.arg("--config").arg(&self.config);
        c.env("RUST_LOG", "info,sled=warn");
        c
    }

    /// A command line for this agent's host.
    pub fn line(&self, id: &str, op_fields: &str) -> String {
        crate::agent::command(self.host(), id, op_fields)
    }

    /// `ensure_namespace` for this test's namespace.
    pub fn ensure_ns(&self, id: &str) -> String {
        self.line(
            id,
            &format!(r#""op":"ensure_namespace","namespace":"{}""#, self.ns),
        )
    }

    /// An op on `workload` in this test's namespace, with extra fields.
    pub fn op(&self, id: &str, op: &str, workload: &str, extra: &str) -> String {
        let mut fields = format!(
            r#""op":"{op}","namespace":"{}","workload":"{workload}""#,
            self.ns
        );
        if !extra.is_empty() {
            fields.push(',');
            fields.push_str(extra);
        }
        self.line(id, &fields)
    }

    /// `prepare_revision` of `rev` running [`SERVE`] with env `REV=<rev>`.
    pub fn prepare(&self, id: &str, workload: &str, rev: &str) -> String {
        self.op(
            id,
            "prepare_revision",
            workload,
            &format!(
                r#""revision":"{rev}","spec":{{"driver":"docker","image":"{IMAGE}","command":{SERVE},"env":{{"REV":"{rev}"}}}}"#
            ),
        )
    }

    pub fn activate(&self, id: &str, workload: &str, rev: &str) -> String {
        self.op(
            id,
            "activate_revision",
            workload,
            &format!(r#""revision":"{rev}""#),
        )
    }

    /// Runs `apply` on `lines`; returns the exit status and the result lines.
    pub fn apply(&self, file: &str, lines: &[String]) -> (ExitStatus, Vec<Value>) {
        let input = self.agent.write_input(file, lines);
        let out = self
            .command()
            .arg("apply")
            .arg(&input)
            .stdin(Stdio::null())
            .output()
            .expect("run apply");
        (out.status, parse_lines(&out.stdout))
    }

    /// Runs `apply` and asserts every command succeeded.
    pub fn apply_ok(&self, file: &str, lines: &[String]) {
        let (status, results) = self.apply(file, lines);
        for r in &results {
            assert_eq!(r["outcome"], "succeeded", "{r}");
        }
        assert_eq!(results.len(), lines.len(), "{results:?}");
        assert!(status.success(), "apply exited {status}");
    }

    /// Starts `capstan-agent run` (with `extra` args, JSON diagnostics on stderr) and
    /// waits for its readiness line.
    pub fn run(&self, extra: &[&str]) -> Daemon {
        let mut child = self
            .command()
            .args(["--log-format", "json", "run"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn capstan-agent run");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                sink.lock().expect("daemon lines").push(value);
            }
        });
        let mut daemon = Daemon {
            child,
            lines,
            reader: Some(reader),
        };
        let ready = |d: &mut Daemon| {
            d.lines()
                .iter()
                .any(|l| message(l) == "capstan-agent ready")
                || matches!(d.child.try_wait(), Ok(Some(_)))
        };
        wait_until("capstan-agent run to be ready", || ready(&mut daemon));
        if let Ok(Some(status)) = daemon.child.try_wait() {
            if let Some(r) = daemon.reader.take() {
                let _ = r.join();
            }
            panic!(
                "capstan-agent run exited ({status}) before it was ready: {:#?}",
                daemon.lines()
            );
        }
        daemon
    }

    /// This host's containers in this test's namespace.
    pub fn containers(&self) -> Vec<Container> {
        let ids = docker(&[
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            &format!("label=io.capstan.host={}", self.host()),
        ]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return Vec::new();
        }
        let mut args = vec!["inspect"];
        args.extend(ids);
        let all: Vec<Value> = serde_json::from_str(&docker(&args)).expect("inspect JSON");
        all.iter()
            .map(|c| {
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
            })
            .collect()
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

    /// The log's records of `kind`. The log is exclusive to one process: only while
    /// no daemon runs.
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.agent
            .log_json()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }
}

impl Drop for DockerAgent {
    /// Removes every container and network labelled with this test's host.
    fn drop(&mut self) {
        // Never panic here: a second panic during unwinding aborts the test binary.
        let Ok(engine) = std::env::var("CAPSTAN_TEST_DOCKER_HOST") else {
            return;
        };
        let filter = format!("label=io.capstan.host={}", self.host());
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
}

/// The `message` of a JSON diagnostic line ("" for anything else).
pub fn message(line: &Value) -> &str {
    line["fields"]["message"].as_str().unwrap_or_default()
}

/// A running `capstan-agent run`; SIGKILLed on drop if still running.
pub struct Daemon {
    child: Child,
    /// Its stderr so far: JSON diagnostic lines (anything else as a string).
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Everything it wrote on stderr so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().expect("daemon lines").clone()
    }

    /// Waits until it has written a line matching `found`; returns that line.
    pub fn wait_for(&self, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let lines = self.lines();
            if let Some(hit) = lines.iter().find(|l| found(l)) {
                return hit.clone();
            }
            assert!(
                Instant::now() < deadline,
                "gave up waiting for {what}; the daemon said: {lines:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` and waits for the exit; returns the status and everything the
    /// daemon wrote on stderr.
    pub fn stop(mut self, signal: i32) -> (ExitStatus, Vec<Value>) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        assert!(send_signal(pid, signal), "kill -{signal} {pid} failed");
        let status = self.child.wait().expect("wait for capstan-agent run");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.lines())
    }

    /// SIGTERM, then assert a clean exit.
    pub fn terminate(self) -> Vec<Value> {
        let (status, lines) = self.stop(libc::SIGTERM);
        assert!(status.success(), "run exited {status}: {lines:#?}");
        lines
    }
}

/// Sends `signal` to `pid` with the `kill` command (the workspace forbids unsafe
/// code, so no `libc::kill`). True when it was delivered.
pub fn send_signal(pid: libc::pid_t, signal: i32) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success()
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
