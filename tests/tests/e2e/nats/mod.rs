//! Commands over NATS: a private nats-server, coordinators, agents and the `capstan` CLI.

mod accounts;
mod api;
mod attack;
mod auth;
mod cancel;
mod cluster;
mod cluster_fleet;
pub(crate) mod crash;
mod flow;
mod follow;
pub(crate) mod grant_loop;
mod legacy;
mod metrics;
mod openapi;
mod outage;
mod outbox;
mod reads;
mod retention;
mod scale;
mod sim_fleet;
mod soak;
mod verify;

use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::nats::{Accounts, Coordinator, Keys, NatsServer};
use std::path::Path;

/// A test's fleet: its own nats-server, signing keys, and a coordinator.
pub(crate) struct Fleet {
    server: NatsServer,
    keys: Keys,
    pub(crate) coordinator: Coordinator,
    /// On per-host accounts: their config and nkeys.
    accounts: Option<Accounts>,
}

impl Fleet {
    pub(crate) fn start() -> Fleet {
        Fleet::start_with(None, "", "")
    }

    /// With a nats-server config, and extra coordinator config: `top` lines and
    /// `nats` lines (auth).
    fn start_with(server_config: Option<&Path>, top: &str, nats: &str) -> Fleet {
        let server = NatsServer::start_with(server_config);
        let keys = Keys::generate();
        let coordinator = Coordinator::start_with(&server.url(), &keys, top, nats);
        Fleet {
            server,
            keys,
            coordinator,
            accounts: None,
        }
    }

    /// On per-host accounts for `hosts` (`capstan-coordinator nats-config`, the hosts
    /// in one storage shard of quota `shard_quota`): the coordinator and every agent
    /// [`Fleet::join`] makes authenticate with their nkeys.
    pub(crate) fn with_accounts(hosts: &[&str], shard_quota: &str) -> Fleet {
        Fleet::with(Accounts::generate(hosts, shard_quota))
    }

    /// On the per-host accounts `accounts` (made with [`Accounts::generate_sharded`],
    /// say).
    pub(crate) fn with(accounts: Accounts) -> Fleet {
        let nats = accounts.nats_lines("coordinator");
        let mut fleet = Fleet::start_with(Some(&accounts.config()), "", &nats);
        fleet.accounts = Some(accounts);
        fleet
    }

    /// An agent for `host` that takes commands from this fleet's server, signed with
    /// its keys.
    fn agent(&self, host: &str) -> AgentBuilder {
        self.join(Agent::builder(host))
    }

    /// `builder` (of any driver) taking commands from this fleet's server, signed
    /// with its keys, and its host's key registered with the coordinator.
    pub(crate) fn join(&self, builder: AgentBuilder) -> AgentBuilder {
        let mut builder = builder.nats(&self.server.url()).signing(&self.keys.public);
        if let Some(accounts) = &self.accounts {
            let lines = accounts.nats_lines(builder.host());
            builder = builder.nats_extra(&lines);
        }
        builder.registered_with(&self.coordinator.url, &self.coordinator.token)
    }

    /// Another coordinator on the same server and keys.
    fn coordinator(&self) -> Coordinator {
        Coordinator::start(&self.server.url(), &self.keys, "")
    }

    /// Stops the coordinator gracefully (asserting exit 0).
    pub(crate) fn stop(self) {
        self.coordinator.stop();
    }
}

/// Namespace `shop` (id `ns`), then `web@r1` prepared (id `prep`) and, with
/// `activate`, activated (id `act`).
fn shop(agent: &Agent, activate: bool) -> Vec<Cmd> {
    let c = agent.commands("shop");
    let mut lines = vec![
        c.ensure_namespace("ns"),
        c.prepare("prep", "web", "r1", Spec::sim()),
    ];
    if activate {
        lines.push(c.activate("act", "web", "r1"));
    }
    lines
}
