//! A control-path stack for the benchmarks: a private nats-server, a coordinator and
//! sim agents (the release binaries next to `capstan-bench`, through the test
//! harness), and the ways a benchmark talks to them: the HTTP API, or signed commands
//! published straight to `CAPSTAN_COMMANDS` with results followed as the coordinator
//! follows them.
//!
//! The layout is the documented secure one (docs/nats.md): every host's key
//! registered with the coordinator, and per-host NATS accounts (`capstan-coordinator
//! nats-config`), for agents ([`Stack::start`]) and for a `sim-fleet`'s hosts
//! ([`Stack::for_sim_fleet`]: each connects with its own nkey, `--nats-credentials`).

use anyhow::Context as _;
use capstan_common::signing::Signer;
use capstan_common::status::CommandStatus;
use capstan_common::{nats_layout, Command, Op};
use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::nats::{Accounts, Coordinator, Keys, NatsServer};
use capstan_tests::process::Process;
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The names `sim-fleet --hosts N --prefix P` gives its hosts.
pub fn sim_names(hosts: usize, prefix: &str) -> Vec<String> {
    (1..=hosts)
        .map(|i| capstan_agent::sim_fleet::host_name(prefix, i))
        .collect()
}

/// Each storage shard's quota (its hosts' event streams and results) on per-host
/// accounts.
pub const SHARD_QUOTA: &str = "16G";

pub struct Stack {
    pub server: NatsServer,
    pub keys: Keys,
    pub coordinator: Coordinator,
    pub http: reqwest::Client,
    /// The per-host accounts' config and nkeys, when the server runs them.
    accounts: Option<Accounts>,
    agents: Vec<(Agent, Process)>,
}

impl Stack {
    /// nats-server on per-host accounts for `hosts`, a coordinator, and one sim agent
    /// per host, its key registered.
    pub fn start(hosts: &[&str]) -> Stack {
        let accounts = Accounts::generate(hosts, SHARD_QUOTA);
        let server = NatsServer::start_with(Some(&accounts.config()));
        Stack::on(server, Some(accounts), hosts)
    }

    /// nats-server on per-host accounts for the `hosts` hosts `<prefix>-0001…` that
    /// [`Stack::sim_fleet`] then runs, and a coordinator; no agent yet.
    pub fn for_sim_fleet(hosts: usize, prefix: &str) -> Stack {
        let names = sim_names(hosts, prefix);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let accounts = Accounts::generate(&names, SHARD_QUOTA);
        let server = NatsServer::start_with(Some(&accounts.config()));
        Stack::on(server, Some(accounts), &[])
    }

    /// [`Stack::start`] with a nats-server already started (e.g. on a fleet's hub),
    /// with `accounts`' config when given.
    pub fn on(server: NatsServer, accounts: Option<Accounts>, hosts: &[&str]) -> Stack {
        let keys = Keys::generate();
        let nats = accounts
            .as_ref()
            .map(|a| a.nats_lines("coordinator"))
            .unwrap_or_default();
        let coordinator = Coordinator::start(&server.url(), &keys, &nats);
        let mut stack = Stack {
            server,
            keys,
            coordinator,
            http: reqwest::Client::new(),
            accounts,
            agents: Vec::new(),
        };
        for host in hosts {
            let agent = stack
                .join(Agent::builder(host).without_hooks())
                .registered_with(&stack.coordinator.url, &stack.coordinator.token)
                .build();
            let daemon = agent.run();
            stack.agents.push((agent, daemon));
        }
        stack
    }

    /// `builder` taking commands from this stack's server, signed with its keys, with
    /// its host's nkey on per-host accounts.
    fn join(&self, builder: AgentBuilder) -> AgentBuilder {
        let builder = builder.nats(&self.server.url()).signing(&self.keys.public);
        match &self.accounts {
            Some(accounts) => {
                let lines = accounts.nats_lines(builder.host());
                builder.nats_extra(&lines)
            }
            None => builder,
        }
    }

    /// Adds `capstan-agent sim-fleet` with `hosts` hosts `<prefix>-0001…` and waits
    /// until every one is alive in the coordinator's registry.
    pub fn sim_fleet(&mut self, hosts: usize, prefix: &str) -> Vec<String> {
        // The shared config names no credentials: each host connects with its own.
        let config = Agent::builder(prefix)
            .without_hooks()
            .nats(&self.server.url())
            .signing(&self.keys.public)
            .build();
        let credentials = self
            .accounts
            .as_ref()
            .expect("a stack on per-host accounts: Stack::for_sim_fleet")
            .credentials_dir();
        let credentials = credentials.display().to_string();
        let process =
            config.spawn_sim_fleet_with(hosts, prefix, &["--nats-credentials", &credentials]);
        process.wait_for_text("sim fleet ready");
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
        let names = sim_names(hosts, prefix);
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

    /// A connection to the server as the coordinators connect: on per-host accounts
    /// with their nkey, in the fleet's account.
    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        self.connect_as("coordinator").await
    }

    /// A connection as the coordinators reach the hosts: on per-host accounts with
    /// their second nkey (`CAPSTAN_HOSTS`: the hosts' RPC, notices and storage), else
    /// as [`Stack::connect`].
    pub async fn connect_reach(&self) -> anyhow::Result<async_nats::Client> {
        self.connect_as("coordinator-hosts").await
    }

    /// A connection with `user`'s nkey on per-host accounts, else without credentials.
    async fn connect_as(&self, user: &str) -> anyhow::Result<async_nats::Client> {
        let options = match &self.accounts {
            Some(accounts) => async_nats::ConnectOptions::with_nkey(accounts.seed(user)),
            None => async_nats::ConnectOptions::new(),
        };
        Ok(options.connect(self.server.url()).await?)
    }

    /// The subjects `host`'s results can be followed on from [`Stack::connect_reach`]'s
    /// account: the results bucket's puts, or on per-host accounts (where the bucket is
    /// in the host's storage shard) the notices the agent publishes of each put.
    pub fn results_subjects(&self, host: &str) -> String {
        match self.accounts {
            // `nats_layout::result_notice_subject(host, *)`.
            Some(_) => format!("capstan.v1.res.{host}.*"),
            // Unfinished and final results (`nats_layout::final_result_key`).
            None => format!("$KV.{}.{host}.>", nats_layout::RESULTS_BUCKET),
        }
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
/// followed where the coordinator follows them ([`Stack::results_subjects`]).
pub struct Publisher {
    pub client: async_nats::Client,
    /// Where the results are heard ([`Stack::connect_reach`]).
    reach: async_nats::Client,
    signer: Signer,
    host: String,
    /// Where its results are followed ([`Stack::results_subjects`]).
    results: String,
}

impl Publisher {
    pub async fn new(stack: &Stack, host: &str) -> anyhow::Result<Publisher> {
        Ok(Publisher {
            client: stack.connect().await?,
            reach: stack.connect_reach().await?,
            signer: Signer::from_hex(&stack.keys.secret_hex())?,
            host: host.to_string(),
            results: stack.results_subjects(host),
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
        let mut results = self.reach.subscribe(self.results.clone()).await?;
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
