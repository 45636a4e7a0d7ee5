//! The NATS side: a private nats-server per test (or a [`NatsCluster`] of three),
//! signing keys, coordinators as real processes and the `capstan` CLI. Agents that take commands from NATS are ordinary
//! [`crate::agent::Agent`]s built with `.nats(url).signing(key)`.

use crate::command::Cmd;
use crate::process::{Exit, Process};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use capstan_testsupport::{free_port, listening_port, nats_server_binary};

/// A private nats-server with JetStream, on a loopback port it picks itself (or on
/// another address of this machine: [`NatsServer::start_on`]), read from its own log
/// (as `capstan_testsupport::NatsServer` does, and for the same reason); a restart
/// takes the same port again.
pub struct NatsServer {
    pub port: u16,
    addr: String,
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
        Self::start_at("127.0.0.1", config)
    }

    /// Listening on `addr`, an address of this machine (e.g. a fleet's hub,
    /// [`crate::fleet::Fleet::hub_addr`]).
    pub fn start_on(addr: &str) -> NatsServer {
        Self::start_at(addr, None)
    }

    fn start_at(addr: &str, config: Option<&Path>) -> NatsServer {
        crate::watchdog::watch();
        let mut server = NatsServer {
            port: 0,
            addr: addr.to_string(),
            store: tempfile::tempdir().expect("store dir"),
            config: config.map(Path::to_path_buf),
            process: None,
            runs: 0,
        };
        server.boot();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.addr, self.port)
    }

    /// The pid of the running server (a benchmark reads its CPU).
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("the server runs").id()
    }

    fn boot(&mut self) {
        self.runs += 1;
        let mut c = Command::new(nats_server_binary());
        if let Some(conf) = &self.config {
            c.arg("-c").arg(conf);
        }
        // The first run picks its port (-1); a restart takes that one again.
        let port = match self.port {
            0 => "-1".to_string(),
            port => port.to_string(),
        };
        c.args(["-js", "-a", &self.addr, "-p", &port, "-sd"])
            .arg(self.store.path().join("js"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = self.store.path().join(format!("server-{}.log", self.runs));
        let process = Process::spawn(
            format!("nats-server (port {port}, run {})", self.runs),
            c,
            &log,
        );
        let said = process.wait_for_text("Server is ready");
        self.port = listening_port(&said).expect("nats-server says its client port");
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

/// A JetStream cluster of nats-server processes on loopback, each with its own free
/// client, cluster (route) and monitoring ports, store dir and server name (`n0`,
/// `n1`, …), routed to each other. Every process is SIGKILLed (by pid) on drop.
pub struct NatsCluster {
    dir: tempfile::TempDir,
    nodes: Vec<ClusterNode>,
}

struct ClusterNode {
    name: String,
    port: u16,
    cluster_port: u16,
    monitor_port: u16,
    process: Option<Process>,
    runs: u32,
}

impl NatsCluster {
    /// Starts `size` servers and waits until they form a JetStream cluster: every
    /// server healthy (`/healthz`) and agreeing on a meta leader with `size` peers.
    pub fn start(size: usize) -> NatsCluster {
        crate::watchdog::watch();
        let mut cluster = NatsCluster {
            dir: tempfile::tempdir().expect("cluster dir"),
            nodes: (0..size)
                .map(|i| ClusterNode {
                    name: format!("n{i}"),
                    port: free_port(),
                    cluster_port: free_port(),
                    monitor_port: free_port(),
                    process: None,
                    runs: 0,
                })
                .collect(),
        };
        for i in 0..size {
            cluster.boot(i);
        }
        for i in 0..size {
            cluster.wait_current(i);
        }
        cluster
    }

    /// The client URLs of every server, comma-separated (a `[nats] url`).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The server name of node `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The pid of every running node.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.process.as_ref().map(Process::id))
            .collect()
    }

    fn boot(&mut self, i: usize) {
        let routes = self
            .nodes
            .iter()
            .filter(|n| n.name != self.nodes[i].name)
            .map(|n| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect::<Vec<_>>()
            .join(",");
        let store = self.dir.path().join(&self.nodes[i].name);
        let node = &mut self.nodes[i];
        node.runs += 1;
        let mut c = Command::new(nats_server_binary());
        c.args(["-js", "-a", "127.0.0.1"])
            .args(["-p", &node.port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["--server_name", &node.name])
            .args(["--cluster_name", "capstan"])
            .args([
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.cluster_port),
            ])
            .args(["--routes", &routes])
            .arg("-sd")
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = self
            .dir
            .path()
            .join(format!("{}-{}.log", node.name, node.runs));
        let process = Process::spawn(
            format!(
                "nats-server {} (port {}, run {})",
                node.name, node.port, node.runs
            ),
            c,
            &log,
        );
        process.wait_for_text("Server is ready");
        node.process = Some(process);
    }

    /// GET `path` from node `i`'s monitoring port: the status and the body, or `None`
    /// when it does not answer (within 2 s).
    pub fn monitor(&self, i: usize, path: &str) -> Option<(u16, Value)> {
        http_get(self.nodes[i].monitor_port, path)
    }

    /// Node `i`'s `/jsz` (JetStream state), `None` while it does not answer.
    pub fn jsz(&self, i: usize, query: &str) -> Option<Value> {
        match self.monitor(i, &format!("/jsz{query}"))? {
            (200, v) => Some(v),
            _ => None,
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|i| self.nodes[*i].process.is_some())
    }

    /// Whether node `i` is healthy (`/healthz` 200: JetStream enabled and current)
    /// and knows a meta leader that sees every other node as a current, online peer.
    pub fn current(&self, i: usize) -> bool {
        if !matches!(self.monitor(i, "/healthz"), Some((200, _))) {
            return false;
        }
        let Some(leader) = self
            .jsz(i, "")
            .and_then(|j| j["meta_cluster"]["leader"].as_str().map(str::to_string))
            .and_then(|name| self.index(&name))
        else {
            return false;
        };
        let Some(meta) = self.jsz(leader, "").map(|j| j["meta_cluster"].clone()) else {
            return false;
        };
        let peers = meta["replicas"].as_array().cloned().unwrap_or_default();
        meta["leader"] == self.nodes[leader].name.as_str()
            && peers.len() + 1 == self.nodes.len()
            && peers
                .iter()
                .all(|p| p["current"] == true && p["offline"] != true)
    }

    /// Waits until node `i` is [`NatsCluster::current`].
    #[track_caller]
    pub fn wait_current(&self, i: usize) {
        let node = &self.nodes[i];
        crate::wait_until(
            format_args!(
                "nats-server {} to be current in a cluster of {}; its log:\n{}",
                node.name,
                self.nodes.len(),
                node.process
                    .as_ref()
                    .map(Process::stderr)
                    .unwrap_or_default()
            ),
            crate::READY,
            || self.current(i),
        );
    }

    /// The node that is the JetStream meta leader, as the running nodes agree (waits,
    /// bounded, while there is none: during an election).
    #[track_caller]
    pub fn leader(&self) -> usize {
        crate::wait_until(
            "the cluster to agree on a meta leader",
            crate::READY,
            || {
                let seen: Vec<Option<usize>> = self
                    .running()
                    .map(|i| {
                        self.jsz(i, "")
                            .and_then(|j| j["meta_cluster"]["leader"].as_str().map(str::to_string))
                            .and_then(|n| self.index(&n))
                    })
                    .collect();
                match seen.first() {
                    Some(Some(l)) if seen.iter().all(|s| *s == Some(*l)) => Some(*l),
                    _ => None,
                }
            },
        )
    }

    /// The stream's details (config, and cluster: leader, replicas) as its leader's
    /// `/jsz` shows them (a follower sees the other followers as not current), `None`
    /// while no running node shows the stream or its leader does not answer.
    pub fn stream(&self, name: &str) -> Option<Value> {
        let on = |i: usize| {
            let jsz = self.jsz(i, "?accounts=true&streams=true&config=true")?;
            jsz["account_details"]
                .as_array()?
                .iter()
                .flat_map(|a| a["stream_detail"].as_array().cloned().unwrap_or_default())
                .find(|s| s["name"] == name)
        };
        let seen = self.running().find_map(on)?;
        let leader = self.index(seen["cluster"]["leader"].as_str()?)?;
        on(leader).filter(|s| s["cluster"]["leader"] == self.nodes[leader].name.as_str())
    }

    /// The node that leads the stream `name` (waits, bounded, while it has none).
    #[track_caller]
    pub fn stream_leader(&self, name: &str) -> usize {
        crate::wait_until(
            format_args!("a leader of stream {name}"),
            crate::READY,
            || {
                self.stream(name)
                    .and_then(|s| s["cluster"]["leader"].as_str().map(str::to_string))
                    .and_then(|n| self.index(&n))
            },
        )
    }

    /// Makes a node other than `avoid` lead stream `name`: while `avoid` leads it, asks
    /// the leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN`); bounded. Returns
    /// the new leader.
    #[track_caller]
    pub fn lead_stream_elsewhere(&self, name: &str, avoid: usize) -> usize {
        let rt = runtime();
        let urls: Vec<String> = self.url().split(',').map(str::to_string).collect();
        let client = rt
            .block_on(async_nats::connect(urls))
            .expect("connect to the cluster");
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{name}");
        crate::wait_until(
            format_args!(
                "stream {name} led by another node than {}",
                self.nodes[avoid].name
            ),
            crate::READY,
            || {
                let leader = self.stream_leader(name);
                if leader != avoid {
                    return Some(leader);
                }
                // Refused while no other replica is current: tried again.
                let _ = rt.block_on(client.request(subject.clone(), "".into()));
                None
            },
        )
    }

    /// A crash of node `i`: SIGKILL, asserting that SIGKILL ended it.
    #[track_caller]
    pub fn kill(&mut self, i: usize) {
        let process = self.nodes[i].process.take().expect("the node runs");
        process.kill();
    }

    /// Stops every running node (SIGINT), asserting each exits 0.
    #[track_caller]
    pub fn stop(mut self) {
        for node in &mut self.nodes {
            if let Some(process) = node.process.take() {
                process.signal_expecting(libc::SIGINT, Exit::OK);
            }
        }
    }

    /// Starts node `i` again (same ports, store and name) and waits until it is
    /// current again.
    #[track_caller]
    pub fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].process.is_none(), "kill({i}) first");
        self.boot(i);
        self.wait_current(i);
    }
}

