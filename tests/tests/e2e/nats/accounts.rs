//! The documented secure layout at fleet size: `capstan-coordinator nats-config` for
//! 10,000 hosts, and a standalone nats-server starts with it. Before storage shards,
//! each host's own storage account reserved 1 MiB of memory from the server's
//! 256 MiB memory store, and JetStream refused to start past 192 hosts ("insufficient
//! memory resources"); with those reservations gone, 10,000 hosts took 150 s to load
//! (the accounts' import checks were quadratic in the hosts: `natsconf`'s `REACH`
//! says why), now about 10 s on the 2-core machine.

use capstan_tests::nats::{Accounts, NatsServer};

#[test]
fn a_standalone_server_starts_with_the_config_for_ten_thousand_hosts() {
    let names: Vec<String> = (0..10_000).map(|i| format!("h{i:05}")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let accounts = Accounts::generate(&hosts, "64M");
    let shards = std::fs::read_to_string(accounts.shards_file()).expect("shards");
    assert!(
        shards.ends_with("h09999 99\n"),
        "100 hosts a shard: {}",
        &shards[shards.len() - 40..]
    );
    let mut server = NatsServer::start_with(Some(&accounts.config()));
    server.stop();
}

/// An operator adds a host to a running fleet on per-host accounts as `docs/nats.md`
/// says: `nats-config` again with the new host (same `--out`), then a restart of the
/// server (a reload is not enough: see `docs/nats.md`, *Known limits*). The new host's
/// agent takes a command and its records reach its own storage; the host already
/// there, its agent connected throughout, goes on; nothing queued is lost.
#[test]
fn a_host_added_with_the_config_regenerated_and_the_server_restarted_takes_commands() {
    let mut fleet = super::Fleet::with_accounts(&["h1"], "64M");
    let h1 = fleet.agent("h1").build();
    let d1 = h1.run();
    fleet
        .coordinator
        .run_all(&[h1.commands("one").ensure_namespace("before")]);
    fleet
        .accounts
        .as_ref()
        .expect("accounts")
        .regenerate(&["h1", "h2"]);
    // The restart loads it (the harness's server reads its config at each boot).
    fleet.server.stop();
    fleet.server.restart();
    let h2 = fleet.agent("h2").build();
    let d2 = h2.run();
    fleet.coordinator.run_all(&[
        h2.commands("two").ensure_namespace("added"),
        h1.commands("one").ensure_namespace("after"),
    ]);
    for host in ["h1", "h2"] {
        let verified = fleet.coordinator.cli_json(&["verify", host], 0);
        assert_eq!(verified["result"], "ok", "{host}: {verified}");
    }
    d2.stop();
    d1.stop();
    fleet.stop();
}
