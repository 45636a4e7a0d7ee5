//! `capstan-agent sim-fleet`: a simulated fleet in one process. Each of N hosts
//! (`<prefix>-0001`, …) is an agent exactly as `run` builds it
//! ([`HostSetup::start`]): its own log and sim host under `<data-dir>/<host>/`,
//! executor, NATS connection (its own inbox prefix), command consumer, outbox, RPC
//! and heartbeat. The config (its [nats] and [signing] sections, hooks, shutdown
//! settings) is shared; every host's diagnostics carry a `host` span.
//!
//! `[metrics]` does not apply: a simulated fleet serves no `/metrics` (each host still
//! counts, and its heartbeat carries its figures).
//!
//! Hosts start [`START_CONCURRENCY`] at a time (progress every [`PROGRESS_EVERY`]);
//! a stop signal during that ends the starting once the hosts in hand have started,
//! and so does a host that cannot start (then every host started is stopped and
//! the error names it). On the signal every host stops at once, each as `run`
//! stops.

use crate::config::{AgentConfig, DriverSetting};
use crate::daemon::{DaemonError, HostSetup};
use crate::log::LogOptions;
use capstan_common::signing::Policy;
use capstan_common::DriverKind;
use futures::{FutureExt as _, StreamExt as _};
use std::future::Future;
use std::path::PathBuf;
use tracing::Instrument as _;

/// Each host's log cache by default, in MiB (sled's own default is 1 GiB a log).
pub const DEFAULT_LOG_CACHE_MIB: u64 = 4;
/// Hosts between two progress lines while starting.
pub const PROGRESS_EVERY: usize = 100;
/// Hosts starting at once: each start waits on NATS (its connection, its consumer
/// made afresh, streams looked up), most of all on a cluster.
pub const START_CONCURRENCY: usize = 16;

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub hosts: usize,
    /// Host names are `<prefix>-0001`, …
    pub prefix: String,
    /// Each host's data dir is `<data_dir>/<host>`.
    pub data_dir: PathBuf,
    pub log: LogOptions,
    /// Per-host accounts: host `h` connects with the nkey seed `<dir>/<h>.nk`, as
    /// `host_accounts = true`.
    pub nats_credentials: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("sim-fleet runs the sim driver; the config names `{0}`")]
    NotSim(DriverSetting),
    #[error("--hosts must be at least 1")]
    NoHosts,
    #[error("--nats-credentials needs the config's [nats] section (the server's url)")]
    NoNats,
    #[error("--nats-credentials gives each host its own nkey: the config's [nats] names credentials too (`user`, `nkey_seed_file` or `creds_file`)")]
    Credentials,
    #[error("--nats-credentials: no nkey for host {host} at {}", path.display())]
    NoNkey { host: String, path: PathBuf },
    #[error("host name {0:?} (from --prefix) must be a DNS label (1-63 of [a-z0-9-])")]
    Name(String),
    #[error("cannot write {}", path.display())]
    Keys {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start host {host}")]
    Host {
        host: String,
        #[source]
        source: DaemonError,
    },
}

/// The file in the fleet's dir listing each host's public key (`HOST KEY` lines).
pub const KEYS_FILE: &str = "host-keys";

/// Host `i` (from 1) of the fleet: `<prefix>-0001`.
pub fn host_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:04}")
}

fn span(host: &str) -> tracing::Span {
    tracing::info_span!("host", host = %host)
}

