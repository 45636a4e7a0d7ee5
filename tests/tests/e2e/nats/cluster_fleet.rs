//! A rollout to a thousand simulated hosts (`capstan-agent sim-fleet`) over a
//! three-node JetStream cluster (`replicas = 3` everywhere), on the documented secure
//! layout — an account per host (`capstan-coordinator nats-config`), each simulated
//! host connecting with its own nkey (`--nats-credentials`) — with `capstan rollout`
//! as an operator runs it: a namespace, then a revision prepared while the JetStream
//! meta leader is SIGKILLed mid-rollout, then the revision activated with one server
//! still down. Every host succeeds at every step, and every host started its revision
//! exactly once. The rollout rides out the failover itself: submissions and waits
//! the coordinator answers 503 while the cluster elects are asked again.

use capstan_tests::agent::Agent;
use capstan_tests::nats::{
    alive_count, capstan_cli_within, Accounts, Coordinator, Keys, NatsCluster,
};
use capstan_tests::wait_until;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const HOSTS: usize = 1000;
const PREFIX: &str = "big";
/// Starting and registering a thousand hosts on a busy 2-core machine, and every one
/// alive in the registry (measured on per-host accounts: 148–159 s when quiet, most of
/// it making each host's streams; 12–18 s on one shared account).
const FLEET_READY: Duration = Duration::from_secs(600);
/// Each step's `--timeout`: per host, for its submission and for its wait.
const STEP_TIMEOUT: &str = "300s";

/// `capstan --json rollout FILE --hosts alive`: its exit status and summary.
fn rollout(url: &str, token: &str, file: &str) -> (Option<i32>, Value) {
    let out = capstan_cli_within(
        url,
        token,
        &[
            "rollout",
            file,
            "--hosts",
            "alive",
            "--timeout",
            STEP_TIMEOUT,
        ],
        FLEET_READY,
    );
    let summary = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "capstan rollout {file}: exit {:?}, stderr {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), summary)
}

/// Asserts every host succeeded; names the first few that did not.
#[track_caller]
fn assert_all_succeeded(step: &str, (code, summary): &(Option<i32>, Value)) {
    let failed: Vec<&Value> = summary["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["status"] != "succeeded")
        .take(5)
        .collect();
    assert!(
        *code == Some(0) && summary["total"] == HOSTS && summary["succeeded"] == HOSTS,
        "{step}: exit {code:?}, {} of {} succeeded; e.g. {failed:?}",
        summary["succeeded"],
        summary["total"]
    );
}

#[test]
fn a_rollout_to_a_thousand_simulated_hosts_survives_a_server_killed_mid_rollout() {
    let names: Vec<String> = (1..=HOSTS).map(|i| format!("{PREFIX}-{i:04}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    // With replicas = 3 the fleet's account holds the command stream three times.
    let accounts = Accounts::generate_with(&refs, "64M", "8G");
    let mut cluster = NatsCluster::start_with(3, Some(&accounts.config()));
    let keys = Keys::generate();
    let coordinator_nats = format!("replicas = 3\n{}", accounts.nats_lines("coordinator"));
    let coordinator = Coordinator::start(&cluster.url(), &keys, &coordinator_nats);
    // The shared config names no credentials: each host connects with its own.
    let config = Agent::builder(PREFIX)
        .without_hooks()
        .nats(&cluster.url())
        .nats_extra("replicas = 3")
        .signing(&keys.public)
        .build();
    let credentials = accounts.credentials_dir();
    let credentials = credentials.to_str().expect("path");
    let fleet = config.spawn_sim_fleet_with(HOSTS, PREFIX, &["--nats-credentials", credentials]);
    let started = Instant::now();
    wait_until("the simulated fleet to start", FLEET_READY, || {
        assert!(
            fleet.exited().is_none(),
            "sim-fleet ended: {}",
            fleet.stderr()
        );
        fleet.stderr().contains("sim fleet ready")
    });
    let key_file = config.data_dir().join(capstan_agent::sim_fleet::KEYS_FILE);
    // On per-host accounts each registration also makes the host's two R3 streams, one
    // JetStream meta-layer write after another: 143–153 s for the thousand here.
    let registering = Instant::now();
    let out = capstan_cli_within(
        &coordinator.url,
        &coordinator.token,
        &["register", "--file", key_file.to_str().expect("path")],
        FLEET_READY,
    );
    eprintln!("{HOSTS} keys registered in {:?}", registering.elapsed());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("every simulated host alive", FLEET_READY, || {
        alive_count(&coordinator.cli_json(&["hosts"], 0)) == HOSTS
    });
    eprintln!(
        "{HOSTS} hosts alive {:?} after the start",
        started.elapsed()
    );

    let step = |name: &str, body: Value| {
        let file = coordinator.write(&format!("{name}.json"), &body.to_string());
        file.to_str().expect("path").to_string()
    };
    let ns = step(
        "ns",
        json!({"id": "ns", "op": "ensure_namespace", "namespace": "shop"}),
    );
    let prepare = step(
        "p1",
        json!({"id": "p1", "op": "prepare_revision", "namespace": "shop", "workload": "web",
            "revision": "r1", "spec": {"driver": "sim"}}),
    );
    let activate = step(
        "a1",
        json!({"id": "a1", "op": "activate_revision", "namespace": "shop", "workload": "web",
            "revision": "r1"}),
    );
    let (url, token) = (coordinator.url.clone(), coordinator.token.clone());

    // The namespace, with the whole cluster up.
    assert_all_succeeded("ensure_namespace", &rollout(&url, &token, &ns));

    // The preparation, with the meta leader killed once a tenth of the hosts have
    // their command.
    let running = {
        let (url, token) = (url.clone(), token.clone());
        std::thread::spawn(move || rollout(&url, &token, &prepare))
    };
    let tenth = format!("p1.{PREFIX}-{:04}", HOSTS / 10);
    wait_until("a tenth of the preparations submitted", FLEET_READY, || {
        coordinator.cli(&["status", &tenth]).status.success() || running.is_finished()
    });
    assert!(
        !running.is_finished(),
        "the rollout ended before a server could be killed mid-rollout"
    );
    let killed = cluster.leader();
    eprintln!(
        "killing {} (the meta leader) mid-rollout",
        cluster.name(killed)
    );
    let killed_at = Instant::now();
    cluster.kill(killed);
    let prepared = running.join().expect("the rollout thread");
    eprintln!(
        "the preparation rollout ended {:?} after the kill",
        killed_at.elapsed()
    );
    assert_all_succeeded("prepare_revision, a server killed", &prepared);

    // The activation, one server still down (two of three: a quorum).
    assert_all_succeeded(
        "activate_revision, a server down",
        &rollout(&url, &token, &activate),
    );
    cluster.restart(killed);

    // Each host started its revision exactly once, and it runs.
    for i in 1..=HOSTS {
        let host = format!("{PREFIX}-{i:04}");
        let sim = capstan_driver::sim::SimHost::load(&config.data_dir().join(&host))
            .unwrap_or_else(|e| panic!("{host}'s sim host: {e}"));
        let web = &sim.revisions["shop/web@r1"];
        assert_eq!(web.starts, 1, "{host}: {web:?}");
        assert_eq!(web.state, capstan_driver::BackendState::Running, "{host}");
    }
    // SIGTERM: every host stops, exit 0.
    fleet.stop();
    coordinator.stop();
    cluster.stop();
}
