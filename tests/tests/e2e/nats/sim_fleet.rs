//! `capstan-agent sim-fleet`: a hundred simulated hosts in one process, each a whole
//! agent on NATS (consumer, outbox, RPC, heartbeat), driven through a coordinator.

use super::Fleet;
use capstan_driver::sim::SimHost;
use capstan_tests::command::Commands;
use serde_json::Value;

const HOSTS: usize = 100;

fn alive(hosts: &Value, name: &str) -> bool {
    hosts["hosts"].as_array().is_some_and(|all| {
        all.iter()
            .any(|h| h["host"] == name && h["status"] == "alive")
    })
}

#[test]
fn a_hundred_simulated_hosts_in_one_process_take_commands_and_stop_on_sigterm() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    // The config every host shares: the fleet's server and signing key.
    let config = fleet.agent("simf").build();
    let process = config.sim_fleet(HOSTS, "simf");
    let names: Vec<String> = (1..=HOSTS).map(|i| format!("simf-{i:04}")).collect();
    // Every host's key, as `sim-fleet` lists them, registered in one call.
    let keys = config.data_dir().join("host-keys");
    let listed = std::fs::read_to_string(&keys).expect("host-keys");
    assert_eq!(listed.lines().count(), HOSTS, "{listed}");
    let keys = keys.to_str().expect("path");
    let out = coordinator.cli(&["register", "--file", keys]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let hosts = coordinator.wait_for_hosts("all 100 simulated hosts alive", |v| {
        names.iter().all(|n| alive(v, n))
    });
    let beat = hosts["hosts"]
        .as_array()
        .and_then(|all| all.iter().find(|h| h["host"] == names[41]))
        .expect("simf-0042 in the registry");
    assert_eq!(beat["beat"]["drivers"][0], "sim", "{beat}");

    // One command to each host through the coordinator; all are in flight at once.
    let ids: Vec<String> = names
        .iter()
        .map(|n| {
            coordinator.submit(&Commands::new(n, "tenant").ensure_namespace(&format!("ns-{n}")))
        })
        .collect();
    for id in &ids {
        let done = coordinator.cli_json(&["wait", id, "--timeout", "60s"], 0);
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    // Each host logged under its own name (a `host` span) …
    let text = process.stderr();
    assert!(
        text.contains(r#""host":"simf-0100""#) && text.contains("taking commands"),
        "{text}"
    );

    // SIGTERM: every host stops, the process exits 0.
    let stopped = process.stop();
    assert!(stopped.contains("sim fleet stopped"), "{stopped}");
    // … and carried its command out on its own simulated host.
    for n in &names {
        let host = SimHost::load(&config.data_dir().join(n)).expect("sim host");
        assert!(host.namespaces.contains("tenant"), "{n}: {host:?}");
    }
    fleet.stop();
}

/// On per-host accounts (the documented secure layout): `sim-fleet --nats-credentials`
/// connects each simulated host with its own nkey, as its own account; each takes its
/// command and its records land in its own storage (`capstan verify` ok).
#[test]
fn simulated_hosts_on_per_host_accounts_each_connect_with_their_own_credentials() {
    const HOSTS: usize = 5;
    let names: Vec<String> = (1..=HOSTS).map(|i| format!("simp-{i:04}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let fleet = Fleet::with_accounts(&refs, "64M");
    let coordinator = &fleet.coordinator;
    let accounts = fleet.accounts.as_ref().expect("accounts");
    // The shared config names no credentials: each host gets its own.
    let config = capstan_tests::agent::Agent::builder("simp")
        .nats(&fleet.server.url())
        .signing(&fleet.keys.public)
        .build();
    let creds = accounts.credentials_dir();
    let creds = creds.to_str().expect("path");
    let process = config.spawn_sim_fleet_with(HOSTS, "simp", &["--nats-credentials", creds]);
    process.wait_for_text("sim fleet ready");
    let keys = config.data_dir().join("host-keys");
    // A file giving one key to two hosts is refused whole, before any registration.
    let listed = std::fs::read_to_string(&keys).expect("host-keys");
    let first_key = listed.split_whitespace().nth(1).expect("a key");
    let twice = config.data_dir().join("twice");
    std::fs::write(&twice, format!("{listed}simp-0099 {first_key}\n")).expect("write");
    let out = coordinator.cli(&["register", "--file", twice.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a key is one host's"), "{stderr}");
    assert_ne!(
        coordinator.cli(&["keys", "simp-0001"]).status.code(),
        Some(0)
    );
    // The fleet's keys, registered several at a time, printed in the file's order.
    let out = coordinator.cli(&["register", "--file", keys.to_str().expect("path")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let order: Vec<String> = printed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line")["host"].to_string())
        .map(|h| h.trim_matches('"').to_string())
        .collect();
    let listed_order: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(order, listed_order, "{printed}");
    coordinator.wait_for_hosts("every simulated host alive", |v| {
        names.iter().all(|n| alive(v, n))
    });
    let commands: Vec<_> = names
        .iter()
        .map(|n| Commands::new(n, "tenant").ensure_namespace(&format!("ns-{n}")))
        .collect();
    coordinator.run_all(&commands);
    for n in &names {
        let verified = coordinator.cli_json(&["verify", n], 0);
        assert_eq!(verified["result"], "ok", "{n}: {verified}");
    }
    let stopped = process.stop();
    assert!(stopped.contains("sim fleet stopped"), "{stopped}");
    fleet.stop();
}