/// Starts the fleet, serves until `stopped` resolves, stops every host; returns the
/// exit status: 0, or the number of workloads the hosts' sweeps could not stop (at
/// most 100), as `run`'s.
pub async fn run<S>(
    config: &AgentConfig,
    policy: Option<Policy>,
    options: &FleetOptions,
    stopped: impl Future<Output = S>,
) -> Result<u8, FleetError> {
    if config.driver != DriverSetting::Builtin(DriverKind::SIM) {
        return Err(FleetError::NotSim(config.driver));
    }
    if options.hosts == 0 {
        return Err(FleetError::NoHosts);
    }
    let names: Vec<String> = (1..=options.hosts)
        .map(|i| host_name(&options.prefix, i))
        .collect();
    if let Some(bad) = names
        .iter()
        .find(|n| !capstan_common::validate::is_dns_label(n))
    {
        return Err(FleetError::Name(bad.clone()));
    }
    if let Some(dir) = &options.nats_credentials {
        let Some(nats) = &config.nats else {
            return Err(FleetError::NoNats);
        };
        if nats.user.is_some() || nats.nkey_seed_file.is_some() || nats.creds_file.is_some() {
            return Err(FleetError::Credentials);
        }
        // Every host's nkey is there before any host starts.
        if let Some(host) = names
            .iter()
            .find(|h| !dir.join(format!("{h}.nk")).is_file())
        {
            return Err(FleetError::NoNkey {
                host: host.clone(),
                path: dir.join(format!("{host}.nk")),
            });
        }
    }
    if config.metrics.enabled {
        // One process, many hosts: per-host series would multiply by the fleet size.
        tracing::info!("sim-fleet serves no /metrics: `[metrics]` applies to `run` only");
    }
    tokio::pin!(stopped);
    let mut daemons = Vec::with_capacity(names.len());
    let mut signalled = false;
    let mut failed = None;
    let mut starting = futures::stream::FuturesUnordered::new();
    let mut next = names.iter();
    loop {
        // Keep START_CONCURRENCY hosts starting; after the first, not once a stop
        // signal or a failure has been seen.
        while starting.len() < START_CONCURRENCY && !signalled && failed.is_none() {
            let first = daemons.is_empty() && starting.is_empty();
            if !first && (&mut stopped).now_or_never().is_some() {
                signalled = true;
                tracing::info!(
                    started = daemons.len(),
                    "stopped while starting: not starting the rest"
                );
                break;
            }
            let Some(name) = next.next() else { break };
            starting.push(start_host(config, policy.clone(), options, name));
        }
        let Some((name, started)) = starting.next().await else {
            break;
        };
        match started {
            Ok(daemon) => daemons.push((name, daemon)),
            Err(source) => {
                tracing::error!(host = %name, "cannot start; stopping the hosts started");
                failed.get_or_insert(FleetError::Host {
                    host: name.clone(),
                    source,
                });
            }
        }
        if daemons.len() % PROGRESS_EVERY == 0 || daemons.len() == names.len() {
            tracing::info!(
                started = daemons.len(),
                of = names.len(),
                "sim fleet starting"
            );
        }
    }
    if let Some(e) = failed {
        stop_all(daemons).await;
        return Err(e);
    }
    if !signalled {
        // Every host's public key, for `capstan register --file`.
        let path = options.data_dir.join(KEYS_FILE);
        let mut lines = String::new();
        for (name, _) in &daemons {
            let key = options.data_dir.join(name).join(crate::host_key::FILE);
            if let Ok(key) = crate::host_key::load_or_create(&key) {
                lines.push_str(&format!("{name} {}\n", key.public_hex()));
            }
        }
        // Public keys, for the operator: 0644 whatever the umask.
        let written = capstan_common::files::create(&path, capstan_common::files::PUBLIC_FILE)
            .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()));
        if let Err(source) = written {
            stop_all(daemons).await;
            return Err(FleetError::Keys { path, source });
        }
        tracing::info!(hosts = daemons.len(), keys = %path.display(), "sim fleet ready");
        stopped.await;
    }
    Ok(stop_all(daemons).await)
}

/// Starts host `name` as `run` starts an agent, with its own data dir and key.
async fn start_host<'a>(
    config: &AgentConfig,
    policy: Option<Policy>,
    options: &FleetOptions,
    name: &'a String,
) -> (&'a String, Result<crate::daemon::Daemon, DaemonError>) {
    let data_dir = options.data_dir.join(name);
    // Each host its own key, beside its log (`host_key_file` is not used).
    let host_key = data_dir.join(crate::host_key::FILE);
    // On per-host accounts its own NATS credentials too.
    let own;
    let config = match &options.nats_credentials {
        Some(dir) => {
            let mut c = config.clone();
            if let Some(nats) = c.nats.as_mut() {
                nats.nkey_seed_file = Some(dir.join(format!("{name}.nk")));
                nats.host_accounts = true;
            }
            own = c;
            &own
        }
        None => config,
    };
    let setup = HostSetup {
        config,
        host: name,
        data_dir: &data_dir,
        host_key: &host_key,
        log: options.log,
    };
    let started = setup.start(policy, None).instrument(span(name)).await;
    (name, started)
}

