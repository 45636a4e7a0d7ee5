//! The documented secure layout at fleet size: `capstan-coordinator nats-config` for
//! 10,000 hosts, and a standalone nats-server starts with it. Before, each host's
//! storage account reserved 1 MiB of memory from the server's 256 MiB memory store,
//! and JetStream refused to start past 192 hosts ("insufficient memory resources").

use capstan_tests::nats::{Accounts, NatsServer};

#[test]
fn a_standalone_server_starts_with_the_config_for_ten_thousand_hosts() {
    let names: Vec<String> = (0..10_000).map(|i| format!("h{i:05}")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let accounts = Accounts::generate(&hosts, "64M");
    let mut server = NatsServer::start_with(Some(&accounts.config()));
    server.stop();
}
