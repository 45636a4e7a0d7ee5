//! NATS-side harness: a private nats-server per test, coordinators and NATS-connected
//! agents as real processes, the `capstan` CLI, and readiness waits on log lines.

use crate::agent::Agent;
use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long any readiness wait may take before the test fails (not a timing
/// assertion: a guard against hanging for ever on a broken build).
pub const READY_LIMIT: Duration = Duration::from_secs(90);

/// Waits until `file` contains `needle` (returns the file's text then).
pub fn wait_for_line(file: &Path, needle: &str) -> String {
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {needle:?}; it said:\n{text}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `check` returns Some.
pub fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Sends `signal` (`TERM`, `KILL`) to our own child by its pid and reaps it.
fn kill(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// A private nats-server with JetStream, on a free loopback port.
pub struct NatsServer {
    pub port: u16,
    store: tempfile::TempDir,
    config: Option<PathBuf>,
    child: Option<Child>,
    runs: u32,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_with(None)
    }

    /// With a server config file (its listen address and store are overridden).
    pub fn start_with(config: Option<&Path>) -> NatsServer {
        let mut server = NatsServer {
            port: free_port(),
            store: tempfile::tempdir().expect("store dir"),
            config: config.map(Path::to_path_buf),
            child: None,
            runs: 0,
        };
        server.boot();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn boot(&mut self) {
        self.runs += 1;
        let log = self.store.path().join(format!("server-{}.log", self.runs));
        let mut c = Command::new("nats-server");
        if let Some(conf) = &self.config {
            c.arg("-c").arg(conf);
        }
        c.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-sd",
        ])
        .arg(self.store.path().join("js"))
        .arg("-l")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        self.child = Some(c.spawn().expect("start nats-server (is it installed?)"));
        wait_for_line(&log, "Server is ready");
    }

    /// Stops the server (SIGTERM), keeping its store.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child, "TERM");
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        self.boot();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child, "KILL");
        }
    }
}

/// A signing key pair in a temp dir.
pub struct Keys {
    dir: tempfile::TempDir,
    pub public: String,
}

impl Keys {
    pub fn generate() -> Keys {
        let dir = tempfile::tempdir().expect("key dir");
        let out = Command::new(crate::binary("capstan-coordinator"))
            .arg("keygen")
            .arg("--out")
            .arg(dir.path().join("signing.key"))
            .output()
            .expect("run keygen");
        assert!(out.status.success(), "keygen failed");
        Keys {
            public: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            dir,
        }
    }

    pub fn secret_file(&self) -> PathBuf {
        self.dir.path().join("signing.key")
    }

    pub fn secret_hex(&self) -> String {
        std::fs::read_to_string(self.secret_file())
            .expect("key")
            .trim()
            .to_string()
    }
}

/// A running `capstan-coordinator` on a free port.
pub struct Coordinator {
    dir: tempfile::TempDir,
    child: Option<Child>,
    pub url: String,
}

impl Coordinator {
    /// `nats_extra` is appended to the `[nats]` section (auth options).
    pub fn start(nats_url: &str, keys: &Keys, nats_extra: &str) -> Coordinator {
        Self::start_with(nats_url, keys, "", nats_extra)
    }

    /// With extra top-level config lines too.
    pub fn start_with(nats_url: &str, keys: &Keys, top: &str, nats_extra: &str) -> Coordinator {
        let dir = tempfile::tempdir().expect("coordinator dir");
        let config = dir.path().join("coordinator.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nsigning_key_file = \"{}\"\n{top}\n[nats]\nurl = \"{nats_url}\"\n{nats_extra}\n",
                keys.secret_file().display()
            ),
        )
        .expect("write coordinator config");
        let log = dir.path().join("coordinator.log");
        let child = Command::new(crate::binary("capstan-coordinator"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start coordinator");
        let text = wait_for_line(&log, "capstan-coordinator ready");
        let addr = text
            .lines()
            .find(|l| l.contains("capstan-coordinator ready"))
            .and_then(|l| l.split("listen=").nth(1))
            .map(|s| s.split_whitespace().next().unwrap_or_default().to_string())
            .expect("listen address in the ready line");
        let coordinator = Coordinator {
            dir,
            child: Some(child),
            url: format!("http://{addr}"),
        };
        wait_until("coordinator healthy", || {
            coordinator.cli(&["hosts"]).status.success().then_some(())
        });
        coordinator
    }

    /// Runs `capstan --json --coordinator URL ARGS…`.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(crate::binary("capstan"))
            .arg("--json")
            .arg("--coordinator")
            .arg(&self.url)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run capstan")
    }

