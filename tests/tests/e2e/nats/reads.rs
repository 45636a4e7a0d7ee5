//! Reads that never go back, on a three-node cluster (`replicas = 3`, per-host
//! accounts): a burst of commands through the HTTP API, each read the moment its
//! `POST` answered 202 and the statuses of those not done yet read again and again.
//! After a 202 every read finds the command (never 404 `command_not_found`), and a
//! command's status never moves backwards (pending → running → succeeded) — also
//! while the leader of the submissions' bucket is SIGKILLed mid-burst and restarted
//! (a 503 meanwhile is allowed: the POST is sent again under its id, a read skipped).
//! A replica's direct get may lag behind an acknowledged write; the coordinator reads
//! submissions and results at the stream's leader.

use capstan_tests::agent::Agent;
use capstan_tests::nats::{runtime, Accounts, Coordinator, Keys, NatsCluster};
use capstan_tests::process::Process;
use serde_json::Value;
use std::time::{Duration, Instant};

const HOSTS: [&str; 2] = ["rd1", "rd2"];
/// Commands a host.
const BURST: usize = 150;
/// How long the coordinator may answer 5xx after a server died.
const FAILOVER: Duration = Duration::from_secs(30);

#[test]
fn after_a_202_every_read_finds_the_command_and_no_status_goes_back() {
    burst(false);
}

#[test]
fn reads_never_go_back_across_a_kill_of_the_submissions_leader() {
    burst(true);
}

/// Where a status is on its way: pending, running, then done.
fn rank(status: &str) -> u8 {
    match status {
        "pending" => 0,
        "running" => 1,
        _ => 2,
    }
}

/// Posts commands and reads them back, keeping what it saw.
struct Reader {
    http: reqwest::Client,
    base: String,
    token: String,
    /// Each command read and the furthest status it was read at.
    seen: Vec<(String, u8)>,
    missing: Vec<String>,
    backwards: Vec<String>,
}

impl Reader {
    /// POSTs `command` until 202 (a 5xx is sent again, same id, within [`FAILOVER`]),
    /// reads it at once, then the ones not done yet again.
    async fn post(&mut self, command: &Value) {
        let id = command["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + FAILOVER;
        loop {
            let posted = (self.http.post(format!("{}/v1/commands", self.base)))
                .bearer_auth(&self.token)
                .json(command)
                .send()
                .await
                .expect("POST a command");
            let code = posted.status().as_u16();
            if code == 202 {
                break;
            }
            assert!(
                code >= 500 && Instant::now() < deadline,
                "{id}: {code} {}",
                posted.text().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.look(&id).await;
        let open: Vec<String> = (self.seen.iter())
            .filter(|(_, rank)| *rank < 2)
            .map(|(id, _)| id.clone())
            .collect();
        for id in open {
            self.look(&id).await;
        }
    }

    /// Reads command `id` once: a 404 is missing, a status before one read earlier is
    /// backwards; a 5xx (a failover) is no answer.
    async fn look(&mut self, id: &str) {
        let answer = (self.http.get(format!("{}/v1/commands/{id}", self.base)))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("GET a command");
        let code = answer.status().as_u16();
        let body: Value = answer.json().await.expect("a JSON answer");
        if code == 404 {
            self.missing.push(format!("{id}: {body}"));
            return;
        }
        if code >= 500 {
            // Not read this time: read again later (as pending, the earliest).
            if !self.seen.iter().any(|(i, _)| i == id) {
                self.seen.push((id.to_string(), 0));
            }
            return;
        }
        assert_eq!(code, 200, "{id}: {body}");
        let now = rank(body["status"].as_str().expect("status"));
        match self.seen.iter_mut().find(|(i, _)| i == id) {
            Some((_, before)) if now < *before => {
                self.backwards.push(format!("{id}: {before} then {body}"));
            }
            Some((_, before)) => *before = now,
            None => self.seen.push((id.to_string(), now)),
        }
    }

    /// Reads every command again until each is done.
    async fn until_done(&mut self) {
        let deadline = Instant::now() + capstan_tests::READY;
        while self.seen.iter().any(|(_, rank)| *rank < 2) {
            let open: Vec<&(String, u8)> = self.seen.iter().filter(|(_, r)| *r < 2).collect();
            assert!(Instant::now() < deadline, "not done: {open:?}");
            let ids: Vec<String> = self.seen.iter().map(|(id, _)| id.clone()).collect();
            for id in ids {
                self.look(&id).await;
            }
        }
    }
}

fn burst(kill: bool) {
    let accounts = Accounts::generate_with(&HOSTS, "256M", "8G");
    let mut cluster = NatsCluster::start_with(3, Some(&accounts.config()));
    let keys = Keys::generate();
    let nats = |user: &str| format!("replicas = 3\n{}", accounts.nats_lines(user));
    let coordinator = Coordinator::start(&cluster.url(), &keys, &nats("coordinator"));
    let agents: Vec<Agent> = HOSTS
        .iter()
        .map(|h| {
            Agent::builder(h)
                .nats(&cluster.url())
                .nats_extra(&nats(h))
                .signing(&keys.public)
                .registered_with(&coordinator.url, &coordinator.token)
                .build()
        })
        .collect();
    let daemons: Vec<Process> = agents.iter().map(Agent::run).collect();

    let commands: Vec<Value> = (0..BURST)
        .flat_map(|n| {
            agents.iter().map(move |a| {
                let c = a.commands("ns");
                let id = format!("burst-{n}.{}", a.host);
                serde_json::from_str(&c.ensure_namespace(&id).without("issued_at").to_string())
                    .expect("a command")
            })
        })
        .collect();
    let mut reader = Reader {
        http: reqwest::Client::new(),
        base: coordinator.url.clone(),
        token: coordinator.token.clone(),
        seen: Vec::new(),
        missing: Vec::new(),
        backwards: Vec::new(),
    };
    let rt = runtime();
    let thirds: Vec<&[Value]> = commands.chunks(commands.len().div_ceil(3)).collect();
    let mut killed = None;
    for (n, third) in thirds.iter().enumerate() {
        if kill && n == 1 {
            let leader = cluster.stream_leader("KV_capstan_commands");
            eprintln!(
                "killing {}, leader of KV_capstan_commands",
                cluster.name(leader)
            );
            cluster.kill(leader);
            killed = Some(leader);
        }
        if let (2, Some(node)) = (n, killed) {
            cluster.restart(node);
        }
        rt.block_on(async {
            for command in third.iter() {
                reader.post(command).await;
            }
        });
    }
    rt.block_on(reader.until_done());
    assert_eq!(reader.seen.len(), commands.len(), "every command read");
    assert!(
        reader.missing.is_empty(),
        "404 after a 202: {:#?}",
        reader.missing
    );
    assert!(
        reader.backwards.is_empty(),
        "statuses gone back: {:#?}",
        reader.backwards
    );
    for daemon in daemons {
        daemon.stop();
    }
    coordinator.stop();
    cluster.stop();
}
