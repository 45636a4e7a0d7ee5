//! The daemon (`capstan-agent run`): the order in which the agent comes up and the
//! order in which it stops. `main.rs` only wires configuration into [`Daemon`].
//!
//! Up: supervision first (an exit during startup must be seen) → [`startup`]
//! (finish what the log shows as begun, reconcile the host) → the reconciler's loop
//! (a look every `reconcile_interval_secs`: `executor/look.rs`) → the transport (new
//! commands come last) → `/metrics` on the listener `run` bound before anything was
//! opened ([`crate::metrics::serve`]) → the background verification of the whole log
//! (opening checked only the tail after the newest snapshot, and trusted that
//! snapshot).
//!
//! One host's agent is built by [`HostSetup`]: `run` builds one, `sim-fleet`
//! ([`crate::sim_fleet`]) one per simulated host.
//!
//! Down ([`Daemon::stop`]): cancel hooks in flight (their owners compensate under a
//! fresh budget, so the command being carried out ends promptly) → stop taking
//! commands → stop the reconciler (its look in flight finished) → stop supervision
//! (no restart may undo the sweep) → the shutdown sweep
//! (unless leave-running) → give the outbox a bounded time to publish → flush → stop
//! serving `/metrics` (up to [`METRICS_DRAIN`]).

use crate::config::{AgentConfig, ShutdownMode};
use crate::drivers::{self, OpenError};
use crate::executor::{Executor, Noticed, ReconcileReport, SweepReport};
use crate::hooks::{Hooks, Runners};
use crate::local_socket;
use crate::log::{Log, LogError, LogOptions, Pace};
use crate::metrics::{self, Metrics};
use crate::supervise::{Backoff, Supervisor};
use crate::transport::{HostInfo, Transport};
use capstan_common::files;
use capstan_common::nats::{NatsConfig, NatsError};
use capstan_common::signing::Policy;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument as _;

/// How long a stopping agent waits for the outbox to publish the last records.
pub const OUTBOX_DRAIN: Duration = Duration::from_secs(5);

/// How long a stopping agent lets scrapes in flight finish.
pub const METRICS_DRAIN: Duration = Duration::from_secs(1);

/// The background verification's I/O bound: this many records, then a pause.
pub const VERIFY_PACE: Pace = Pace {
    chunk: 1024,
    pause: Duration::from_millis(10),
};

type Verification = JoinHandle<Result<Option<u64>, LogError>>;

/// Finishes what the log shows as begun, then reconciles the host to intent; the
/// drift and changes it found (the reconciler's loop does not record them again). A
/// degraded log is left alone: the agent refuses to act on it.
pub async fn startup(executor: &Executor) -> Result<Noticed, LogError> {
    if let Some(c) = executor.log().degraded() {
        tracing::error!(corruption = %c, "the log is degraded: refusing to act; run `capstan-agent log verify`");
        return Ok(Noticed::default());
    }
    let recovered = executor.recover().await?;
    if recovered > 0 {
        tracing::info!(
            recovered,
            "finished commands left unfinished by the last run"
        );
    }
    let report = executor.reconcile().await?;
    tracing::info!(
        started = report.started,
        stopped = report.stopped,
        failed = report.failed,
        drift = report.drift,
        "startup reconciliation done"
    );
    Ok(report.noticed)
}

/// The reconciler's loop: a look at the host every `every` (`executor/look.rs`) until
/// `stop`; a look under way is finished first (it may hold a namespace's lock between
/// a driver call and its record). Nothing while the log is degraded.
fn reconcile_every(
    executor: Arc<Executor>,
    every: Duration,
    mut noticed: Noticed,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let task = async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if executor.log().degraded().is_some() {
                continue;
            }
            match executor.look(&mut noticed).await {
                Ok(r) if r == ReconcileReport::default() => {}
                Ok(r) => tracing::info!(
                    stopped = r.stopped,
                    failed = r.failed,
                    drift = r.drift,
                    "the reconciler found the host away from intent"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "the reconciler could not record what it found")
                }
            }
        }
    };
    tokio::spawn(task.in_current_span())
}

/// The NATS side of a daemon: where to connect, whose signatures to accept, and what
/// to say about this host.
pub struct NatsSettings {
    pub config: NatsConfig,
    pub policy: Policy,
    pub info: HostInfo,
    /// The host's key ([`crate::host_key`]): it signs what the agent publishes.
    pub key: Arc<capstan_common::signing::Signer>,
    /// How many commands may be in flight (`commands_in_flight`).
    pub in_flight: usize,
}