/// A plain HTTP/1.0 GET on loopback `port` (nats-server's monitoring endpoint, a
/// coordinator without tokens): the status and the JSON body (`Null` if it is not
/// JSON). `None` if it does not answer within 2 s.
pub fn http_get(port: u16, path: &str) -> Option<(u16, Value)> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// A nats-server config with an account per host (`capstan-coordinator
/// nats-config`), its nkeys in its own temp dir.
pub struct Accounts {
    dir: tempfile::TempDir,
}

impl Accounts {
    /// For `hosts`, each with a storage quota of `host_quota` (`64M`, …), and the
    /// fleet account at its smallest (`2G`): nats-server 2.9 will not start when an
    /// account's `max_file` exceeds what its store may use (75 % of the free disk),
    /// and the default `8G` would tie the tests to the disk's free space.
    pub fn generate(hosts: &[&str], host_quota: &str) -> Accounts {
        let dir = tempfile::tempdir().expect("accounts dir");
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.arg("nats-config").arg("--out").arg(dir.path());
        c.args(["--host-quota", host_quota, "--fleet-quota", "2G"]);
        for h in hosts {
            c.args(["--host", h]);
        }
        let out = crate::process::output("capstan-coordinator nats-config", crate::READY, c);
        assert!(
            out.status.success(),
            "nats-config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Accounts { dir }
    }

    /// The server config.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("nats-server.conf")
    }

    /// The nkey seed file of `user` (a host, or `coordinator`).
    pub fn seed_file(&self, user: &str) -> PathBuf {
        self.dir
            .path()
            .join("credentials")
            .join(format!("{user}.nk"))
    }

    /// The nkey seed of `user`.
    pub fn seed(&self, user: &str) -> String {
        std::fs::read_to_string(self.seed_file(user))
            .expect("seed")
            .trim()
            .to_string()
    }

    /// The `[nats]` lines of `user`'s config (agent or coordinator).
    pub fn nats_lines(&self, user: &str) -> String {
        format!(
            "nkey_seed_file = {:?}\nhost_accounts = true",
            self.seed_file(user).display().to_string()
        )
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
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.arg("keygen")
            .arg("--out")
            .arg(dir.path().join("signing.key"));
        let out = crate::process::output("capstan-coordinator keygen", crate::READY, c);
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
        let url = format!("{}/v1/hosts/{host}/status", self.url);
        let (status, body) = runtime().block_on(async {
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
        });
        assert_eq!(status, 200, "GET {url}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: {e}: {body}"))
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

/// A current-thread tokio runtime for a test's direct NATS or HTTP calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
