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

use crate::event::{Cause, Event};
use crate::executor::Executor;
use crate::intent::RunIntent;
use crate::log::LogError;
use capstan_common::ErrorCode;
use capstan_driver::{BackendState, Driver, Exit, Failure, RevisionRef};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Per-workload restart history.
#[derive(Debug, Clone, Copy)]
struct History {
    attempt: u32,
    last_restart: Instant,
}

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
            if let Some((event, reason)) = self.gave_up(&exit).await {
                log.append_durable(&[event]).await?;
                tracing::warn!(workload = %exit.rev(), %reason, "the backend gave up on it");
            }
            return Ok(());
        }
        let key = capstan_common::workload_key(&exit.namespace, &exit.workload);
        let attempt = {
            let mut history = self.history.lock().expect("supervisor history");
            let h = history.entry(key.clone()).or_insert(History {
                attempt: 0,
                last_restart: Instant::now(),
            });
            if h.last_restart.elapsed() >= self.backoff.reset_after {
                h.attempt = 0;
            }
            let attempt = h.attempt;
            h.attempt = h.attempt.saturating_add(1);
            attempt
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
        if let Ok(Some(BackendState::Running)) = self.executor.driver().state(rev).await {
            tracing::info!(workload = %key, "restart not needed: it runs again");
            return Ok(());
        }
        match self.gave_up(&exit).await {
            Some((failed, reason)) => {
                log.append_durable(&[failed]).await?;
                tracing::warn!(workload = %rev, %reason, "the backend gave up on it");
            }
            None => {
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

    /// `workload_failed/backend_failed` when the backend has given up on the exited
    /// revision (systemd's `failed` after its start limit, a crash-looping pod), with
    /// the backend's reason. The caller says so once the event is in the log.
    async fn gave_up(&self, exit: &Exit) -> Option<(Event, String)> {
        let rev = exit.rev();
        let Ok(Some(BackendState::Failed { reason })) = self.executor.driver().state(rev).await
        else {
            return None;
        };
        let event = Event::WorkloadFailed {
            cause: Cause::Supervisor,
            namespace: exit.namespace.clone(),
            workload: exit.workload.clone(),
            code: ErrorCode::BackendFailed,
            message: format!(
                "the backend gave up on revision {}: {reason}",
                exit.revision
            ),
        };
        Some((event, reason))
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
                    .and_modify(|h| h.last_restart = Instant::now());
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
    ) -> capstan_driver::around::Call<'_, ()>;
    fn handle(self, supervisor: &Supervisor) -> impl std::future::Future<Output = ()> + Send;
}

impl Report for Exit {
    const FEED: &'static str = "exits";
    fn subscribe(
        driver: &dyn Driver,
        reports: tokio::sync::mpsc::Sender<Self>,
    ) -> capstan_driver::around::Call<'_, ()> {
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
    ) -> capstan_driver::around::Call<'_, ()> {
        driver.watch_failures(reports)
    }
    async fn handle(self, supervisor: &Supervisor) {
        supervisor.handle_failure(self).await;
    }
}

#[cfg(test)]
mod tests {
    //! The real supervisor, executor and sim driver; the sim declares the capabilities
    //! under test, and tests wait on the log and on handled exits, never on time.
    use super::*;
    use crate::testkit::{wait_for, Rig};
    use capstan_driver::sim::SimConfig;
    use capstan_driver::Capabilities;

    const R1: RevisionRef<'static> = RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };

    /// What docker declares: the agent restarts what exits.
    const DOCKER: Capabilities = Capabilities {
        manages_lifecycle: true,
        reports_exits: true,
        restarts_exits: true,
        reaps_orphans: false,
    };

    /// What systemd declares by default: exits are reported, the backend restarts.
    const BACKEND_RESTARTS: Capabilities = Capabilities {
        manages_lifecycle: false,
        reports_exits: true,
        restarts_exits: false,
        reaps_orphans: false,
    };

    const NOW: Backoff = Backoff {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        reset_after: Duration::from_secs(120),
    };

    /// A sim declaring `capabilities`, running `web@r1`, supervised.
    async fn supervised(capabilities: Capabilities) -> (Rig, Arc<Supervisor>) {
        let rig = Rig::new(SimConfig::declaring(capabilities));
        rig.running_r1().await;
        let supervisor = Supervisor::new(Arc::clone(&rig.executor), NOW);
        tokio::spawn(Arc::clone(&supervisor).run());
        rig.sim.watched().await;
        (rig, supervisor)
    }

    async fn handled(supervisor: &Supervisor, n: u64) {
        let mut handled = supervisor.handled();
        let wait = handled.wait_for(|h| *h >= n);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("exits handled in time")
            .expect("the supervisor lives");
    }

    fn exited(code: i64) -> impl Fn(&[crate::event::Record]) -> bool {
        move |records| {
            records.iter().any(|r| {
                matches!(r.event, Event::WorkloadExited { exit_code, .. } if exit_code == Some(code))
            })
        }
    }

    /// The last record is the supervisor's `workload_failed/backend_failed` with `reason`.
    fn last_is_given_up(rig: &Rig, reason: &str) {
        let last = rig.records().pop().unwrap().event;
        assert!(
            matches!(
                &last,
                Event::WorkloadFailed { cause: Cause::Supervisor, code: ErrorCode::BackendFailed, message, .. }
                    if message.ends_with(reason)
            ),
            "{last:?}"
        );
    }

    fn restarts(rig: &Rig) -> usize {
        rig.records()
            .iter()
            .filter(|r| {
                matches!(
                    r.event,
                    Event::WorkloadStarted {
                        cause: Cause::Supervisor,
                        ..
                    }
                )
            })
            .count()
    }