/// Stops every host at once; the exit status as [`run`] says.
async fn stop_all(daemons: Vec<(&String, crate::daemon::Daemon)>) -> u8 {
    let hosts = daemons.len();
    let stops = daemons.into_iter().map(|(name, daemon)| {
        async move {
            match daemon.stop(None).await {
                Ok(report) => u32::from(report.exit_code()),
                Err(e) => {
                    tracing::error!(error = %e, "the host did not stop cleanly");
                    1
                }
            }
        }
        .instrument(span(name))
    });
    let failed: u32 = futures::future::join_all(stops).await.into_iter().sum();
    tracing::info!(hosts, "sim fleet stopped");
    u8::try_from(failed.min(100)).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_numbered_from_one_with_four_digits() {
        assert_eq!(host_name("sim", 1), "sim-0001");
        assert_eq!(host_name("rack-a", 500), "rack-a-0500");
        assert_eq!(host_name("s", 12345), "s-12345");
    }

    fn options(hosts: usize, prefix: &str) -> FleetOptions {
        FleetOptions {
            hosts,
            prefix: prefix.into(),
            data_dir: PathBuf::from("/nonexistent/capstan-sim-fleet"),
            log: LogOptions::default(),
            nats_credentials: None,
        }
    }

    #[tokio::test]
    async fn a_fleet_is_refused_before_anything_is_touched() {
        let sim = AgentConfig::default();
        let stopped = std::future::ready(());
        let err = run(&sim, None, &options(0, "sim"), stopped)
            .await
            .unwrap_err();
        assert!(matches!(err, FleetError::NoHosts), "{err}");
        let err = run(&sim, None, &options(2, "Bad_"), std::future::ready(()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, FleetError::Name(ref n) if n == "Bad_-0001"),
            "{err}"
        );
        // Per-host credentials: a [nats] section naming none, one nkey a host.
        let creds = tempfile::tempdir().unwrap();
        std::fs::write(creds.path().join("sim-0001.nk"), "SU…").unwrap();
        let with_creds = FleetOptions {
            nats_credentials: Some(creds.path().to_path_buf()),
            ..options(2, "sim")
        };
        let refused = |config: AgentConfig| {
            let with_creds = with_creds.clone();
            async move {
                run(&config, None, &with_creds, std::future::ready(()))
                    .await
                    .unwrap_err()
            }
        };
        let err = refused(sim.clone()).await;
        assert!(matches!(err, FleetError::NoNats), "{err}");
        let mut nats = AgentConfig::default();
        nats.nats = Some(capstan_common::nats::NatsConfig::default());
        let err = refused(nats.clone()).await;
        assert!(
            matches!(err, FleetError::NoNkey { ref host, .. } if host == "sim-0002"),
            "{err}"
        );
        let mut named = nats;
        if let Some(n) = named.nats.as_mut() {
            n.nkey_seed_file = Some(creds.path().join("sim-0001.nk"));
        }
        let err = refused(named).await;
        assert!(matches!(err, FleetError::Credentials), "{err}");
        let mut docker = AgentConfig::default();
        docker.driver = DriverSetting::Builtin(DriverKind::DOCKER);
        let err = run(&docker, None, &options(2, "sim"), std::future::ready(()))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                FleetError::NotSim(DriverSetting::Builtin(DriverKind::DOCKER))
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_signal_while_starting_stops_the_hosts_started_and_starts_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let options = FleetOptions {
            data_dir: dir.path().to_path_buf(),
            ..options(3, "t")
        };
        // The signal is there from the start: it is seen after the first host.
        let code = run(
            &AgentConfig::default(),
            None,
            &options,
            std::future::ready(()),
        )
        .await
        .unwrap();
        assert_eq!(code, 0);
        assert!(dir.path().join("t-0001").join("log").is_dir());
        assert!(!dir.path().join("t-0002").exists());
    }
}
