//! A `capstan-coordinator` as a real process, and the `capstan` CLI against it.

use super::{runtime, Keys};
use crate::command::Cmd;
use crate::process::Process;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs `capstan --json --coordinator URL ARGS…` with `token`: [`Coordinator::cli`],
/// for a thread that cannot hold the [`Coordinator`] (a controller of its own).
/// Fails the test if it has not ended within [`crate::READY`].
#[track_caller]
pub fn capstan_cli(url: &str, token: &str, args: &[&str]) -> std::process::Output {
    capstan_cli_within(url, token, args, crate::READY)
}

/// [`capstan_cli`] for a run that may take longer than [`crate::READY`] (a rollout
/// over a large fleet): fails the test if it has not ended within `timeout`.
#[track_caller]
pub fn capstan_cli_within(
    url: &str,
    token: &str,
    args: &[&str],
    timeout: std::time::Duration,
) -> std::process::Output {
    let mut c = Command::new(crate::binary("capstan"));
    c.arg("--json")
        .arg("--coordinator")
        .arg(url)
        .args(args)
        .env("CAPSTAN_TOKEN", token)
        .env_remove("CAPSTAN_TOKEN_FILE");
    crate::process::output(format_args!("capstan {args:?}"), timeout, c)
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
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.args([
            "token",
            "--role",
            "submit",
            "--name",
            "tests",
            "--append-to",
        ])
        .arg(&tokens);
        let out = crate::process::output("capstan-coordinator token", crate::READY, c);
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
        crate::wait_until(Answering(&coordinator), crate::READY, || {
            coordinator.cli(&["hosts"]).status.success()
        });
        coordinator
    }

    /// Graceful stop (SIGTERM), asserting exit 0.
    #[track_caller]
    pub fn stop(self) {
        self.process.stop();
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Its diagnostics so far.
    pub fn log(&self) -> String {
        self.process.stderr()
    }

    /// Runs `capstan --json --coordinator URL ARGS…` with the token.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        capstan_cli(&self.url, &self.token, args)
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
        self.try_events(host)
            .unwrap_or_else(|| panic!("capstan log {host}: HTTP 503"))
    }

    /// [`Coordinator::events`], or `None` for the documented 503 of a read that could
    /// not complete (NATS, or a stream's leader, not there right now: a cluster that
    /// just lost a node); any other failure panics.
    pub fn try_events(&self, host: &str) -> Option<Vec<Value>> {
        let out = self.cli(&["log", host]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("(HTTP 503)") {
            return None;
        }
        assert!(out.status.success(), "capstan log {host}: {stderr}");
        Some(crate::parse_lines(&out.stdout))
    }

    /// `GET /v1/hosts/{host}/status` (the agent's `status` answer), which must be 200.
    pub fn host_status(&self, host: &str) -> Value {
        let path = format!("/v1/hosts/{host}/status");
        let (status, body) = self.get(&path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// `GET path` with the coordinator's token: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let url = format!("{}{path}", self.url);
        runtime().block_on(async {
            let client = reqwest::Client::builder()
                .timeout(crate::READY)
                .build()
                .expect("HTTP client");
            let response = client
                .get(&url)
                .bearer_auth(&self.token)
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET {url}: {e}"));
            let status = response.status().as_u16();
            (status, response.text().await.expect("body"))
        })
    }

    /// The value of `series` (a name with its labels, as `/metrics` writes it), if
    /// `/metrics` has it.
    pub fn metric(&self, series: &str) -> Option<u64> {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {text}");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
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

/// How many hosts an answer of `GET /v1/hosts` (`capstan hosts`) lists `alive`.
pub fn alive_count(hosts: &Value) -> usize {
    hosts["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["status"] == "alive")
        .count()
}

/// "the coordinator to answer `hosts`", with its log when that never comes.
struct Answering<'a>(&'a Coordinator);

impl std::fmt::Display for Answering<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the coordinator to answer `hosts`; its log:\n{}",
            self.0.log()
        )
    }
}