    #[tokio::test]
    async fn with_dockers_capabilities_an_exit_is_recorded_and_the_revision_restarted() {
        let (rig, supervisor) = supervised(DOCKER).await;
        rig.sim.exit(R1, 137).unwrap();
        let log = rig.executor.log();
        wait_for(log, "a restart by the supervisor", |records| {
            exited(137)(records)
                && records.iter().any(|r| {
                    matches!(
                        r.event,
                        Event::WorkloadStarted {
                            cause: Cause::Supervisor,
                            ..
                        }
                    )
                })
        })
        .await;
        handled(&supervisor, 1).await;
        let r1 = rig.sim.host().revisions["ns/web@r1"].clone();
        assert_eq!((r1.state, r1.starts), (BackendState::Running, 2));
        assert_eq!(restarts(&rig), 1);
    }

    #[tokio::test]
    async fn when_the_backend_restarts_its_own_an_exit_is_only_recorded() {
        let (rig, supervisor) = supervised(BACKEND_RESTARTS).await;
        rig.sim.exit(R1, 1).unwrap();
        wait_for(rig.executor.log(), "workload_exited", exited(1)).await;
        handled(&supervisor, 1).await;
        let r1 = rig.sim.host().revisions["ns/web@r1"].clone();
        assert_eq!((r1.state, r1.starts), (BackendState::Stopped, 1));
        assert_eq!(restarts(&rig), 0);
        assert_eq!(rig.kinds().last(), Some(&"workload_exited"));
    }

    #[tokio::test]
    async fn a_revision_the_backend_gave_up_on_is_reported_not_restarted() {
        let (rig, supervisor) = supervised(DOCKER).await;
        rig.sim.give_up(R1, "crash-loop").unwrap();
        handled(&supervisor, 1).await;
        last_is_given_up(&rig, "crash-loop");
        assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 1);
        assert_eq!(restarts(&rig), 0);
    }

    #[tokio::test]
    async fn when_the_backend_restarts_its_own_its_giving_up_is_reported() {
        let (rig, supervisor) = supervised(BACKEND_RESTARTS).await;
        rig.sim.give_up(R1, "exit-code after 5 restarts").unwrap();
        handled(&supervisor, 1).await;
        last_is_given_up(&rig, "exit-code after 5 restarts");
        assert_eq!(restarts(&rig), 0);
    }

    #[tokio::test]
    async fn a_give_up_is_reported_once_however_many_exits_see_it() {
        let (rig, supervisor) = supervised(BACKEND_RESTARTS).await;
        rig.sim.give_up(R1, "exit-code after 3 restarts").unwrap();
        handled(&supervisor, 1).await;
        // A late exit of the same crash loop, handled once the backend had given up.
        supervisor
            .handle(Exit {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r1".into(),
                exit_code: Some(3),
            })
            .await;
        let failed = rig
            .records()
            .iter()
            .filter(|r| matches!(r.event, Event::WorkloadFailed { .. }))
            .count();
        assert_eq!(failed, 1);
        assert_eq!(rig.kinds().last(), Some(&"workload_exited"));
    }

    #[tokio::test]
    async fn without_an_exit_feed_there_is_nothing_to_supervise() {
        let rig = Rig::new(SimConfig::default());
        let supervisor = Supervisor::new(Arc::clone(&rig.executor), NOW);
        tokio::time::timeout(Duration::from_secs(10), supervisor.run())
            .await
            .expect("run returns at once");
    }

    fn failure(revision: &str, code: ErrorCode) -> Failure {
        Failure {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: revision.into(),
            code,
            reason: "pod web-1 container main: ErrImagePull".into(),
        }
    }

    /// The supervisor's `workload_failed` records: code and message.
    fn failures_recorded(rig: &Rig) -> Vec<(ErrorCode, String)> {
        rig.records()
            .into_iter()
            .filter_map(|r| match r.event {
                Event::WorkloadFailed {
                    cause: Cause::Supervisor,
                    code,
                    message,
                    ..
                } => Some((code, message)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_failure_of_the_running_revision_is_recorded_once_with_its_code() {
        let rig = Rig::new(SimConfig::declaring(BACKEND_RESTARTS));
        rig.running_r1().await;
        let supervisor = Supervisor::new(Arc::clone(&rig.executor), NOW);
        supervisor
            .handle_failure(failure("r1", ErrorCode::ImageNotFound))
            .await;
        supervisor
            .handle_failure(failure("r1", ErrorCode::ImageNotFound))
            .await;
        let recorded = failures_recorded(&rig);
        assert_eq!(
            recorded,
            [(
                ErrorCode::ImageNotFound,
                "revision r1 failed: pod web-1 container main: ErrImagePull".to_string()
            )]
        );
        // Another failure of it is news; nothing is restarted.
        supervisor
            .handle_failure(failure("r1", ErrorCode::BackendFailed))
            .await;
        assert_eq!(failures_recorded(&rig).len(), 2);
        assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 1);
    }

    #[tokio::test]
    async fn a_failure_of_a_revision_intent_does_not_run_is_not_recorded() {
        let rig = Rig::new(SimConfig::declaring(BACKEND_RESTARTS));
        rig.running_r1().await;
        let supervisor = Supervisor::new(Arc::clone(&rig.executor), NOW);
        // r2's rollout failing is its command's to report.
        supervisor
            .handle_failure(failure("r2", ErrorCode::ImageNotFound))
            .await;
        assert_eq!(failures_recorded(&rig), []);
        assert_eq!(rig.kinds().last(), Some(&"command_completed"));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            reset_after: Duration::from_secs(5),
        };
        let delays: Vec<u128> = (0..6).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
