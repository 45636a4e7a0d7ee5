//! A JetStream cluster of nats-servers: started until current, its meta and stream
//! leaders read from the monitoring endpoints, nodes killed and restarted.

use super::{http_get, runtime};
use crate::process::{Exit, Process};
use capstan_testsupport::{free_port, nats_server_binary, store_limited_config};
use serde_json::Value;
use std::process::{Command, Stdio};

/// A JetStream cluster of nats-server processes on loopback, each with its own free
/// client, cluster (route) and monitoring ports, store dir and server name (`n0`,
/// `n1`, …), routed to each other. Every process is SIGKILLed (by pid) on drop.
pub struct NatsCluster {
    dir: tempfile::TempDir,
    nodes: Vec<ClusterNode>,
    /// A server config every node loads (`-c`): the per-host accounts of
    /// `capstan-coordinator nats-config`.
    config: Option<std::path::PathBuf>,
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
        NatsCluster::start_with(size, None)
    }

    /// [`NatsCluster::start`], every node loading `config` (e.g. the accounts of
    /// `capstan-coordinator nats-config`); the command line gives ports, names and
    /// routes.
    pub fn start_with(size: usize, config: Option<&std::path::Path>) -> NatsCluster {
        crate::watchdog::watch();
        let mut cluster = NatsCluster {
            config: config.map(std::path::Path::to_path_buf),
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
        // Its store bounded by a set limit, not by the disk's free space.
        let config = store_limited_config(self.dir.path(), self.config.as_deref());
        c.arg("-c").arg(config);
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

    /// The node that is the JetStream meta leader, as the running nodes agree, and
    /// running (waits, bounded, while there is none: during an election, or while the
    /// survivors still name a node that was killed).
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
                // The survivors of a killed leader name it until they notice.
                match seen.first() {
                    Some(Some(l))
                        if seen.iter().all(|s| *s == Some(*l))
                            && self.running().any(|i| i == *l) =>
                    {
                        Some(*l)
                    }
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
