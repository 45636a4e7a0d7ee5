//! The executor across agent restarts: [`Executor::recover`] finishes what the log
//! shows as begun, [`Executor::reconcile`] brings the host to intent at startup (and
//! [`Executor::look`], in `look.rs`, looks again while the agent runs), and
//! [`Executor::shutdown_sweep`] stops what a graceful stop must stop. None of them
//! changes running intent.

use super::look::Noticed;
use super::Executor;
use crate::event::{Cause, Event, Record};
use crate::log::LogError;
use crate::plan::{self, Action};
use capstan_common::{Command, ErrorCode, Outcome, Rejection};
use capstan_driver::RevisionRef;

/// What startup reconciliation did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    pub started: usize,
    pub stopped: usize,
    pub failed: usize,
    pub drift: usize,
    /// The drift and changes startup found: the reconciler's first look does not
    /// record them again.
    #[serde(skip)]
    pub noticed: Noticed,
}

impl Executor {
    /// Finishes every command the log shows as received but not completed, oldest
    /// first. Run at startup, before new commands are taken.
    pub async fn recover(&self) -> Result<usize, LogError> {
        let in_flight: Vec<(u64, String)> = {
            let intent = self.log.intent();
            let mut v: Vec<_> = intent
                .in_flight
                .iter()
                .map(|(id, seq)| (*seq, id.clone()))
                .collect();
            v.sort();
            v
        };
        for (seq, id) in &in_flight {
            let command = match self.log.get(*seq)? {
                Some(Record {
                    event: Event::CommandReceived { command, .. },
                    ..
                }) => Command::parse(&command),
                _ => Err(Rejection::new(
                    ErrorCode::InvalidCommand,
                    format!("record {seq} is not a received command"),
                )),
            };
            match command {
                Ok(c) => {
                    let r = self.execute(c).await;
                    tracing::info!(command_id = %id, outcome = ?r.outcome, "recovered an unfinished command");
                }
                Err(rejection) => {
                    self.complete(id, Vec::new(), Outcome::Failed, Some(rejection))
                        .await?;
                }
            }
        }
        Ok(in_flight.len())
    }

    /// Startup reconciliation: starts every running-intent workload that is not
    /// running, leaves explicitly stopped ones stopped, and marks the ones whose
    /// backend is missing, has given up (`backend_failed`) or fails to start as failed,
    /// carrying on past each failure. Intent never changes here.
    ///
    /// A driver that does not manage lifecycle (its backend keeps workloads running:
    /// systemd, a cluster) gets the same look but no starts or stops: what is missing,
    /// given up on or drifted is still recorded, so the log says what the agent found.
    pub async fn reconcile(&self) -> Result<ReconcileReport, LogError> {
        let mut report = ReconcileReport::default();
        let manages = self.driver.capabilities().manages_lifecycle;
        let observed = match self.driver.observe().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e.report(), "cannot observe the host; skipping reconciliation");
                return Ok(report);
            }
        };
        let actions = plan::plan(&self.log.intent(), &observed);
        report.noticed = Noticed::among(&actions);
        let actions = (actions.into_iter())
            .filter(|a| manages || !matches!(a, Action::Start { .. } | Action::Stop { .. }));
        for action in actions {
            self.act(action, Cause::AgentStartup, &mut report).await?;
        }
        self.log.durable(self.log.last_seq()).await?;
        Ok(report)
    }

    /// Carries one reconciliation action out, recorded as caused by `cause`, and counts
    /// it in `report`.
    pub(super) async fn act(
        &self,
        action: Action,
        cause: Cause,
        report: &mut ReconcileReport,
    ) -> Result<(), LogError> {
        match action {
            Action::Start {
                namespace,
                workload,
                revision,
            } => {
                let rev = RevisionRef {
                    namespace: &namespace,
                    workload: &workload,
                    revision: &revision,
                };
                let event = match self.driver.resume(rev).await {
                    Ok(()) => {
                        report.started += 1;
                        Event::WorkloadStarted {
                            cause,
                            namespace,
                            workload,
                            revision,
                            previous: None,
                        }
                    }
                    Err(e) => {
                        report.failed += 1;
                        failure(cause, namespace, workload, e.code(), e.report())
                    }
                };
                self.log.append(&[event])?;
            }
            Action::Stop {
                namespace,
                workload,
                revision,
            } => {
                let rev = RevisionRef {
                    namespace: &namespace,
                    workload: &workload,
                    revision: &revision,
                };
                if let Err(e) = self.driver.stop(rev).await {
                    report.failed += 1;
                    tracing::warn!(error = %e.report(), "could not stop a revision that should not run");
                    return Ok(());
                }
                report.stopped += 1;
                self.log.append(&[Event::WorkloadStopped {
                    cause,
                    namespace,
                    workload,
                    revision: Some(revision),
                }])?;
            }
            Action::Missing {
                namespace,
                workload,
                revision,
            } => {
                let message = format!("revision {revision} has no backend on this host");
                let event = failure(
                    cause,
                    namespace,
                    workload,
                    ErrorCode::BackendMissing,
                    message,
                );
                self.record_failure(event, report)?;
            }
            Action::Failed {
                namespace,
                workload,
                revision,
                reason,
            } => {
                let message = format!("the backend gave up on revision {revision}: {reason}");
                let event = failure(
                    cause,
                    namespace,
                    workload,
                    ErrorCode::BackendFailed,
                    message,
                );
                self.record_failure(event, report)?;
            }
            Action::Changed {
                namespace,
                workload,
                revision,
                what,
            } => {
                report.drift += 1;
                tracing::warn!(%namespace, %workload, %revision, %what, "found a backend of ours changed outside capstan; left as it is");
                self.log.append(&[Event::DriftDetected {
                    namespace,
                    workload,
                    revision,
                    reaped: false,
                }])?;
            }
            Action::Drift {
                namespace,
                workload,
                revision,
            } => {
                report.drift += 1;
                let reap = self.driver.capabilities().reaps_orphans;
                tracing::warn!(%namespace, %workload, %revision, reap, "found a backend labelled ours that intent does not know");
                let mut reaped = false;
                if reap {
                    let rev = RevisionRef {
                        namespace: &namespace,
                        workload: &workload,
                        revision: &revision,
                    };
                    match self.driver.retire(rev).await {
                        Ok(()) => reaped = true,
                        Err(e) => {
                            tracing::warn!(error = %e.report(), "could not remove drift")
                        }
                    }
                }
                self.log.append(&[Event::DriftDetected {
                    namespace,
                    workload,
                    revision,
                    reaped,
                }])?;
            }
        }
        Ok(())
    }
}

