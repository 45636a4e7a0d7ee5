//! The one way a test gets a `capstan-agent`: [`Agent::builder`] writes its config
//! (driver: sim, docker or a test's systemd; hooks, NATS, signing) into its own temp
//! dir; the [`Agent`] runs the CLI (`apply`, `log`, `intent`, `log verify`) and `run`
//! daemons against it.
//!
//! The temp dir holds `agent.toml`, the data dir `data/`, hook scripts and the files
//! they write, `apply` inputs, and each daemon's stderr (`run-<n>.log`).

use crate::command::Commands;
use crate::hooks::Hook;
use crate::process::{Exit, Process};
use serde_json::Value;
use std::cell::Cell;
use std::fmt::Display;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The agent's driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    Sim,
    /// A test engine ([`crate::docker::Engine`]), `pull_policy = "never"`.
    Docker {
        engine: crate::docker::Engine,
        reap_orphans: bool,
    },
    /// A test's [`crate::systemd::SystemdHost`]: its bus, unit dir and state dir.
    Systemd(Systemd),
    /// A driver process behind this socket (`driver = "external"`), e.g. a
    /// [`crate::external::SimDriver`].
    External {
        socket: PathBuf,
    },
    /// The kube driver on a test's [`crate::kube::KubeCluster`], through this
    /// kubeconfig (e.g. [`crate::kube::KubeCluster::agent_kubeconfig`]).
    Kube {
        kubeconfig: PathBuf,
    },
}

/// The `[systemd]` section of an agent on a [`crate::systemd::SystemdHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Systemd {
    pub bus: String,
    pub unit_dir: PathBuf,
    pub state_dir: PathBuf,
    pub manage_lifecycle: bool,
    /// `start_limit_burst` and `restart_sec_ms`; `None`: the driver's defaults.
    pub tuning: Option<(u32, u32)>,
}

/// An agent's configuration; [`AgentBuilder::build`] writes it.
#[derive(Debug, Clone)]
pub struct AgentBuilder {
    host: String,
    driver: Driver,
    hooks: Vec<Hook>,
    /// The NATS server's URL.
    nats: Option<String>,
    /// More `[nats]` lines: credentials, `replicas`.
    nats_auth: String,
    /// The coordinator's public key.
    signing: Option<String>,
    /// `[metrics] listen`; `None`: `enabled = false`. By default port 0 (a free port,
    /// logged: [`metrics_address`]), so that parallel agents never collide.
    metrics: Option<String>,
    /// More config sections, appended last (`[log.retention]`, …).
    extra: String,
    /// A coordinator (its URL and a `submit` token) to register the host's key with
    /// when the agent is built.
    register: Option<(String, String)>,
}

impl AgentBuilder {
    /// The host this agent is for.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Appends `text` (whole TOML tables) to `agent.toml`.
    pub fn extra_toml(mut self, text: &str) -> AgentBuilder {
        self.extra.push_str(text);
        self.extra.push('\n');
        self
    }

    /// The docker driver on test engine `engine`.
    pub fn docker(mut self, engine: crate::docker::Engine) -> AgentBuilder {
        self.driver = Driver::Docker {
            engine,
            reap_orphans: false,
        };
        self
    }

    /// An external driver listening on `socket` (`[external] socket`).
    pub fn external(mut self, socket: &Path) -> AgentBuilder {
        self.driver = Driver::External {
            socket: socket.to_path_buf(),
        };
        self
    }

    /// The kube driver through `kubeconfig` (rollouts waited on for at most 60 s).
    pub fn kube(mut self, kubeconfig: &Path) -> AgentBuilder {
        self.driver = Driver::Kube {
            kubeconfig: kubeconfig.to_path_buf(),
        };
        self
    }

    /// `reap_orphans` for the docker driver.
    pub fn reap_orphans(mut self, reap: bool) -> AgentBuilder {
        let Driver::Docker { engine, .. } = self.driver else {
            panic!("reap_orphans is a docker setting");
        };
        self.driver = Driver::Docker {
            engine,
            reap_orphans: reap,
        };
        self
    }