/// How a daemon runs and stops.
pub struct Settings {
    pub nats: Option<NatsSettings>,
    pub shutdown: ShutdownMode,
    /// How many workloads the shutdown sweep stops at once.
    pub shutdown_concurrency: usize,
    /// How often the reconciler looks at the host (`reconcile_interval_secs`);
    /// `None`: only at startup.
    pub reconcile_interval: Option<Duration>,
    pub backoff: Backoff,
    /// Where to serve `/metrics` once up.
    pub metrics: Option<TcpListener>,
    /// The local socket ([`crate::local_socket`]) and what `status` says there.
    pub local: Option<(PathBuf, HostInfo)>,
    /// Log retention (`[log.retention]`), when on.
    pub retention: Option<crate::log::retention::Policy>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("the log failed")]
    Log(#[from] LogError),
    #[error("cannot start the NATS transport")]
    Nats(#[from] NatsError),
    #[error("cannot create {}", path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the driver")]
    Driver(#[from] OpenError),
    #[error("cannot serve the local socket")]
    Local(#[from] local_socket::LocalError),
    #[error(transparent)]
    HostKey(#[from] crate::host_key::HostKeyError),
}

/// One host's agent as `run` builds it: the log under `<data_dir>/log`, the
/// configured hook owners (frozen here for the process's life) and driver, the
/// executor; then, to serve, the daemon with the config's NATS section and shutdown
/// settings. `sim-fleet` builds one per simulated host from the same config.
pub struct HostSetup<'a> {
    pub config: &'a AgentConfig,
    pub host: &'a str,
    pub data_dir: &'a Path,
    /// The host's key file ([`crate::host_key`]), read (or made) when NATS is on.
    pub host_key: &'a Path,
    pub log: LogOptions,
}

impl HostSetup<'_> {
    /// Opens the log and the driver.
    pub async fn open(&self) -> Result<Executor, DaemonError> {
        // A data dir made here is `0700` (the log, the host key, the local socket, the
        // drivers' state: the agent's alone); one already there is the operator's.
        let dir = self.data_dir.join("log");
        files::create_dir_all(self.data_dir, files::PRIVATE_DIR).map_err(|source| {
            DaemonError::DataDir {
                path: self.data_dir.to_path_buf(),
                source,
            }
        })?;
        let log = Arc::new(Log::open(&dir, self.log)?);
        let metrics = Arc::new(Metrics::new());
        let hooks = Hooks::new(
            self.config.hook_owners.clone(),
            Arc::new(Runners::default()),
        )
        .with_cleanup_budget(self.config.resolved().cleanup_budget)
        .with_metrics(Arc::clone(&metrics));
        let driver = drivers::open(self.config, self.host, self.data_dir).await?;
        let driver = metrics::driver::Measured::wrap(driver, Arc::clone(&metrics));
        Ok(Executor::new(self.host.to_string(), log, driver)
            .with_hooks(hooks)
            .with_metrics(metrics))
    }

    /// What the host says about itself in heartbeats and `status`.
    pub fn info(&self, executor: &Executor) -> HostInfo {
        HostInfo {
            host: self.host.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            drivers: vec![executor.driver().kind().to_string()],
            capabilities: serde_json::to_value(executor.driver().capabilities())
                .unwrap_or_default(),
            outbox_alarm: Default::default(),
        }
    }

    /// [`HostSetup::open`], then [`Daemon::start`]: NATS (when the config has it,
    /// accepting what `policy` accepts; `None` only without NATS), the config's
    /// shutdown settings, and `/metrics` on `metrics` when given (bound by the caller,
    /// before anything was opened: [`metrics::serve::bind`]).
    pub async fn start(
        &self,
        policy: Option<Policy>,
        metrics: Option<TcpListener>,
    ) -> Result<Daemon, DaemonError> {
        let executor = Arc::new(self.open().await?);
        // One HostInfo: the outbox's alarm shows in RPC and on the local socket alike.
        let info = self.info(&executor);
        let nats = match (&self.config.nats, policy) {
            (Some(config), Some(policy)) => Some(NatsSettings {
                config: config.clone(),
                policy,
                info: info.clone(),
                key: Arc::new(crate::host_key::load_or_create(self.host_key)?),
                in_flight: self.config.resolved().commands_in_flight,
            }),
            _ => None,
        };
        let settings = Settings {
            nats,
            shutdown: self.config.shutdown,
            shutdown_concurrency: self.config.resolved().shutdown_concurrency,
            reconcile_interval: self.config.resolved().reconcile_interval,
            backoff: Backoff::default(),
            metrics,
            local: Some((self.data_dir.join(local_socket::SOCKET), info)),
            // Each host's exports in their own directory (`sim-fleet` runs many).
            retention: self.config.resolved().retention.clone().map(|p| {
                crate::log::retention::Policy {
                    export_dir: p.export_dir.join(self.host),
                    ..p
                }
            }),
        };
        Daemon::start(executor, settings).await
    }
}

/// What a graceful stop did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopReport {
    /// The sweep's result; `None` with leave-running.
    pub sweep: Option<SweepReport>,
}

impl StopReport {
    /// The process exit status: 0, or the number of workloads the sweep could not
    /// stop (at most 100).
    pub fn exit_code(&self) -> u8 {
        let failed = self.sweep.as_ref().map_or(0, |s| s.failed);
        u8::try_from(failed.min(100)).unwrap_or(100)
    }
}

/// A running agent.
pub struct Daemon {
    executor: Arc<Executor>,
    supervisor: Option<JoinHandle<()>>,
    /// The reconciler's loop, and what stops it (also when dropped).
    reconciler: Option<(JoinHandle<()>, DropGuard)>,
    transport: Option<Transport>,
    shutdown: ShutdownMode,
    shutdown_concurrency: usize,
    verification: Option<Verification>,
    /// Stops the verification when the daemon stops or is dropped.
    stop_verification: Option<DropGuard>,
    /// The `/metrics` endpoint, and what stops it (also when dropped).
    metrics: Option<(JoinHandle<()>, DropGuard)>,
    /// The local socket, and what stops it (also when dropped).
    local: Option<(JoinHandle<()>, DropGuard)>,
    /// Log retention, and what stops it (also when dropped).
    retention: Option<(JoinHandle<()>, DropGuard)>,
}

/// Verifies the whole log (records and snapshots) in the background, at
/// [`VERIFY_PACE`]; a failure degrades the log (see [`Log::verify_in_background`]).
fn verify_in_background(log: &Arc<Log>) -> (Verification, DropGuard) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        Log::verify_in_background(Arc::clone(log), VERIFY_PACE, stop.clone()).in_current_span(),
    );
    let task = tokio::spawn(
        async move {
            let result = task.await.expect("the log verification panicked");
            match &result {
                Ok(Some(records)) => tracing::info!(records, "background log verification passed"),
                Ok(None) => tracing::debug!("background log verification stopped"),
                // A bad record or snapshot is logged (and degrades the log) where found.
                Err(LogError::Corrupt(_)) => {}
                Err(e) => tracing::warn!(error = %e, "background log verification could not run"),
            }
            result
        }
        .in_current_span(),
    );
    (task, stop.drop_guard())
}

