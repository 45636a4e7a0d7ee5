//! The agent's trusted local configuration (`/etc/capstan/agent.toml`), read once at
//! start. Unknown keys are errors that name the key.

use crate::hooks::{self, HookConfig, HookConfigError, HookOwner};
use capstan_common::DriverKind;
#[cfg(feature = "docker")]
use capstan_docker::DockerConfig;
use capstan_driver::sim::SimConfig;
#[cfg(feature = "external")]
use capstan_external::ExternalConfig;
#[cfg(feature = "kube")]
use capstan_kube::KubeConfig;
#[cfg(feature = "systemd")]
use capstan_systemd::SystemdConfig;
#[cfg(feature = "vm")]
use capstan_vm::VmConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default config file, read when it exists and `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/capstan/agent.toml";
/// The default data dir.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/capstan";

/// What a graceful stop does to workloads whose lifecycle the agent manages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ShutdownMode {
    /// Stop every running-intent workload (intent is unchanged).
    #[default]
    Stop,
    /// Exit without stopping anything; adopt the workloads on return (upgrades).
    LeaveRunning,
}

/// `driver` in `agent.toml`: a driver compiled into this build, by kind, or
/// `external`: a driver process behind `[external] socket`, whose kind (what specs
/// name) it announces when the agent connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverSetting {
    Builtin(DriverKind),
    External,
}

impl Default for DriverSetting {
    fn default() -> Self {
        DriverSetting::Builtin(DriverKind::SIM)
    }
}

impl std::fmt::Display for DriverSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverSetting::Builtin(kind) => kind.fmt(f),
            DriverSetting::External => f.write_str("external"),
        }
    }
}

impl std::str::FromStr for DriverSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "external" => Ok(DriverSetting::External),
            _ => match s.parse::<DriverKind>() {
                Ok(kind) if kind.is_built_in() => Ok(DriverSetting::Builtin(kind)),
                _ => {
                    let built_in: Vec<&str> =
                        DriverKind::BUILT_IN.iter().map(|k| k.as_str()).collect();
                    Err(format!(
                        "unknown driver {s:?} ({}, or external for a driver process of any kind)",
                        built_in.join(", ")
                    ))
                }
            },
        }
    }
}

impl<'de> Deserialize<'de> for DriverSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `agent.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This host's name (a DNS label); defaults to the machine's hostname.
    pub host: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// The driver this agent runs (`sim` by default): one compiled into this build
    /// (`capstan-agent --version` lists them), or `external`.
    #[serde(default)]
    pub driver: DriverSetting,
    #[serde(default)]
    pub shutdown: ShutdownMode,
    /// How many workloads the shutdown sweep stops at once (1 to
    /// [`MAX_SHUTDOWN_CONCURRENCY`], default [`DEFAULT_SHUTDOWN_CONCURRENCY`]).
    pub shutdown_concurrency: Option<usize>,
    /// Seconds between the reconciler's looks at the host while the agent runs
    /// (`executor/look.rs`; 0: off; at most [`MAX_RECONCILE_INTERVAL_SECS`], default
    /// [`DEFAULT_RECONCILE_INTERVAL_SECS`]).
    pub reconcile_interval_secs: Option<u64>,
    #[serde(default)]
    pub sim: SimConfig,
    /// The docker driver's section; owned by `capstan-docker`.
    #[cfg(feature = "docker")]
    #[serde(default)]
    pub docker: DockerConfig,
    /// The systemd driver's section; owned by `capstan-systemd`.
    #[cfg(feature = "systemd")]
    #[serde(default)]
    pub systemd: SystemdConfig,
    /// The kube driver's section; owned by `capstan-kube`.
    #[cfg(feature = "kube")]
    #[serde(default)]
    pub kube: KubeConfig,
    /// The VM driver's section; owned by `capstan-vm`.
    #[cfg(feature = "vm")]
    #[serde(default)]
    pub vm: VmConfig,
    /// The external driver's section; owned by `capstan-external`.
    #[cfg(feature = "external")]
    #[serde(default)]
    pub external: ExternalConfig,
    /// Lifecycle hook owners, in calling order (`[[hooks]]`). Read once at start and
    /// frozen: changing them needs an agent restart.
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// Seconds allowed for compensating hooks after a failed or cancelled
    /// preparation (default 5).
    pub hook_cleanup_budget: Option<f64>,
    /// `hooks`, validated by [`AgentConfig::load`].
    #[serde(skip)]
    pub hook_owners: Vec<HookOwner>,
    /// The NATS transport: when set, `run` takes commands from NATS and reports there.
    pub nats: Option<capstan_common::nats::NatsConfig>,
    /// The host's signing key (made on first use; default `<data_dir>/host.key`):
    /// it signs everything the agent publishes on NATS.
    pub host_key_file: Option<PathBuf>,
    /// How many commands from NATS may be delivered and not yet finished (1 to 1024,
    /// default 32). Commands for one namespace always run one at a time, in order;
    /// this bounds how many namespaces run at once. 1: one command at a time.
    pub commands_in_flight: Option<usize>,
    /// The coordinator keys commands must be signed with, and how old they may be.
    #[serde(default)]
    pub signing: crate::transport::auth::SigningConfig,
    /// The Prometheus endpoint of `run` (`docs/metrics.md`).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[log]`: the log's retention (`[log.retention]`).
    #[serde(default)]
    pub log: LogConfig,
    /// What the file leaves out, filled in by [`AgentConfig::from_toml`].
    #[serde(skip)]
    resolved: Resolved,
}

