//! Supervision, as the driver's capabilities say. A driver that `reports_exits` sends
//! them through [`Driver::watch_exits`]; each one is recorded (`workload_exited`). Only
//! when it also declares `restarts_exits` is a workload whose intent is running on that
//! very revision started again, after a capped exponential backoff; otherwise the
//! backend restarts its own (systemd's `Restart=`, a Deployment) and the agent only
//! records what happened (and `workload_failed/backend_failed` when the backend gave
//! up on a revision intent wants running). Every restart attempt is logged, and its outcome recorded
//! (`workload_started`/`workload_failed` with cause `supervisor`; a revision the
//! backend has given up on is `workload_failed/backend_failed`, not restarted). The
//! decision is re-checked under the namespace's lock right before acting, so a
//! `stop_workload` that caused the exit always wins. A driver may also report failures
//! without an exit through [`Driver::watch_failures`] (a Deployment's rollout given
//! up on, a pod whose image cannot be pulled): each is recorded once as
//! `workload_failed` with the driver's code, for the revision intent wants running.
//!
//! [`Driver::watch_exits`]: capstan_driver::Driver::watch_exits
//! [`Driver::watch_failures`]: capstan_driver::Driver::watch_failures

mod policy;

use crate::event::{Cause, Event};
use crate::executor::Executor;
use crate::intent::RunIntent;
use crate::log::LogError;
use capstan_common::ErrorCode;
use capstan_driver::{BackendState, Driver, Exit, Failure, RevisionRef};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
// Tokio's clock, as the backoff's sleep: tests pause and advance it.
use tokio::time::Instant;

/// Restart delays: `base · 2^attempt`, at most `cap`; a workload that stayed up for
/// `reset_after` since its last restart starts again from `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(60),
            reset_after: Duration::from_secs(120),
        }
    }
}

impl Backoff {
    /// The delay before restart number `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.base
            .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

use policy::{after_exit, AfterExit, History};

/// Watches one executor's driver and restarts what exits against intent.
pub struct Supervisor {
    executor: Arc<Executor>,
    backoff: Backoff,
    history: Mutex<HashMap<String, History>>,
    /// How many exits have been handled to the end (recorded, and restarted if due).
    handled: tokio::sync::watch::Sender<u64>,
}

impl Supervisor {
    pub fn new(executor: Arc<Executor>, backoff: Backoff) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            executor,
            backoff,
            history: Mutex::new(HashMap::new()),
            handled: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The number of exits handled to the end so far: recorded and, when due,
    /// restarted (or the restart's failure recorded).
    pub fn handled(&self) -> tokio::sync::watch::Receiver<u64> {
        self.handled.subscribe()
    }

    /// Runs until the task is aborted: follows the driver's exits and its failures
    /// (see [`Supervisor::follow`]). Returns at once when the driver does not declare
    /// `reports_exits`.
    pub async fn run(self: Arc<Self>) {
        if !self.executor.driver().capabilities().reports_exits {
            tracing::info!("the driver reports no exits: nothing to supervise");
            return;
        }
        tokio::join!(Arc::clone(&self).follow::<Exit>(), self.follow::<Failure>());
    }

    /// Subscribes to one of the driver's feeds (again, with backoff, whenever it
    /// breaks) and handles each report in its own task. The handlers live in a
    /// `JoinSet` owned here, so aborting `run` aborts them too: no restart can race
    /// the shutdown sweep. Returns when the feed ends.
    async fn follow<R: Report>(self: Arc<Self>) {
        let mut handlers = tokio::task::JoinSet::new();
        let mut failures = 0u32;
        loop {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<R>(256);
            let executor = Arc::clone(&self.executor);
            let feed = R::subscribe(executor.driver().as_ref(), tx);
            tokio::pin!(feed);
            // Cancel-safe: `recv` loses nothing when the other branch wins, and the
            // feed future is pinned across iterations.
            let ended = loop {
                tokio::select! {
                    ended = &mut feed => break ended,
                    Some(report) = rx.recv() => {
                        failures = 0;
                        while handlers.try_join_next().is_some() {}
                        let me = Arc::clone(&self);
                        handlers.spawn(async move { report.handle(&me).await });
                    }
                }
            };
            while let Ok(report) = rx.try_recv() {
                let me = Arc::clone(&self);
                handlers.spawn(async move { report.handle(&me).await });
            }
            match ended {
                Ok(()) => {
                    tracing::info!(
                        feed = R::FEED,
                        "the driver's feed ended: nothing more to follow"
                    );
                    while handlers.join_next().await.is_some() {}
                    return;
                }
                Err(e) => {
                    tracing::warn!(feed = R::FEED, error = %e.report(), "feed broke; resubscribing")
                }
            }
            tokio::time::sleep(self.backoff.delay(failures)).await;
            failures = failures.saturating_add(1);
        }
    }

