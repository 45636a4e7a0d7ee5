//! The daemon (`capstan-agent run`): the order in which the agent comes up and the
//! order in which it stops. `main.rs` only wires configuration into [`Daemon`].
//!
//! Up: supervision first (an exit during startup must be seen) → [`startup`]
//! (finish what the log shows as begun, reconcile the host) → the transport (new
//! commands come last) → the background verification of the whole log (opening
//! checked only the tail after the newest snapshot, and trusted that snapshot).
//!
//! Down ([`Daemon::stop`]): cancel hooks in flight (their owners compensate under a
//! fresh budget, so the command being carried out ends promptly) → stop taking
//! commands → stop supervision (no restart may undo the sweep) → the shutdown sweep
//! (unless leave-running) → give the outbox a bounded time to publish → flush.

use crate::config::ShutdownMode;
use crate::executor::{Executor, SweepReport};
use crate::log::{Log, LogError, Pace};
use crate::supervise::{Backoff, Supervisor};
use crate::transport::{HostInfo, Transport};
use capstan_common::nats::{NatsConfig, NatsError};
use capstan_common::signing::Policy;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long a stopping agent waits for the outbox to publish the last records.
pub const OUTBOX_DRAIN: Duration = Duration::from_secs(5);

/// The background verification's I/O bound: this many records, then a pause.
pub const VERIFY_PACE: Pace = Pace {
    chunk: 1024,
    pause: Duration::from_millis(10),
};

type Verification = JoinHandle<Result<Option<u64>, LogError>>;

/// Finishes what the log shows as begun, then reconciles the host to intent. A
/// degraded log is left alone: the agent refuses to act on it.
pub async fn startup(executor: &Executor) -> Result<(), LogError> {
    if let Some(c) = executor.log().degraded() {
        tracing::error!(corruption = %c, "the log is degraded: refusing to act; run `capstan-agent log verify`");
        return Ok(());
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
    Ok(())
}

/// The NATS side of a daemon: where to connect, whose signatures to accept, and what
/// to say about this host.
pub struct NatsSettings {
    pub config: NatsConfig,
    pub policy: Policy,
    pub info: HostInfo,
    /// How many commands may be in flight (`commands_in_flight`).
    pub in_flight: usize,
}

/// How a daemon runs and stops.
pub struct Settings {
    pub nats: Option<NatsSettings>,
    pub shutdown: ShutdownMode,
    /// How many workloads the shutdown sweep stops at once.
    pub shutdown_concurrency: usize,
    pub backoff: Backoff,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("the log failed")]
    Log(#[from] LogError),
    #[error("cannot start the NATS transport")]
    Nats(#[from] NatsError),
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
    transport: Option<Transport>,
    shutdown: ShutdownMode,
    shutdown_concurrency: usize,
    verification: Option<Verification>,
    /// Stops the verification when the daemon stops or is dropped.
    stop_verification: Option<DropGuard>,
}

/// Verifies the whole log (records and snapshots) in the background, at
/// [`VERIFY_PACE`]; a failure degrades the log (see [`Log::verify_in_background`]).
fn verify_in_background(log: &Arc<Log>) -> (Verification, DropGuard) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(Log::verify_in_background(
        Arc::clone(log),
        VERIFY_PACE,
        stop.clone(),
    ));
    let task = tokio::spawn(async move {
        let result = task.await.expect("the log verification panicked");
        match &result {
            Ok(Some(records)) => tracing::info!(records, "background log verification passed"),
            Ok(None) => tracing::debug!("background log verification stopped"),
            // A bad record or snapshot is logged (and degrades the log) where found.
            Err(LogError::Corrupt(_)) => {}
            Err(e) => tracing::warn!(error = %e, "background log verification could not run"),
        }
        result
    });
    (task, stop.drop_guard())
}

impl Daemon {
    /// Brings the agent up: supervision (when the driver reports exits and the log
    /// can be written), startup, then the transport.
    pub async fn start(executor: Arc<Executor>, settings: Settings) -> Result<Daemon, DaemonError> {
        let supervise =
            executor.log().degraded().is_none() && executor.driver().capabilities().reports_exits;
        let supervisor = supervise.then(|| {
            let supervisor = Supervisor::new(Arc::clone(&executor), settings.backoff);
            tokio::spawn(supervisor.run())
        });
        startup(&executor).await?;
        let transport = match settings.nats {
            Some(n) => Some(
                Transport::start(
                    &n.config,
                    n.policy,
                    Arc::clone(&executor),
                    n.info,
                    n.in_flight,
                )
                .await?,
            ),
            None => None,
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
            transport,
            shutdown: settings.shutdown,
            shutdown_concurrency: settings.shutdown_concurrency,
            verification,
            stop_verification,
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
        if let Some(t) = &mut self.transport {
            t.stop_commands().await;
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
        Ok(StopReport { sweep })
    }
}

#[cfg(test)]
mod tests;
