//! The documented secure layout past the old wall: `capstan-coordinator nats-config`
//! for 1,000 hosts, and a standalone nats-server starts with it. Before, each host's
//! storage account reserved 1 MiB of memory from the server's 256 MiB memory store,
//! and JetStream refused to start past 192 hosts ("insufficient memory resources").
//! (10,000 hosts start too, measured by hand: 144 s to ready on the 2-core
//! development machine, 27 MB of config — too long for every CI run; see
//! docs/nats.md, *Per-host accounts*.)

use capstan_tests::nats::{Accounts, NatsServer};

#[test]
fn a_standalone_server_starts_with_the_config_for_a_thousand_hosts() {
    let names: Vec<String> = (0..1_000).map(|i| format!("h{i:04}")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let accounts = Accounts::generate(&hosts, "64M");
    let mut server = NatsServer::start_with(Some(&accounts.config()));
    server.stop();
}