    /// The systemd driver on `host` (`manage_lifecycle = false`, the driver's
    /// default). Call it again after a reboot of `host` (its bus moves).
    pub fn systemd(mut self, host: &crate::systemd::SystemdHost) -> AgentBuilder {
        let (manage_lifecycle, tuning) = match &self.driver {
            Driver::Systemd(s) => (s.manage_lifecycle, s.tuning),
            _ => (false, None),
        };
        self.driver = Driver::Systemd(Systemd {
            bus: host.bus_address(),
            unit_dir: host.unit_dir(),
            state_dir: host.state_dir(),
            manage_lifecycle,
            tuning,
        });
        self
    }

    /// `manage_lifecycle` for the systemd driver.
    pub fn systemd_lifecycle(mut self, manage: bool) -> AgentBuilder {
        self.systemd_settings().manage_lifecycle = manage;
        self
    }

    /// `start_limit_burst` and `restart_sec_ms` for the systemd driver.
    pub fn systemd_tuning(mut self, start_limit_burst: u32, restart_sec_ms: u32) -> AgentBuilder {
        self.systemd_settings().tuning = Some((start_limit_burst, restart_sec_ms));
        self
    }

    fn systemd_settings(&mut self) -> &mut Systemd {
        match &mut self.driver {
            Driver::Systemd(s) => s,
            _ => panic!("systemd(host) first"),
        }
    }

    /// Adds an exec hook owner (called in the order added).
    pub fn hook(mut self, hook: Hook) -> AgentBuilder {
        self.hooks.push(hook);
        self
    }

    /// No hook owners.
    pub fn without_hooks(mut self) -> AgentBuilder {
        self.hooks.clear();
        self
    }

    /// A `[nats]` section: `run` takes commands from the server at `url`.
    pub fn nats(mut self, url: &str) -> AgentBuilder {
        self.nats = Some(url.to_string());
        self
    }

    /// NATS credentials (after [`AgentBuilder::nats`]).
    pub fn nats_user(self, user: &str, password: &str) -> AgentBuilder {
        self.nats_extra(&format!("user = {user:?}\npassword = {password:?}"))
    }

    /// More `[nats]` lines (after [`AgentBuilder::nats`]): `replicas = 3`, …
    pub fn nats_extra(mut self, lines: &str) -> AgentBuilder {
        assert!(self.nats.is_some(), "nats() first");
        self.nats_auth.push_str(lines);
        self.nats_auth.push('\n');
        self
    }

    /// A `[signing]` section trusting `public_key` (commands up to 10 min old).
    pub fn signing(mut self, public_key: &str) -> AgentBuilder {
        self.signing = Some(public_key.to_string());
        self
    }

    /// Registers the host's key (made when the agent is built, as its first start
    /// would) with the coordinator at `url`, with the `submit` token `token`: what a
    /// coordinator checks everything the host publishes against.
    pub fn registered_with(mut self, url: &str, token: &str) -> AgentBuilder {
        self.register = Some((url.to_string(), token.to_string()));
        self
    }

    /// `[metrics] listen = addr`, or with `None`, `enabled = false`.
    pub fn metrics(mut self, listen: Option<&str>) -> AgentBuilder {
        self.metrics = listen.map(Into::into);
        self
    }

