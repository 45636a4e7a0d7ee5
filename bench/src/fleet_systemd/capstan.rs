//! capstan's side: the agent package on the fleet host with the systemd driver, a
//! nats-server on the fleet's hub and a coordinator on the machine, and the rounds'
//! commands through the coordinator's HTTP API.

use super::timeline::{self, Timeline};
use super::{value, verify, write};
use crate::stack::{Stack, SHARD_QUOTA};
use anyhow::Context as _;
use capstan_driver::RevisionRef;
use capstan_tests::command::{Cmd, Commands, Spec};
use capstan_tests::fleet::{Fleet, FleetHost};
use capstan_tests::nats::{Accounts, NatsServer};
use futures::future::try_join_all;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Where the host's nkey seed goes (as `capstan install --nats-credentials` puts it).
const NKEY_FILE: &str = "/etc/capstan/nats.nk";

/// The workloads' program: long-running, nothing to install.
const PROGRAM: [&str; 2] = ["/usr/bin/sleep", "infinity"];

pub struct Capstan<'h, 'f> {
    host: &'h FleetHost<'f>,
    stack: Stack,
    /// Each workload's commands (its namespace's), in workload order.
    workloads: Vec<(Commands, String)>,
    /// The main PIDs of the active revisions' units, in workload order.
    pids: Vec<u32>,
    /// When the last round began (wall clock, for [`timeline`]).
    started: Cell<Option<chrono::DateTime<chrono::Utc>>>,
}