    /// `capstan --json ARGS…` parsed; panics unless it exits with `code`.
    pub fn cli_json(&self, args: &[&str], code: i32) -> Value {
        let out = self.cli(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "capstan {args:?}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("capstan --json output")
    }

    /// Submits one command (JSON text) through the CLI; returns its id.
    pub fn submit(&self, command: &str) -> String {
        let file = self.dir.path().join(format!("cmd-{}.json", unique()));
        std::fs::write(&file, command).expect("write command");
        let v = self.cli_json(&["submit", file.to_str().expect("path")], 0);
        v["id"].as_str().expect("id").to_string()
    }

    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("coordinator.log")
    }

    /// Submits each `(id, op fields)` for `host` in turn and waits for it to succeed.
    pub fn run_all(&self, host: &str, commands: &[(&str, &str)]) {
        for (id, fields) in commands {
            let id = self.submit(&command(host, id, fields));
            let status = self.cli_json(&["wait", &id, "--timeout", "60s"], 0);
            assert_eq!(status["status"], "succeeded", "{status}");
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child, "KILL");
        }
    }
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

/// A `capstan-agent run` connected to NATS, with its own data dir.
pub struct NatsAgent {
    pub agent: Agent,
    child: Option<Child>,
    runs: u32,
    config: PathBuf,
}

impl NatsAgent {
    /// Writes the agent's config (`[nats]` with `nats_extra`, `[signing]` trusting
    /// `public_key`) and starts it; returns once it takes commands.
    pub fn start(host: &str, nats_url: &str, public_key: &str, nats_extra: &str) -> NatsAgent {
        let agent = Agent::new(host);
        let config = agent.data_dir().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[nats]\nurl = \"{nats_url}\"\n{nats_extra}\n[signing]\npublic_keys = [\"{public_key}\"]\nmax_age_secs = 600\n"
            ),
        )
        .expect("write agent config");
        let mut a = NatsAgent {
            agent,
            child: None,
            runs: 0,
            config,
        };
        a.run(&[]);
        a
    }

    /// The stderr of run number `n` (1-based).
    pub fn log_file(&self, n: u32) -> PathBuf {
        self.agent.data_dir().join(format!("agent-{n}.log"))
    }

    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// Starts `capstan-agent run` with extra env vars; waits for "taking commands".
    pub fn run(&mut self, env: &[(&str, &str)]) {
        self.spawn(env);
        wait_for_line(&self.log_file(self.runs), "taking commands");
    }

    /// Starts it without waiting for NATS (for outages).
    pub fn spawn(&mut self, env: &[(&str, &str)]) {
        self.runs += 1;
        let mut c = self.agent.command();
        c.arg("--config").arg(&self.config).arg("run");
        c.env("RUST_LOG", "info,async_nats=warn");
        for (k, v) in env {
            c.env(k, v);
        }
        let log = std::fs::File::create(self.log_file(self.runs)).expect("log file");
        self.child = Some(
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start capstan-agent run"),
        );
    }

    /// SIGTERM and wait (graceful stop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child, "TERM");
        }
    }

    /// SIGKILL (a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child, "KILL");
        }
    }

    /// The sim host's state file.
    pub fn sim_host(&self) -> Value {
        let text = std::fs::read_to_string(self.agent.data_dir().join("sim-host.json"))
            .unwrap_or_else(|_| "{}".into());
        serde_json::from_str(&text).expect("sim host JSON")
    }
}

impl Drop for NatsAgent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A current-thread tokio runtime for a test's direct NATS or HTTP calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Op fields used across the NATS tests: namespace `shop`, workload `web`, `r1`.
pub const ENSURE_SHOP: &str = r#""op":"ensure_namespace","namespace":"shop""#;
pub const PREPARE_WEB_R1: &str = r#""op":"prepare_revision","namespace":"shop","workload":"web","revision":"r1","spec":{"driver":"sim"}"#;
pub const ACTIVATE_WEB_R1: &str =
    r#""op":"activate_revision","namespace":"shop","workload":"web","revision":"r1""#;

/// A command's JSON text for `host` (no `issued_at`: the coordinator fills it).
pub fn command(host: &str, id: &str, op_fields: &str) -> String {
    format!(r#"{{"v":1,"id":"{id}","host":"{host}",{op_fields}}}"#)
}

/// Writes `text` to a new temp file and returns it (kept until the process exits).
pub fn temp_file(text: &str) -> PathBuf {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(text.as_bytes()).expect("write temp file");
    f.into_temp_path().keep().expect("keep temp file")
}