    /// Creates the agent's temp dir and writes its config and hook scripts.
    pub fn build(self) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        self.build_with(dir)
    }

    /// [`AgentBuilder::build`] with the agent's dir made under `parent` (e.g. a
    /// [`crate::systemd::SystemdHost::dir`], so that its paths are valid inside).
    pub fn build_in(self, parent: &Path) -> Agent {
        let dir = tempfile::tempdir_in(parent).expect("temp dir");
        self.build_with(dir)
    }

    fn build_with(self, dir: tempfile::TempDir) -> Agent {
        let agent = Agent {
            dir,
            host: self.host.clone(),
            config: self.clone(),
            runs: Cell::new(0),
            inputs: Cell::new(0),
        };
        agent.write_config();
        if let Some((url, token)) = &self.register {
            agent.register(url, token);
        }
        agent
    }

    fn toml(&self, dir: &Path) -> String {
        let mut toml = String::new();
        let mut add = |text: &str| toml.push_str(text);
        match &self.driver {
            Driver::Sim => add("driver = \"sim\"\n"),
            Driver::Docker {
                engine,
                reap_orphans,
            } => add(&format!(
                "driver = \"docker\"\n[docker]\nsocket = {:?}\npull_policy = \"never\"\n\
                 reap_orphans = {reap_orphans}\nstop_timeout_secs = 10\n",
                engine.socket()
            )),
            Driver::External { socket } => add(&format!(
                "driver = \"external\"\n[external]\nsocket = {:?}\n",
                socket.display().to_string()
            )),
            Driver::Kube { kubeconfig } => add(&format!(
                "driver = \"kube\"\n[kube]\nkubeconfig = {:?}\nrollout_timeout_secs = 60\n",
                kubeconfig.display().to_string()
            )),
            Driver::Systemd(s) => {
                add(&format!(
                    "driver = \"systemd\"\n[systemd]\nbus = {:?}\nunit_dir = {:?}\n\
                     state_dir = {:?}\nmanage_lifecycle = {}\n",
                    s.bus,
                    s.unit_dir.display().to_string(),
                    s.state_dir.display().to_string(),
                    s.manage_lifecycle
                ));
                if let Some((burst, restart_ms)) = s.tuning {
                    add(&format!(
                        "start_limit_burst = {burst}\nrestart_sec_ms = {restart_ms}\n"
                    ));
                }
            }
        }
        for hook in &self.hooks {
            add(&hook.install(dir));
        }
        if let Some(url) = &self.nats {
            add(&format!("[nats]\nurl = {url:?}\n{}", self.nats_auth));
        }
        if let Some(key) = &self.signing {
            add(&format!(
                "[signing]\npublic_keys = [{key:?}]\nmax_age_secs = 600\n"
            ));
        }
        match &self.metrics {
            Some(listen) => add(&format!("[metrics]\nlisten = {listen:?}\n")),
            None => add("[metrics]\nenabled = false\n"),
        }
        add(&self.extra);
        toml
    }
}

/// A `capstan-agent` with its own temp dir (config, data dir, …) and host name.
/// Dropping it removes the dir, and for the docker driver every container and network
/// labelled with its host.
pub struct Agent {
    dir: tempfile::TempDir,
    pub host: String,
    config: AgentBuilder,
    runs: Cell<u32>,
    inputs: Cell<u32>,
}

/// What an `apply` did.
#[derive(Debug)]
pub struct Applied {
    pub exit: Exit,
    /// Its result lines.
    pub results: Vec<Value>,
    pub stderr: String,
}

impl Agent {
    /// An agent for `host` on the sim driver; add the rest, then `build()`.
    pub fn builder(host: &str) -> AgentBuilder {
        crate::watchdog::watch();
        AgentBuilder {
            host: host.to_string(),
            driver: Driver::Sim,
            hooks: Vec::new(),
            nats: None,
            nats_auth: String::new(),
            signing: None,
            metrics: Some("127.0.0.1:0".into()),
            extra: String::new(),
            register: None,
        }
    }

