//! The one way a test gets a `capstan-agent`: [`Agent::builder`] writes its config
//! (driver: sim, docker or a test's systemd; hooks, NATS, signing) into its own temp
//! dir; the [`Agent`] runs the CLI (`apply`, `log`, `intent`, `log verify`) and `run`
//! daemons against it.
//!
//! The temp dir holds `agent.toml`, the data dir `data/`, hook scripts and the files
//! they write, `apply` inputs, and each daemon's stderr (`run-<n>.log`).
//!
//! [`AgentBuilder`] and the config it writes are in `builder.rs`; the CLI (`apply`,
//! `log`, …) in `cli.rs`; the `run` and `sim-fleet` daemons in `daemon.rs`, their
//! `/metrics` in `metrics.rs`.

use crate::command::Commands;
use serde_json::Value;
use std::cell::Cell;
use std::path::PathBuf;
use std::process::Command;

mod builder;
mod cli;
mod daemon;
mod metrics;

pub use builder::{AgentBuilder, Driver, Systemd};
pub use cli::{Applied, Feed};
pub use daemon::has_fault_seams;
pub use metrics::{metrics_address, scrape};

/// A `capstan-agent` with its own temp dir (config, data dir, …) and host name.
/// Dropping it removes the dir, and for the docker driver every container and network
/// labelled with its host.
pub struct Agent {
    dir: tempfile::TempDir,
    pub host: String,
    config: AgentBuilder,
    runs: Cell<u32>,
    inputs: Cell<u32>,
}

impl Agent {
    /// The host's public key: `capstan-agent host-key` (which makes the key first,
    /// in the data dir, when there is none).
    pub fn host_key(&self) -> String {
        let mut c = self.command();
        c.arg("host-key");
        let out = crate::process::output("capstan-agent host-key", crate::READY, c);
        assert!(
            out.status.success(),
            "host-key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Registers [`Agent::host_key`] with the coordinator at `url` (`capstan register`).
    pub fn register(&self, url: &str, token: &str) {
        let key = self.host_key();
        let mut c = Command::new(crate::binary("capstan"));
        c.args(["--coordinator", url, "register", &self.host, &key])
            .env("CAPSTAN_TOKEN", token)
            .env_remove("CAPSTAN_TOKEN_FILE");
        let out = crate::process::output(
            format_args!("capstan register {}", self.host),
            crate::READY,
            c,
        );
        assert!(
            out.status.success(),
            "capstan register {}: {}",
            self.host,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The engine of an agent on the docker driver (panics for another driver).
    pub fn engine(&self) -> crate::docker::Engine {
        match self.config.driver {
            Driver::Docker { engine, .. } => engine,
            _ => panic!("{} is not on the docker driver", self.host),
        }
    }

    /// `name` in the agent's temp dir (where hook scripts write their files).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config_file(&self) -> PathBuf {
        self.path("agent.toml")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.path("data")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.data_dir().join("log")
    }

    /// Commands for this host in namespace `ns`.
    pub fn commands(&self, ns: &str) -> Commands {
        Commands::new(&self.host, ns)
    }

    /// `capstan-agent --config … --data-dir … --host …` ready for a subcommand
    /// (diagnostics at info).
    pub fn command(&self) -> Command {
        let mut c = Command::new(crate::binary("capstan-agent"));
        c.arg("--config")
            .arg(self.config_file())
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--host")
            .arg(&self.host)
            .env("RUST_LOG", "info,sled=warn,async_nats=warn");
        c
    }

    /// The sim driver's host state (snapshot + journal, readable while the agent
    /// runs; an empty host before it wrote any), as JSON.
    pub fn sim_host(&self) -> Value {
        let host = capstan_driver::sim::SimHost::load(&self.data_dir()).expect("sim host");
        serde_json::to_value(host).expect("sim host JSON")
    }

    /// The calls hook owner `name` recorded: `"<phase> <compensating>"` lines.
    pub fn calls(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(&crate::hooks::calls_file(name)))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn next_run(&self) -> u32 {
        self.runs.set(self.runs.get() + 1);
        self.runs.get()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Driver::Docker { engine, .. } = self.config.driver {
            crate::docker::remove_host(engine, &self.host);
        }
    }
}
