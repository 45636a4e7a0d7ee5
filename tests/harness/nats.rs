//! The NATS side: a private nats-server per test, signing keys, coordinators as real
//! processes and the `capstan` CLI. Agents that take commands from NATS are ordinary
//! [`crate::agent::Agent`]s built with `.nats(url).signing(key)`.

use crate::command::Cmd;
use crate::process::{Exit, Process};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The nats-server binary the tests run: `$CAPSTAN_NATS_SERVER` (`scripts/test.sh` sets
/// it to the build of `.ci/nats.sh`), else `nats-server` from `PATH`.
pub fn server_binary() -> String {
    std::env::var("CAPSTAN_NATS_SERVER").unwrap_or_else(|_| "nats-server".into())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A private nats-server with JetStream, on a free loopback port.
pub struct NatsServer {
    pub port: u16,
    store: tempfile::TempDir,
    config: Option<PathBuf>,
    process: Option<Process>,
    runs: u32,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_with(None)
    }

    /// With a server config file (its listen address and store are overridden).
    pub fn start_with(config: Option<&Path>) -> NatsServer {
        crate::watchdog::watch();
        let mut server = NatsServer {
            port: free_port(),
            store: tempfile::tempdir().expect("store dir"),
            config: config.map(Path::to_path_buf),
            process: None,
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
        let mut c = Command::new(server_binary());
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
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let log = self.store.path().join(format!("server-{}.log", self.runs));
        let process = Process::spawn(
            format!("nats-server (port {}, run {})", self.port, self.runs),
            c,
            &log,
        );
        process.wait_for_text("Server is ready");
        self.process = Some(process);
    }

    /// Stops the server (SIGINT), keeping its store, asserting exit 0. (On SIGTERM,
    /// nats-server 2.9 exits 1 and 2.15 exits 0; both exit 0 on SIGINT.)
    #[track_caller]
    pub fn stop(&mut self) {
        let process = self.process.take().expect("the server runs");
        process.signal_expecting(libc::SIGINT, Exit::OK);
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        assert!(self.process.is_none(), "stop() first");
        self.boot();
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

/// A running `capstan-coordinator` on a free port, with a tokens file holding one
/// `submit` token (made by `capstan-coordinator token`).
pub struct Coordinator {
    dir: tempfile::TempDir,
    process: Process,
    pub url: String,
    /// The `submit` API token; [`Coordinator::cli`] passes it as `CAPSTAN_TOKEN`.
    pub token: String,
    submitted: AtomicU32,
}

impl Coordinator {
    /// `nats_extra` is appended to the `[nats]` section (auth options).
    pub fn start(nats_url: &str, keys: &Keys, nats_extra: &str) -> Coordinator {
        Self::start_with(nats_url, keys, "", nats_extra)
    }

    /// With extra top-level config lines too.
    pub fn start_with(nats_url: &str, keys: &Keys, top: &str, nats_extra: &str) -> Coordinator {
        crate::watchdog::watch();
        let dir = tempfile::tempdir().expect("coordinator dir");
        let config = dir.path().join("coordinator.toml");
        let tokens = dir.path().join("tokens");
        let out = Command::new(crate::binary("capstan-coordinator"))
            .args([
                "token",
                "--role",
                "submit",
                "--name",
                "tests",
                "--append-to",
            ])
            .arg(&tokens)
            .output()
            .expect("run capstan-coordinator token");
        assert!(out.status.success(), "token failed");
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nsigning_key_file = {:?}\ntokens_file = {:?}\n{top}\n[nats]\nurl = {nats_url:?}\n{nats_extra}\n",
                keys.secret_file().display().to_string(),
                tokens.display().to_string()
            ),
        )
        .expect("write coordinator config");
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.arg("run")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let process = Process::spawn(
            "capstan-coordinator",
            c,
            &dir.path().join("coordinator.log"),
        );
        let ready = process.wait_for_text("capstan-coordinator ready");
        let addr = ready
            .lines()
            .find(|l| l.contains("capstan-coordinator ready"))
            .and_then(|l| l.split("listen=").nth(1))
            .map(|s| s.split_whitespace().next().unwrap_or_default().to_string())
            .expect("listen address in the ready line");
        let coordinator = Coordinator {
            dir,
            process,
            url: format!("http://{addr}"),
            token,
            submitted: AtomicU32::new(0),
        };
        crate::wait_until("the coordinator to answer `hosts`", crate::READY, || {
            coordinator.cli(&["hosts"]).status.success()
        });
        coordinator
    }

    /// Graceful stop (SIGTERM), asserting exit 0.
    #[track_caller]
    pub fn stop(self) {
        self.process.stop();
    }

    /// Runs `capstan --json --coordinator URL ARGS…` with the token.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(crate::binary("capstan"))
            .arg("--json")
            .arg("--coordinator")
            .arg(&self.url)
            .args(args)
            .env("CAPSTAN_TOKEN", &self.token)
            .env_remove("CAPSTAN_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .expect("run capstan")
    }

    /// `capstan --json ARGS…` parsed; panics unless it exits with `code`.
    #[track_caller]
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

    /// `capstan --json log HOST`: the host's records in CAPSTAN_EVT.
    pub fn events(&self, host: &str) -> Vec<Value> {
        let out = self.cli(&["log", host]);
        assert!(
            out.status.success(),
            "capstan log {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        crate::parse_lines(&out.stdout)
    }

    /// Waits until the answer of `capstan hosts` satisfies `check`; returns it.
    #[track_caller]
    pub fn wait_for_hosts(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        crate::wait_until(what, crate::READY, || {
            let v = self.cli_json(&["hosts"], 0);
            check(&v).then_some(v)
        })
    }

    /// Submits a command through the CLI (without its `issued_at`: the coordinator
    /// signs it with its own time); returns its id.
    pub fn submit(&self, command: &Cmd) -> String {
        let n = self.submitted.fetch_add(1, Ordering::Relaxed);
        let text = command.clone().without("issued_at").to_string();
        let file = self.write(&format!("cmd-{n}.json"), &text);
        let v = self.cli_json(&["submit", file.to_str().expect("path")], 0);
        v["id"].as_str().expect("id").to_string()
    }

    /// Writes `text` to file `name` in the coordinator's temp dir.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    /// Submits each command in turn and waits for it to succeed.
    #[track_caller]
    pub fn run_all(&self, commands: &[Cmd]) {
        for c in commands {
            let id = self.submit(c);
            let status = self.cli_json(&["wait", &id, "--timeout", "60s"], 0);
            assert_eq!(status["status"], "succeeded", "{status}");
        }
    }
}

/// A current-thread tokio runtime for a test's direct NATS or HTTP calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