    /// The host's public key: `capstan-agent host-key` (which makes the key first,
    /// in the data dir, when there is none).
    pub fn host_key(&self) -> String {
        let mut c = self.command();
        c.arg("host-key");
        let out = crate::process::output("capstan-agent host-key", crate::READY, c);
        assert!(
            out.status.success(),
            "host-key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Registers [`Agent::host_key`] with the coordinator at `url` (`capstan register`).
    pub fn register(&self, url: &str, token: &str) {
        let key = self.host_key();
        let mut c = Command::new(crate::binary("capstan"));
        c.args(["--coordinator", url, "register", &self.host, &key])
            .env("CAPSTAN_TOKEN", token)
            .env_remove("CAPSTAN_TOKEN_FILE");
        let out = crate::process::output(
            format_args!("capstan register {}", self.host),
            crate::READY,
            c,
        );
        assert!(
            out.status.success(),
            "capstan register {}: {}",
            self.host,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The engine of an agent on the docker driver (panics for another driver).
    pub fn engine(&self) -> crate::docker::Engine {
        match self.config.driver {
            Driver::Docker { engine, .. } => engine,
            _ => panic!("{} is not on the docker driver", self.host),
        }
    }

    /// Changes the config (for the next process started): `change` gets the current
    /// one.
    pub fn reconfigure(&mut self, change: impl FnOnce(AgentBuilder) -> AgentBuilder) {
        self.config = change(self.config.clone());
        assert_eq!(self.config.host, self.host, "the host stays");
        self.write_config();
    }

    fn write_config(&self) {
        std::fs::write(self.config_file(), self.config.toml(self.dir.path()))
            .expect("write agent.toml");
    }

    /// `name` in the agent's temp dir (where hook scripts write their files).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config_file(&self) -> PathBuf {
        self.path("agent.toml")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.path("data")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.data_dir().join("log")
    }

    /// Commands for this host in namespace `ns`.
    pub fn commands(&self, ns: &str) -> Commands {
        Commands::new(&self.host, ns)
    }

    /// `capstan-agent --config … --data-dir … --host …` ready for a subcommand
    /// (diagnostics at info).
    pub fn command(&self) -> Command {
        let mut c = Command::new(crate::binary("capstan-agent"));
        c.arg("--config")
            .arg(self.config_file())
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--host")
            .arg(&self.host)
            .env("RUST_LOG", "info,sled=warn,async_nats=warn");
        c
    }

    /// Writes `lines` to a new file in the temp dir and returns its path.
    pub fn write_input(&self, lines: &[impl Display]) -> PathBuf {
        self.inputs.set(self.inputs.get() + 1);
        let path = self.path(&format!("input-{}.jsonl", self.inputs.get()));
        let mut f = std::fs::File::create(&path).expect("input file");
        for l in lines {
            writeln!(f, "{l}").expect("write input");
        }
        path
    }

    /// Runs `apply` on `lines`.
    pub fn apply(&self, lines: &[impl Display]) -> Applied {
        let input = self.write_input(lines);
        let mut c = self.command();
        c.arg("apply").arg(&input);
        let out = crate::process::output(
            format_args!("capstan-agent apply {} ({})", input.display(), self.host),
            crate::READY,
            c,
        );
        Applied {
            exit: Exit::of(out.status),
            results: crate::parse_lines(&out.stdout),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `apply` with no commands: the agent opens its log and recovers (finishes what a
    /// crash interrupted), then exits.
    pub fn recover(&self) -> Applied {
        let nothing: &[&str] = &[];
        self.apply(nothing)
    }

    /// Runs `apply` and asserts every command succeeded.
    #[track_caller]
    pub fn apply_ok(&self, lines: &[impl Display]) -> Applied {
        let applied = self.apply(lines);
        for r in &applied.results {
            assert_eq!(r["outcome"], "succeeded", "{r}");
        }
        assert_eq!(applied.results.len(), lines.len(), "{applied}");
        assert_eq!(applied.exit, Exit::OK, "{applied}");
        applied
    }

    /// `apply` started on `input` (a file, or `None` for its stdin, piped), its stdout
    /// piped: for tests that crash it or talk to it.
    pub fn start_apply(&self, input: Option<&Path>) -> Process {
        let mut c = self.command();
        c.arg("apply");
        match input {
            Some(file) => c.arg(file).stdin(Stdio::null()),
            None => c.arg("-").stdin(Stdio::piped()),
        };
        c.stdout(Stdio::piped());
        let n = self.next_run();
        Process::spawn(
            format!("capstan-agent apply ({}, run {n})", self.host),
            c,
            &self.path(&format!("run-{n}.log")),
        )
    }

    /// `apply` on `lines` fed through its stdin, its stdout piped. The pipe stays open
    /// until [`Feed::close`]: `apply` cannot reach the end of its input and exit, so a
    /// kill before the close always hits a live process.
    pub fn start_apply_fed(&self, lines: &[impl Display]) -> (Process, Feed) {
        let mut apply = self.start_apply(None);
        let mut stdin = apply.stdin();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        // Writes what the pipe takes, then keeps it open; a write into a killed
        // process's pipe just fails.
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
            stdin
        });
        (apply, Feed(feeder))
    }

    /// Whether command `id` is in progress in the log: received and not completed
    /// (e.g. where a kill cut it).
    pub fn in_progress(&self, id: &str) -> bool {
        let log = self.log_of(id);
        let has = |kind: &str| log.iter().any(|r| r["kind"] == kind);
        has("command_received") && !has("command_completed")
    }

    /// The whole log as JSON objects (asserting `log --json` succeeded).
    pub fn log(&self) -> Vec<Value> {
        self.log_args(&[])
    }

    /// The records of command `id`.
    pub fn log_of(&self, id: &str) -> Vec<Value> {
        self.log_args(&["--command", id])
    }

    fn log_args(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["log", "--json"];
        all.extend(args);
        crate::parse_lines(&self.cli_ok(&all))
    }

    /// Runs the CLI with `args`, asserting it succeeded; returns its stdout.
    #[track_caller]
    pub fn cli_ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "capstan-agent {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Runs the CLI with `args` (stdin null) and returns how it ended, what it wrote;
    /// fails the test if it has not ended within [`crate::READY`].
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut c = self.command();
        c.args(args);
        crate::process::output(
            format_args!("capstan-agent {args:?} ({})", self.host),
            crate::READY,
            c,
        )
    }

    /// The log's records of `kind` (from the files, or from the running agent over its
    /// local socket).
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    /// `log verify`: (exit success, stdout).
    pub fn verify(&self) -> (bool, String) {
        let out = self.cli(&["log", "verify"]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `intent --json`.
    pub fn intent(&self) -> Value {
        serde_json::from_slice(&self.cli_ok(&["intent", "--json"])).expect("intent JSON")
    }

    /// The sim driver's host state (snapshot + journal, readable while the agent
    /// runs; an empty host before it wrote any), as JSON.
    pub fn sim_host(&self) -> Value {
        let host = capstan_driver::sim::SimHost::load(&self.data_dir()).expect("sim host");
        serde_json::to_value(host).expect("sim host JSON")
    }

    /// The calls hook owner `name` recorded: `"<phase> <compensating>"` lines.
    pub fn calls(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(&crate::hooks::calls_file(name)))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn next_run(&self) -> u32 {
        self.runs.set(self.runs.get() + 1);
        self.runs.get()
    }

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
        let hosts = hosts.to_string();
        let args = ["--hosts", hosts.as_str(), "--prefix", prefix];
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

/// Where a `run` daemon serves `/metrics` (its log line `serving metrics`).
#[track_caller]
pub fn metrics_address(daemon: &Process) -> std::net::SocketAddr {
    let line = daemon.wait_for_line("the metrics endpoint", |l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("serving metrics"))
    });
    line["fields"]["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line}"))
}

/// `GET /metrics` at `addr`: the status, the `Content-Type` and the body.
pub fn scrape(addr: std::net::SocketAddr) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let timeout = std::time::Duration::from_secs(10);
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, timeout).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(timeout))
        .expect("write timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send GET");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read /metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

/// The writer of an [`Agent::start_apply_fed`] input, holding its pipe open.
pub struct Feed(std::thread::JoinHandle<std::process::ChildStdin>);

impl Feed {
    /// Closes the pipe (once `apply` is dead or has read everything: the writer
    /// must be done).
    #[track_caller]
    pub fn close(self) {
        crate::wait_until(
            "the input feeder to be done writing (apply dead or done reading)",
            crate::READY,
            || self.0.is_finished(),
        );
        drop(self.0.join().expect("input feeder thread"));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Driver::Docker { engine, .. } = self.config.driver {
            crate::docker::remove_host(engine, &self.host);
        }
    }
}

impl Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "apply ended with {}", self.exit)?;
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        f.write_str(&self.stderr)
    }
}

impl Applied {
    /// The result line of the command `id` (panics if there is none).
    pub fn result(&self, id: &str) -> &Value {
        self.results
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}: {self}"))
    }
}