/// The default `reconcile_interval_secs`.
pub const DEFAULT_RECONCILE_INTERVAL_SECS: u64 = 60;
/// The most `reconcile_interval_secs` may be (a day).
pub const MAX_RECONCILE_INTERVAL_SECS: u64 = 86_400;

/// The default `shutdown_concurrency`.
pub const DEFAULT_SHUTDOWN_CONCURRENCY: usize = 16;
/// The most `shutdown_concurrency` may be.
pub const MAX_SHUTDOWN_CONCURRENCY: usize = 1024;

/// The settings `agent.toml` may leave out, each with its default filled in — the one
/// place those defaults are applied — and checked. Read through
/// [`AgentConfig::resolved`]; the `Default` is an empty file's.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// `shutdown_concurrency`.
    pub shutdown_concurrency: usize,
    /// `commands_in_flight`.
    pub commands_in_flight: usize,
    /// `reconcile_interval_secs`; `None`: the reconciler looks only at startup.
    pub reconcile_interval: Option<Duration>,
    /// `hook_cleanup_budget`.
    pub cleanup_budget: Duration,
    /// `[metrics]`: where `run` serves `GET /metrics`; `None`: off.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `[log.retention]`'s policy, checked against `[signing]`; `None`: off.
    pub retention: Option<crate::log::retention::Policy>,
}

impl Default for Resolved {
    fn default() -> Self {
        Resolved {
            shutdown_concurrency: DEFAULT_SHUTDOWN_CONCURRENCY,
            commands_in_flight: crate::transport::commands::DEFAULT_IN_FLIGHT,
            reconcile_interval: Some(Duration::from_secs(DEFAULT_RECONCILE_INTERVAL_SECS)),
            cleanup_budget: hooks::DEFAULT_CLEANUP_BUDGET,
            metrics_listen: Some(
                DEFAULT_METRICS_LISTEN
                    .parse()
                    .expect("the default listen address parses"),
            ),
            retention: None,
        }
    }
}

/// `[log]` in `agent.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// Pruning old records after exporting them; off by default.
    #[serde(default)]
    pub retention: crate::log::retention::RetentionConfig,
}

/// The default `[metrics] listen`: loopback only.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";

/// `[metrics]`: where `run` serves `GET /metrics`. On by default, on loopback.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `false` turns the endpoint off.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `address:port` (default [`DEFAULT_METRICS_LISTEN`]); port 0 takes a free port,
    /// logged at start. Checked by [`AgentConfig::load`].
    pub listen: Option<String>,
}

fn yes() -> bool {
    true
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: None,
        }
    }
}

