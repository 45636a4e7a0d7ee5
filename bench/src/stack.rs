//! A control-path stack for the benchmarks: a private nats-server, a coordinator and
//! sim agents (the release binaries next to `capstan-bench`, through the test
//! harness), and the ways a benchmark talks to them: the HTTP API, or signed commands
//! published straight to `CAPSTAN_COMMANDS` with results followed in `capstan_results`.

use anyhow::Context as _;
use capstan_common::signing::Signer;
use capstan_common::status::CommandStatus;
use capstan_common::{nats_layout, Command, Op};
use capstan_tests::agent::Agent;
use capstan_tests::nats::{Coordinator, Keys, NatsServer};
use capstan_tests::process::Process;
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashSet;
use std::time::{Duration, Instant};

pub struct Stack {
    pub server: NatsServer,
    pub keys: Keys,
    pub coordinator: Coordinator,
    pub http: reqwest::Client,
    agents: Vec<(Agent, Process)>,
}

impl Stack {
    /// nats-server, a coordinator, and one sim agent per host in `hosts`.
    pub fn start(hosts: &[&str]) -> Stack {
        Stack::on(NatsServer::start(), hosts)
    }

    /// [`Stack::start`] with a nats-server already started (e.g. on a fleet's hub).
    pub fn on(server: NatsServer, hosts: &[&str]) -> Stack {
        let keys = Keys::generate();
        let coordinator = Coordinator::start(&server.url(), &keys, "");
        let mut stack = Stack {
            server,
            keys,
            coordinator,
            http: reqwest::Client::new(),
            agents: Vec::new(),
        };
        for host in hosts {
            let agent = Agent::builder(host)
                .without_hooks()
                .nats(&stack.server.url())
                .signing(&stack.keys.public)
                .build();
            let daemon = agent.run();
            stack.agents.push((agent, daemon));
        }
        stack
    }

    /// Adds `capstan-agent sim-fleet` with `hosts` hosts `<prefix>-0001…` and waits
    /// until every one is alive in the coordinator's registry.
    pub fn sim_fleet(&mut self, hosts: usize, prefix: &str) -> Vec<String> {
        let config = Agent::builder(prefix)
            .without_hooks()
            .nats(&self.server.url())
            .signing(&self.keys.public)
            .build();
        let process = config.sim_fleet(hosts, prefix);
        // Every host's key (`sim-fleet` lists them in `host-keys`), registered in one
        // call: a host is alive only with a registered key.
        let keys = config.data_dir().join(capstan_agent::sim_fleet::KEYS_FILE);
        let out = self
            .coordinator
            .cli(&["register", "--file", &keys.display().to_string()]);
        assert!(
            out.status.success(),
            "capstan register --file: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.agents.push((config, process));
        let names: Vec<String> = (1..=hosts).map(|i| format!("{prefix}-{i:04}")).collect();
        self.coordinator
            .wait_for_hosts("every simulated host alive", |v| {
                let alive: HashSet<&str> = v["hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|h| h["status"] == "alive")
                    .filter_map(|h| h["host"].as_str())
                    .collect();
                names.iter().all(|n| alive.contains(n.as_str()))
            });
        names
    }

    /// The pid of the `n`th agent process started.
    pub fn agent_pid(&self, n: usize) -> u32 {
        self.agents[n].1.id()
    }

    /// Stops everything, asserting each process's exit status.
    pub fn stop(self) {
        for (_, daemon) in self.agents {
            daemon.stop();
        }
        self.coordinator.stop();
    }

    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        Ok(async_nats::connect(self.server.url()).await?)
    }

    /// POSTs a command (`host`, `id`, op fields); its id.
    pub async fn submit(&self, body: &Value) -> anyhow::Result<String> {
        let answer: Value = self
            .http
            .post(format!("{}/v1/commands", self.coordinator.url))
            .bearer_auth(&self.coordinator.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?
            .json()
            .await?;
        answer["id"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("POST answered {answer}"))
    }

    /// GETs `path` (under `/v1/`) and checks the answer is a done, succeeded status
    /// when it is a command's.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let answer: Value = self
            .http
            .get(format!("{}/v1/{path}", self.coordinator.url))
            .bearer_auth(&self.coordinator.token)
            .send()
            .await?
            .json()
            .await?;
        if path.starts_with("commands/") {
            anyhow::ensure!(answer["status"] == "succeeded", "{path}: {answer}");
        }
        Ok(answer)
    }
}

/// Signed commands for `host`, published straight to `CAPSTAN_COMMANDS`, their results
/// followed on `capstan_results`.
pub struct Publisher {
    pub client: async_nats::Client,
    signer: Signer,
    host: String,
}

impl Publisher {
    pub async fn new(stack: &Stack, host: &str) -> anyhow::Result<Publisher> {
        Ok(Publisher {
            client: stack.connect().await?,
            signer: Signer::from_hex(&stack.keys.secret_hex())?,
            host: host.to_string(),
        })
    }

    pub fn command(&self, id: String, op: Op) -> Command {
        Command {
            v: 1,
            id,
            host: self.host.clone(),
            issued_at: chrono::Utc::now(),
            deadline: None,
            op,
        }
    }

    /// The signed body of `command`, as [`Publisher::run`] publishes it.
    pub fn body(&self, command: &Command) -> String {
        self.signer.signed_json(command)
    }

    /// Publishes `commands` (a thousand sent before their acks are awaited) and waits
    /// until each has a done result; how long that took from the first publish. The
    /// commands are signed before the clock starts: signing is the coordinator's work
    /// (on its own machine in a fleet), and the in-process baseline signs nothing.
    pub async fn run(&self, commands: &[Command], timeout: Duration) -> anyhow::Result<Duration> {
        let js = async_nats::jetstream::new(self.client.clone());
        let mut results = self
            .client
            .subscribe(format!(
                "$KV.{}.{}.*",
                nats_layout::RESULTS_BUCKET,
                self.host
            ))
            .await?;
        let mut waiting: HashSet<&str> = commands.iter().map(|c| c.id.as_str()).collect();
        let bodies: Vec<String> = commands.iter().map(|c| self.body(c)).collect();
        let t = Instant::now();
        // Acks awaited a thousand at a time: async-nats holds at most a few thousand
        // unawaited acks and then makes `publish` wait.
        for chunk in bodies.chunks(1000) {
            let mut acks = Vec::with_capacity(chunk.len());
            for body in chunk {
                let body = body.clone();
                acks.push(
                    js.publish(nats_layout::cmd_subject(&self.host), body.into())
                        .await?,
                );
            }
            for ack in acks {
                ack.await?;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while !waiting.is_empty() {
            let message = tokio::time::timeout_at(deadline, results.next())
                .await
                .with_context(|| format!("{} commands without a result", waiting.len()))?
                .context("the results subscription ended")?;
            let Ok(status) = serde_json::from_slice::<CommandStatus>(&message.payload) else {
                continue;
            };
            if status.done {
                anyhow::ensure!(status.status == "succeeded", "{status:?}");
                waiting.remove(status.id.as_str());
            }
        }
        Ok(t.elapsed())
    }
}

/// The `p`th percentile (0–100) of `samples`, in milliseconds.
pub fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p / 100.0).round() as usize;
    samples[i].as_secs_f64() * 1000.0
}