impl Executor {
    /// Records `event`, a workload reconciliation found failed, and counts it.
    fn record_failure(&self, event: Event, report: &mut ReconcileReport) -> Result<(), LogError> {
        report.failed += 1;
        self.log.append(&[event]).map(drop)
    }
}

/// A workload reconciliation could not bring to intent.
fn failure(
    cause: Cause,
    namespace: String,
    workload: String,
    code: ErrorCode,
    message: String,
) -> Event {
    Event::WorkloadFailed {
        cause,
        namespace,
        workload,
        code,
        message,
    }
}

/// What the graceful-shutdown sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    pub stopped: usize,
    pub failed: usize,
}

impl Executor {
    /// The graceful-stop sweep for drivers that manage lifecycle: stops the running
    /// revision of every running-intent workload, `concurrency` at a time, carrying on
    /// past failures. Intent does not change: each stop is logged as caused by the
    /// agent's shutdown, which the fold ignores.
    pub async fn shutdown_sweep(&self, concurrency: usize) -> Result<SweepReport, LogError> {
        use futures::stream::StreamExt;
        let mut report = SweepReport::default();
        if !self.driver.capabilities().manages_lifecycle {
            return Ok(report);
        }
        let observed = match self.driver.observe().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e.report(), "cannot observe the host; nothing stopped");
                report.failed = 1;
                return Ok(report);
            }
        };
        let actions = plan::shutdown_sweep(&self.log.intent(), &observed);
        let total = actions.len();
        tracing::info!(
            total,
            concurrency,
            "stopping running workloads for agent shutdown"
        );
        let results: Vec<_> = futures::stream::iter(actions)
            .map(|action| async move {
                let Action::Stop {
                    namespace,
                    workload,
                    revision,
                } = action
                else {
                    return Ok(None);
                };
                let rev = RevisionRef {
                    namespace: &namespace,
                    workload: &workload,
                    revision: &revision,
                };
                match self.driver.stop(rev).await {
                    Ok(()) => Ok(Some(Event::WorkloadStopped {
                        cause: Cause::AgentShutdown,
                        namespace,
                        workload,
                        revision: Some(revision),
                    })),
                    Err(e) => Err(e),
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for r in results {
            match r {
                Ok(Some(event)) => {
                    report.stopped += 1;
                    self.log.append(&[event])?;
                }
                Ok(None) => {}
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(error = %e.report(), "could not stop a workload during shutdown");
                }
            }
        }
        if total > 0 {
            self.log.durable(self.log.last_seq()).await?;
        }
        tracing::info!(
            stopped = report.stopped,
            failed = report.failed,
            "shutdown sweep finished"
        );
        Ok(report)
    }
}