    /// Records a failure the backend reported without an exit (a rollout it gave up
    /// on, a pod whose image cannot be pulled): `workload_failed` with its code, when
    /// intent wants exactly that revision running and the same failure is not recorded
    /// already (a start clears it). Nothing is restarted: the backend retries.
    pub async fn handle_failure(&self, failure: Failure) {
        if let Err(e) = self.try_handle_failure(failure).await {
            tracing::error!(error = %e, "supervisor could not write the log");
        }
        self.handled.send_modify(|n| *n += 1);
    }

    async fn try_handle_failure(&self, failure: Failure) -> Result<(), LogError> {
        let rev = failure.rev();
        tracing::info!(workload = %rev, code = %failure.code, reason = %failure.reason, "the backend reports a failure");
        let _serial = self.executor.lock_namespace(&failure.namespace).await;
        // Under the lock: a command in flight has ended, and intent is what it left.
        if !self.wanted(rev) || self.reported(rev, failure.code) {
            return Ok(());
        }
        let event = Event::WorkloadFailed {
            cause: Cause::Supervisor,
            namespace: failure.namespace.clone(),
            workload: failure.workload.clone(),
            code: failure.code,
            message: format!("revision {} failed: {}", failure.revision, failure.reason),
        };
        self.executor.log().append_durable(&[event]).await?;
        tracing::warn!(workload = %rev, code = %failure.code, reason = %failure.reason, "failure recorded");
        Ok(())
    }

    /// Records one exit and, if the driver leaves restarts to the agent and intent
    /// says so, restarts the revision.
    pub async fn handle(&self, exit: Exit) {
        if let Err(e) = self.try_handle(exit).await {
            tracing::error!(error = %e, "supervisor could not write the log");
        }
        self.handled.send_modify(|n| *n += 1);
    }

    async fn try_handle(&self, exit: Exit) -> Result<(), LogError> {
        let log = self.executor.log();
        log.append_durable(&[Event::WorkloadExited {
            namespace: exit.namespace.clone(),
            workload: exit.workload.clone(),
            revision: exit.revision.clone(),
            exit_code: exit.exit_code,
        }])
        .await?;
        // Said once it is in the log: whoever waits on the line can read the record.
        tracing::info!(
            namespace = %exit.namespace,
            workload = %exit.workload,
            revision = %exit.revision,
            exit_code = ?exit.exit_code,
            "workload exited"
        );
        if !self.wanted(exit.rev()) {
            return Ok(());
        }
        if !self.executor.driver().capabilities().restarts_exits {
            // The backend restarts its own; the agent only reports when it gave up.
            let _serial = self.executor.lock_namespace(&exit.namespace).await;
            if !self.wanted(exit.rev()) || self.reported(exit.rev(), ErrorCode::BackendFailed) {
                return Ok(());
            }
            if let AfterExit::GaveUp { reason } = after_exit(self.state_now(exit.rev()).await) {
                log.append_durable(&[gave_up(&exit, &reason)]).await?;
                tracing::warn!(workload = %exit.rev(), %reason, "the backend gave up on it");
            }
            return Ok(());
        }
        let key = capstan_common::workload_key(&exit.namespace, &exit.workload);
        let attempt = {
            let now = Instant::now();
            let mut history = self.history.lock().expect("supervisor history");
            let h = history
                .entry(key.clone())
                .or_insert_with(|| History::new(now));
            h.next_attempt(now, self.backoff.reset_after)
        };
        let delay = self.backoff.delay(attempt);
        tracing::info!(workload = %key, revision = %exit.revision, attempt = attempt + 1, delay_ms = delay.as_millis() as u64, "restart scheduled");
        tokio::time::sleep(delay).await;
        let _serial = self.executor.lock_namespace(&exit.namespace).await;
        // Re-check under the lock: a command may have stopped, replaced or retired it.
        if !self.wanted(exit.rev()) {
            tracing::info!(workload = %key, "restart dropped: intent changed");
            return Ok(());
        }
        let rev = exit.rev();
        match after_exit(self.state_now(rev).await) {
            AfterExit::NotNeeded => {
                tracing::info!(workload = %key, "restart not needed: it runs again");
            }
            AfterExit::GaveUp { reason } => {
                log.append_durable(&[gave_up(&exit, &reason)]).await?;
                tracing::warn!(workload = %rev, %reason, "the backend gave up on it");
            }
            AfterExit::Restart => {
                let event = self.restart(rev, &key, attempt).await;
                log.append_durable(&[event]).await?;
            }
        }
        Ok(())
    }