impl Daemon {
    /// Brings the agent up: supervision (when the driver reports exits and the log
    /// can be written), startup, then the transport.
    pub async fn start(executor: Arc<Executor>, settings: Settings) -> Result<Daemon, DaemonError> {
        // Reads first: `capstan-agent log` and `intent` work during a long startup too.
        // (The outbox's progress shows there once the transport is up.)
        let published = Arc::new(std::sync::OnceLock::new());
        let local = match settings.local {
            Some((path, info)) => {
                let listener = local_socket::bind(&path)?;
                let stop = CancellationToken::new();
                let task = local_socket::serve(
                    listener,
                    path,
                    Arc::clone(&executor),
                    info,
                    Arc::clone(&published),
                    stop.clone(),
                );
                Some((task, stop.drop_guard()))
            }
            None => None,
        };
        let supervise =
            executor.log().degraded().is_none() && executor.driver().capabilities().reports_exits;
        let supervisor = supervise.then(|| {
            let supervisor = Supervisor::new(Arc::clone(&executor), settings.backoff);
            tokio::spawn(supervisor.run().in_current_span())
        });
        let noticed = startup(&executor).await?;
        let reconciler = match (settings.reconcile_interval, executor.log().degraded()) {
            (Some(every), None) => {
                let stop = CancellationToken::new();
                let task = reconcile_every(Arc::clone(&executor), every, noticed, stop.clone());
                Some((task, stop.drop_guard()))
            }
            _ => None,
        };
        let transport = match settings.nats {
            Some(n) => Some(
                Transport::start(
                    &n.config,
                    n.policy,
                    Arc::clone(&executor),
                    n.info,
                    n.in_flight,
                    n.key,
                )
                .await?,
            ),
            None => None,
        };
        if let Some(t) = &transport {
            let _ = published.set(t.published());
        }
        let metrics = settings.metrics.map(|listener| {
            let stop = CancellationToken::new();
            let published = transport.as_ref().map(Transport::published);
            let scrape = metrics::serve::Scrape {
                metrics: Arc::clone(executor.metrics()),
                log: Arc::clone(executor.log()),
                driver: executor.driver().kind(),
                published,
            };
            let task = metrics::serve::serve(listener, scrape, stop.clone());
            (task, stop.drop_guard())
        });
        let retention = match (settings.retention, executor.log().degraded()) {
            (Some(policy), None) => {
                let stop = CancellationToken::new();
                let published = transport.as_ref().map(Transport::published);
                let task = crate::log::retention::run(
                    Arc::clone(executor.log()),
                    policy,
                    published,
                    stop.clone(),
                );
                Some((tokio::spawn(task.in_current_span()), stop.drop_guard()))
            }
            _ => None,
        };
        let (verification, stop_verification) = match executor.log().degraded() {
            Some(_) => (None, None),
            None => {
                let (task, guard) = verify_in_background(executor.log());
                (Some(task), Some(guard))
            }
        };
        Ok(Daemon {
            executor,
            supervisor,
            reconciler,
            transport,
            shutdown: settings.shutdown,
            shutdown_concurrency: settings.shutdown_concurrency,
            verification,
            stop_verification,
            metrics,
            local,
            retention,
        })
    }

