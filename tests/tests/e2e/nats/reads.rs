//! Reads that never go back, on a three-node cluster (`replicas = 3`, per-host
//! accounts): a burst of commands through the HTTP API, each read the moment its
//! `POST` answered 202 and the statuses of those not done yet read again and again.
//! After a 202 every read finds the command (never 404 `command_not_found`), and a
//! command's status never moves backwards (pending → running → succeeded). A
//! replica's direct get may lag behind an acknowledged write; the coordinator reads
//! submissions and results at the stream's leader.

use capstan_tests::agent::Agent;
use capstan_tests::nats::{runtime, Accounts, Coordinator, Keys, NatsCluster};
use capstan_tests::process::Process;
use serde_json::Value;

const HOSTS: [&str; 2] = ["rd1", "rd2"];
/// Commands a host.
const BURST: usize = 150;

/// Where a status is on its way: pending, running, then done.
fn rank(status: &str) -> u8 {
    match status {
        "pending" => 0,
        "running" => 1,
        _ => 2,
    }
}

#[test]
fn after_a_202_every_read_finds_the_command_and_no_status_goes_back() {
    let accounts = Accounts::generate_with(&HOSTS, "256M", "8G");
    let cluster = NatsCluster::start_with(3, Some(&accounts.config()));
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
    let base = coordinator.url.clone();
    let token = coordinator.token.clone();
    let (missing, backwards) = runtime().block_on(async move {
        let http = reqwest::Client::new();
        let status = |id: String| {
            let request = http
                .get(format!("{base}/v1/commands/{id}"))
                .bearer_auth(&token);
            async move {
                let answer = request.send().await.expect("GET a command");
                let code = answer.status().as_u16();
                let body: Value = answer.json().await.expect("a JSON answer");
                (code, body)
            }
        };
        let mut seen: Vec<(String, u8)> = Vec::new();
        let (mut missing, mut backwards) = (Vec::new(), Vec::new());
        let mut look = |id: &str, code: u16, body: &Value, seen: &mut Vec<(String, u8)>| {
            if code == 404 {
                missing.push(format!("{id}: {body}"));
                return;
            }
            assert_eq!(code, 200, "{id}: {body}");
            let now = rank(body["status"].as_str().expect("status"));
            match seen.iter_mut().find(|(i, _)| i == id) {
                Some((_, before)) if now < *before => {
                    backwards.push(format!("{id}: {before} then {body}"));
                }
                Some((_, before)) => *before = now,
                None => seen.push((id.to_string(), now)),
            }
        };
        for command in &commands {
            let id = command["id"].as_str().expect("id").to_string();
            let posted = http
                .post(format!("{base}/v1/commands"))
                .bearer_auth(&token)
                .json(command)
                .send()
                .await
                .expect("POST a command");
            assert_eq!(posted.status().as_u16(), 202, "{id}");
            let (code, body) = status(id.clone()).await;
            look(&id, code, &body, &mut seen);
            // The ones not done yet, again.
            let open: Vec<String> = (seen.iter())
                .filter(|(_, rank)| *rank < 2)
                .map(|(id, _)| id.clone())
                .collect();
            for id in open {
                let (code, body) = status(id.clone()).await;
                look(&id, code, &body, &mut seen);
            }
        }
        // Until every one is done, reading each again.
        let deadline = std::time::Instant::now() + capstan_tests::READY;
        while seen.iter().any(|(_, rank)| *rank < 2) {
            let open: Vec<&(String, u8)> = seen.iter().filter(|(_, r)| *r < 2).collect();
            assert!(
                std::time::Instant::now() < deadline,
                "not done after {:?}: {open:?}",
                capstan_tests::READY
            );
            let ids: Vec<String> = seen.iter().map(|(id, _)| id.clone()).collect();
            for id in ids {
                let (code, body) = status(id.clone()).await;
                look(&id, code, &body, &mut seen);
            }
        }
        (missing, backwards)
    });
    assert!(missing.is_empty(), "404 after a 202: {missing:#?}");
    assert!(backwards.is_empty(), "statuses gone back: {backwards:#?}");
    for daemon in daemons {
        daemon.stop();
    }
    coordinator.stop();
    cluster.stop();
}