    /// Whether the workload's failure with `code` is reported already: its last
    /// failure has that code and it has not started since (a start clears it). Several
    /// exits of one crash loop can be handled after the backend gave up (systemd's
    /// restarts come faster than a loaded agent reads their states), and a watched
    /// failure is seen again on every change of the object: one report, not one each.
    fn reported(&self, rev: RevisionRef<'_>, code: ErrorCode) -> bool {
        self.executor.log().with_intent(|intent| {
            intent
                .workload(rev.namespace, rev.workload)
                .is_some_and(|w| w.failed == Some(code))
        })
    }

    /// The backend's state of `rev` now (`None`: no object, or unreadable — said).
    async fn state_now(&self, rev: RevisionRef<'_>) -> Option<BackendState> {
        match self.executor.driver().state(rev).await {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(workload = %rev, error = %e.report(), "cannot read the revision's state");
                None
            }
        }
    }

    /// Resumes `rev` and says what happened.
    async fn restart(&self, rev: RevisionRef<'_>, key: &str, attempt: u32) -> Event {
        match self.executor.driver().resume(rev).await {
            Ok(()) => {
                tracing::info!(workload = %key, attempt = attempt + 1, "restarted");
                self.history
                    .lock()
                    .expect("supervisor history")
                    .entry(key.to_string())
                    .and_modify(|h| h.restarted(Instant::now()));
                Event::WorkloadStarted {
                    cause: Cause::Supervisor,
                    namespace: rev.namespace.into(),
                    workload: rev.workload.into(),
                    revision: rev.revision.into(),
                    previous: None,
                }
            }
            Err(e) => {
                tracing::warn!(workload = %key, attempt = attempt + 1, error = %e.report(), "restart failed");
                Event::WorkloadFailed {
                    cause: Cause::Supervisor,
                    namespace: rev.namespace.into(),
                    workload: rev.workload.into(),
                    code: e.code(),
                    message: e.report(),
                }
            }
        }
    }

    /// True when intent wants exactly this revision running.
    fn wanted(&self, rev: RevisionRef<'_>) -> bool {
        self.executor.log().with_intent(|intent| {
            intent
                .workload(rev.namespace, rev.workload)
                .is_some_and(|w| {
                    w.intent == RunIntent::Running
                        && w.active_revision.as_deref() == Some(rev.revision)
                })
        })
    }
}

/// One of the driver's feeds the supervisor follows: exits and failures.
trait Report: Send + Sized + 'static {
    /// The feed's name, for the log.
    const FEED: &'static str;
    fn subscribe(
        driver: &dyn Driver,
        reports: tokio::sync::mpsc::Sender<Self>,
    ) -> capstan_driver::decorate::Call<'_, ()>;
    fn handle(self, supervisor: &Supervisor) -> impl std::future::Future<Output = ()> + Send;
}

impl Report for Exit {
    const FEED: &'static str = "exits";
    fn subscribe(
        driver: &dyn Driver,
        reports: tokio::sync::mpsc::Sender<Self>,
    ) -> capstan_driver::decorate::Call<'_, ()> {
        driver.watch_exits(reports)
    }
    async fn handle(self, supervisor: &Supervisor) {
        supervisor.handle(self).await;
    }
}

impl Report for Failure {
    const FEED: &'static str = "failures";
    fn subscribe(
        driver: &dyn Driver,
        reports: tokio::sync::mpsc::Sender<Self>,
    ) -> capstan_driver::decorate::Call<'_, ()> {
        driver.watch_failures(reports)
    }
    async fn handle(self, supervisor: &Supervisor) {
        supervisor.handle_failure(self).await;
    }
}

/// `workload_failed/backend_failed` for an exited revision the backend has given up
/// on (systemd's `failed` after its start limit, a crash-looping pod), with the
/// backend's reason.
fn gave_up(exit: &Exit, reason: &str) -> Event {
    Event::WorkloadFailed {
        cause: Cause::Supervisor,
        namespace: exit.namespace.clone(),
        workload: exit.workload.clone(),
        code: ErrorCode::BackendFailed,
        message: format!(
            "the backend gave up on revision {}: {reason}",
            exit.revision
        ),
    }
}

#[cfg(test)]
mod tests;