impl MetricsConfig {
    /// The address to serve on; `None` when the endpoint is off.
    fn listen(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let text = self.listen.as_deref().unwrap_or(DEFAULT_METRICS_LISTEN);
        text.parse()
            .map(Some)
            .map_err(|source| ConfigError::MetricsListen {
                value: text.to_string(),
                source,
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`[nats] hosts_nkey_seed_file` is a coordinator's setting: an agent connects with its own `nkey_seed_file` only")]
    HostsSeed,
    #[error("invalid config {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid config: `host` {0:?} must be a DNS label (1-63 of [a-z0-9-])")]
    Host(String),
    #[error("invalid [[hooks]] in {path}")]
    Hooks {
        path: PathBuf,
        #[source]
        source: HookConfigError,
    },
    #[error("invalid config: `hook_cleanup_budget` must be more than 0 and at most 60 seconds")]
    CleanupBudget,
    #[cfg(feature = "external")]
    #[error("invalid config")]
    External(#[from] capstan_external::ExternalConfigError),
    #[error("invalid config: `shutdown_concurrency` must be 1 to {MAX_SHUTDOWN_CONCURRENCY}")]
    ShutdownConcurrency,
    #[error("invalid config: `commands_in_flight` must be 1 to {max}", max = crate::transport::commands::MAX_IN_FLIGHT)]
    InFlight,
    #[error("invalid config: `reconcile_interval_secs` must be 0 (off) to {MAX_RECONCILE_INTERVAL_SECS}")]
    ReconcileInterval,
    #[error(transparent)]
    Retention(#[from] crate::log::retention::RetentionError),
    #[error("invalid config: `[metrics] listen` {value:?} must be an IP address and port (e.g. \"127.0.0.1:9464\")")]
    MetricsListen {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
}

impl AgentConfig {
    /// Reads `path`; with no path, reads [`DEFAULT_PATH`] if it exists.
    pub fn load(path: Option<&Path>) -> Result<AgentConfig, ConfigError> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(AgentConfig::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        AgentConfig::from_toml(&text, path)
    }

    /// Parses and checks `text`, the config file `path` holds.
    pub fn from_toml(text: &str, path: PathBuf) -> Result<AgentConfig, ConfigError> {
        let mut config: AgentConfig =
            toml::from_str(text).map_err(|source| ConfigError::Parse {
                path: path.clone(),
                source,
            })?;
        config.hook_owners = hooks::config::owners(&config.hooks)
            .map_err(|source| ConfigError::Hooks { path, source })?;
        config.resolved = config.resolve()?;
        Ok(config)
    }
}

impl AgentConfig {
    /// Checks every setting (each driver section by the crate that owns it) and fills
    /// in the defaults of what the file leaves out.
    fn resolve(&self) -> Result<Resolved, ConfigError> {
        let defaults = Resolved::default();
        #[cfg(feature = "external")]
        self.external.validate()?;
        if self
            .nats
            .as_ref()
            .is_some_and(|n| n.hosts_nkey_seed_file.is_some())
        {
            return Err(ConfigError::HostsSeed);
        }
        if let Some(h) = &self.host {
            if !capstan_common::validate::is_dns_label(h) {
                return Err(ConfigError::Host(h.clone()));
            }
        }
        let cleanup_budget = match self.hook_cleanup_budget {
            Some(b) if !(b > 0.0 && b <= 60.0) => return Err(ConfigError::CleanupBudget),
            Some(b) => Duration::from_secs_f64(b),
            None => defaults.cleanup_budget,
        };
        let max = crate::transport::commands::MAX_IN_FLIGHT;
        let commands_in_flight = match self.commands_in_flight {
            Some(n) if n == 0 || n > max => return Err(ConfigError::InFlight),
            Some(n) => n,
            None => defaults.commands_in_flight,
        };
        let shutdown_concurrency = match self.shutdown_concurrency {
            Some(n) if n == 0 || n > MAX_SHUTDOWN_CONCURRENCY => {
                return Err(ConfigError::ShutdownConcurrency)
            }
            Some(n) => n,
            None => defaults.shutdown_concurrency,
        };
        let reconcile_interval = match self.reconcile_interval_secs {
            Some(n) if n > MAX_RECONCILE_INTERVAL_SECS => {
                return Err(ConfigError::ReconcileInterval)
            }
            Some(0) => None,
            Some(n) => Some(Duration::from_secs(n)),
            None => defaults.reconcile_interval,
        };
        Ok(Resolved {
            shutdown_concurrency,
            commands_in_flight,
            reconcile_interval,
            cleanup_budget,
            metrics_listen: self.metrics.listen()?,
            retention: self.log.retention.policy(self.signing.max_age_secs)?,
        })
    }

    /// Every setting with its default filled in (an empty file's defaults for a
    /// config not read from a file).
    pub fn resolved(&self) -> &Resolved {
        &self.resolved
    }
}

/// The machine's hostname, lower-cased, if it is a usable host name.
pub fn system_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = name.trim().split('.').next()?.to_ascii_lowercase();
    capstan_common::validate::is_dns_label(&name).then_some(name)
}

#[cfg(test)]
mod tests;