    /// Waits for the background verification of the log to end: the number of records
    /// it checked, `None` if it was stopped; or why it failed (the log is then
    /// degraded). `None` when it did not run (a log degraded on open) or was waited
    /// for already.
    pub async fn verification(&mut self) -> Option<Result<Option<u64>, LogError>> {
        let task = self.verification.take()?;
        Some(task.await.expect("the log verification task panicked"))
    }

    pub fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }

    /// Whether exits are being supervised.
    pub fn supervising(&self) -> bool {
        self.supervisor.is_some()
    }

    /// Stops the agent in the order the module documents. `mode` overrides the
    /// configured shutdown mode (the operator's `--leave-running`).
    pub async fn stop(mut self, mode: Option<ShutdownMode>) -> Result<StopReport, DaemonError> {
        self.executor.shutdown_token().cancel();
        // Stop the verification and wait for its chunk in flight (it holds the log).
        drop(self.stop_verification.take());
        let _ = self.verification().await;
        // And the retention, with its prune in flight.
        if let Some((task, stop)) = self.retention.take() {
            drop(stop);
            let _ = task.await;
        }
        if let Some(t) = &mut self.transport {
            t.stop_commands().await;
        }
        // The reconciler, with its look in flight: nothing acts on the host after this
        // but the sweep.
        if let Some((task, stop)) = self.reconciler.take() {
            drop(stop);
            if let Err(e) = task.await {
                tracing::error!(error = %e, "the reconciler failed");
            }
        }
        if let Some(s) = self.supervisor.take() {
            s.abort();
            // A supervisor that ended by itself (a panic) is worth knowing about.
            if let Err(e) = s.await {
                if !e.is_cancelled() {
                    tracing::error!(error = %e, "the supervisor failed");
                }
            }
        }
        let sweep = match mode.unwrap_or(self.shutdown) {
            ShutdownMode::LeaveRunning => {
                tracing::info!("leaving workloads running (leave-running)");
                None
            }
            ShutdownMode::Stop => {
                let report = self
                    .executor
                    .shutdown_sweep(self.shutdown_concurrency)
                    .await?;
                if report.failed > 0 {
                    tracing::error!(
                        failed = report.failed,
                        "some workloads could not be stopped"
                    );
                }
                Some(report)
            }
        };
        if let Some(t) = self.transport.take() {
            t.shutdown(OUTBOX_DRAIN).await;
        }
        self.executor.log().flush()?;
        if let Some((mut task, stop)) = self.metrics.take() {
            // Scrapes in flight may finish; a connection that never sends a whole
            // request must not hold the stop.
            drop(stop);
            if tokio::time::timeout(METRICS_DRAIN, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        // Last: the socket answered reads all through the stop.
        if let Some((task, stop)) = self.local.take() {
            drop(stop);
            let _ = task.await;
        }
        Ok(StopReport { sweep })
    }
}

#[cfg(test)]
mod tests;