impl<'h, 'f> Capstan<'h, 'f> {
    /// Installs and joins the agent, then puts `units` workloads on it (revision r0,
    /// `T` of round 0) and checks they run.
    pub fn set_up(
        fleet: &Fleet,
        host: &'h FleetHost<'f>,
        runtime: &tokio::runtime::Runtime,
        units: usize,
        namespaces: usize,
    ) -> anyhow::Result<Capstan<'h, 'f>> {
        let debs = tempfile::tempdir()?;
        let deb = capstan_tests::build_packages(debs.path()).remove(0);
        std::fs::copy(&deb, host.path("/root/capstan-agent.deb"))?;
        ssh_ok(host, "dpkg -i /root/capstan-agent.deb")?;
        // The documented secure layout: per-host accounts (the host's nkey where
        // `capstan install --nats-credentials` puts it) and the host's key registered.
        let accounts = Accounts::generate(&[host.name()], SHARD_QUOTA);
        let server = NatsServer::start_on_with(&fleet.hub_addr().to_string(), &accounts.config());
        let seed = accounts.seed(host.name());
        let stack = Stack::on(server, Some(accounts), &[]);
        write(host, NKEY_FILE, &format!("{seed}\n"))?;
        ssh_ok(host, &format!("chmod 0600 {NKEY_FILE}"))?;
        // Every twin unit restarts once a round: no start rate limit (the same text).
        let config = format!(
            "host = \"{}\"\ndriver = \"systemd\"\n\n[systemd]\nstart_limit_interval_secs = 0\n\n\
             [nats]\nurl = {:?}\nnkey_seed_file = {NKEY_FILE:?}\nhost_accounts = true\n\n\
             [signing]\npublic_keys = [{:?}]\n",
            host.name(),
            stack.server.url(),
            stack.keys.public
        );
        write(host, "/etc/capstan/agent.toml", &config)?;
        // The host's key (made by `host-key` as by the agent's first start).
        let key = host.ssh(&["capstan-agent --config=/etc/capstan/agent.toml host-key"]);
        anyhow::ensure!(
            key.status.success(),
            "capstan-agent host-key on {}: {}",
            host.name(),
            String::from_utf8_lossy(&key.stderr)
        );
        let key = String::from_utf8_lossy(&key.stdout).trim().to_string();
        let out = stack.coordinator.cli(&["register", host.name(), &key]);
        anyhow::ensure!(
            out.status.success(),
            "capstan register {}: {}",
            host.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        ssh_ok(host, "systemctl restart capstan-agent")?;
        stack
            .coordinator
            .wait_for_hosts("the fleet host's agent alive", |v| {
                v["hosts"][0]["host"] == host.name() && v["hosts"][0]["status"] == "alive"
            });
        let workloads = (0..units)
            .map(|i| {
                let ns = format!("b{:02}", i % namespaces);
                (Commands::new(host.name(), &ns), format!("w{i:02}"))
            })
            .collect();
        let mut capstan = Capstan {
            host,
            stack,
            workloads,
            pids: Vec::new(),
            started: Cell::new(None),
        };
        runtime.block_on(capstan.ensure_namespaces())?;
        capstan.round(runtime, 0)?;
        capstan.verify(0)?;
        Ok(capstan)
    }

    async fn ensure_namespaces(&self) -> anyhow::Result<()> {
        let mut namespaces: Vec<&Commands> = Vec::new();
        for (c, _) in &self.workloads {
            if !namespaces.iter().any(|n| n.ns == c.ns) {
                namespaces.push(c);
            }
        }
        let runs = namespaces
            .into_iter()
            .map(|c| self.run(vec![c.ensure_namespace(&format!("ns.{}", c.ns))]));
        try_join_all(runs).await?;
        Ok(())
    }

    /// POSTs `commands` one after another (their order is their namespace's), then
    /// waits until the coordinator reports each succeeded.
    async fn run(&self, commands: Vec<Cmd>) -> anyhow::Result<()> {
        let mut ids = Vec::new();
        for c in commands {
            let body: serde_json::Value =
                serde_json::from_str(&c.without("issued_at").to_string())?;
            ids.push(self.stack.submit(&body).await?);
        }
        for id in ids {
            self.stack
                .get(&format!("commands/{id}/wait?timeout=120s"))
                .await?;
        }
        Ok(())
    }

    /// Round `round`'s env change: per workload, revision r`round` with `T` of that
    /// round prepared and activated; all namespaces at once, each namespace's commands
    /// in order (its prepares, then its activations). Timed until every command is reported succeeded.
    pub fn round(
        &self,
        runtime: &tokio::runtime::Runtime,
        round: usize,
    ) -> anyhow::Result<Duration> {
        let revision = format!("r{round}");
        let spec = Spec::sim()
            .with("driver", "systemd")
            .command(&PROGRAM)
            .env("T", &value(round));
        // Per namespace: its workloads' prepares, then their activations (staged, then
        // switched over, as a rollout does).
        let mut lanes: Vec<(&str, Vec<Cmd>, Vec<Cmd>)> = Vec::new();
        for (c, w) in &self.workloads {
            let i = match lanes.iter().position(|(ns, ..)| *ns == c.ns) {
                Some(i) => i,
                None => {
                    lanes.push((&c.ns, Vec::new(), Vec::new()));
                    lanes.len() - 1
                }
            };
            let id = format!("{}.{w}.{revision}", c.ns);
            lanes[i]
                .1
                .push(c.prepare(&format!("p.{id}"), w, &revision, spec.clone()));
            lanes[i]
                .2
                .push(c.activate(&format!("a.{id}"), w, &revision));
        }
        let lanes = lanes.into_iter().map(|(_, mut prepares, activates)| {
            prepares.extend(activates);
            self.run(prepares)
        });
        let (started, at) = (Instant::now(), chrono::Utc::now());
        runtime.block_on(try_join_all(lanes))?;
        let took = started.elapsed();
        self.started.set(Some(at));
        Ok(took)
    }

    /// Where the last round's time went, from the agent's log.
    pub fn timeline(
        &self,
        runtime: &tokio::runtime::Runtime,
        round: usize,
    ) -> anyhow::Result<Timeline> {
        let started = self.started.get().context("no round yet")?;
        runtime.block_on(timeline::of(
            &self.stack,
            self.host.name(),
            started,
            &format!("r{round}"),
        ))
    }

    /// Retires revision r`round` of every workload (not timed).
    pub fn retire(&self, runtime: &tokio::runtime::Runtime, round: usize) -> anyhow::Result<()> {
        let revision = format!("r{round}");
        let runs = self.workloads.iter().map(|(c, w)| {
            self.run(vec![c.retire(
                &format!("x.{}.{w}.{revision}", c.ns),
                w,
                &revision,
            )])
        });
        runtime.block_on(try_join_all(runs))?;
        Ok(())
    }

    /// The units of revision r`round`, in workload order.
    fn units(&self, round: usize) -> Vec<String> {
        let revision = format!("r{round}");
        self.workloads
            .iter()
            .map(|(c, w)| {
                capstan_systemd::naming::unit_name(RevisionRef {
                    namespace: &c.ns,
                    workload: w,
                    revision: &revision,
                })
            })
            .collect()
    }

    /// Checks round `round` took effect: r`round`'s units run, each in a new process
    /// with the round's `T`; the previous revision's units are stopped.
    pub fn verify(&mut self, round: usize) -> anyhow::Result<()> {
        self.pids = verify(self.host, &self.units(round), &self.pids, &value(round))?;
        if round > 0 {
            for unit in self.units(round - 1) {
                let state = self.host.property(&unit, "ActiveState");
                anyhow::ensure!(state != "active", "{unit} still {state}");
            }
        }
        Ok(())
    }

    /// The unit file of the first workload's r0 (the twins' template).
    pub fn unit_text(&self) -> anyhow::Result<String> {
        let unit = &self.units(0)[0];
        Ok(std::fs::read_to_string(
            self.host.path(&format!("/etc/systemd/system/{unit}")),
        )?)
    }

    pub fn stop(self) {
        self.stack.stop();
    }
}

/// `ssh root@host COMMAND` (one remote shell line) that must succeed.
pub fn ssh_ok(host: &FleetHost<'_>, command: &str) -> anyhow::Result<()> {
    let out = host.ssh(&[command]);
    anyhow::ensure!(
        out.status.success(),
        "ssh {} {command:?} failed ({}): {}",
        host.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
