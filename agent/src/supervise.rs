//! Supervision: the driver reports exits ([`Driver::watch_exits`]); each one is
//! recorded (`workload_exited`), and a workload whose intent is running on that very
//! revision is started again after a capped exponential backoff. Every attempt is
//! logged, and its outcome recorded (`workload_started`/`workload_failed` with cause
//! `supervisor`). The decision is re-checked under the namespace's lock right before
//! acting, so a `stop_workload` that caused the exit always wins.
//!
//! [`Driver::watch_exits`]: capstan_driver::Driver::watch_exits

use crate::event::{Cause, Event};
use crate::executor::Executor;
use crate::intent::RunIntent;
use crate::log::LogError;
use capstan_driver::{BackendState, Exit, RevisionRef};
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
}

impl Supervisor {
    pub fn new(executor: Arc<Executor>, backoff: Backoff) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            executor,
            backoff,
            history: Mutex::new(HashMap::new()),
        })
    }

    /// Runs until the task is aborted: subscribes to the driver's exits (again, with
    /// backoff, whenever the feed breaks) and handles each one in its own task. The
    /// handlers live in a `JoinSet` owned here, so aborting `run` aborts them too: no
    /// restart can race the shutdown sweep.
    pub async fn run(self: Arc<Self>) {
        let mut handlers = tokio::task::JoinSet::new();
        let mut failures = 0u32;
        loop {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Exit>(256);
            let executor = Arc::clone(&self.executor);
            let feed = executor.driver().watch_exits(tx);
            tokio::pin!(feed);
            // Cancel-safe: `recv` loses nothing when the other branch wins, and the
            // feed future is pinned across iterations.
            let ended = loop {
                tokio::select! {
                    ended = &mut feed => break ended,
                    Some(exit) = rx.recv() => {
                        failures = 0;
                        while handlers.try_join_next().is_some() {}
                        let me = Arc::clone(&self);
                        handlers.spawn(async move { me.handle(exit).await });
                    }
                }
            };
            while let Ok(exit) = rx.try_recv() {
                let me = Arc::clone(&self);
                handlers.spawn(async move { me.handle(exit).await });
            }
            match ended {
                Ok(()) => {
                    tracing::info!("the driver reports no exits: nothing to supervise");
                    while handlers.join_next().await.is_some() {}
                    return;
                }
                Err(e) => tracing::warn!(error = %e.report(), "exit feed broke; resubscribing"),
            }
            tokio::time::sleep(self.backoff.delay(failures)).await;
            failures = failures.saturating_add(1);
        }
    }

    /// Records one exit and, if intent says so, restarts the revision.
    pub async fn handle(&self, exit: Exit) {
        if let Err(e) = self.try_handle(exit).await {
            tracing::error!(error = %e, "supervisor could not write the log");
        }
    }

    async fn try_handle(&self, exit: Exit) -> Result<(), LogError> {
        let log = self.executor.log();
        tracing::info!(
            namespace = %exit.namespace,
            workload = %exit.workload,
            revision = %exit.revision,
            exit_code = ?exit.exit_code,
            "workload exited"
        );
        log.append_durable(&[Event::WorkloadExited {
            namespace: exit.namespace.clone(),
            workload: exit.workload.clone(),
            revision: exit.revision.clone(),
            exit_code: exit.exit_code,
        }])
        .await?;
        if !self.wanted(&exit) {
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
        if !self.wanted(&exit) {
            tracing::info!(workload = %key, "restart dropped: intent changed");
            return Ok(());
        }
        let driver = self.executor.driver();
        let rev = RevisionRef {
            namespace: &exit.namespace,
            workload: &exit.workload,
            revision: &exit.revision,
        };
        if let Ok(Some(BackendState::Running)) = driver.state(rev).await {
            tracing::info!(workload = %key, "restart not needed: it runs again");
            return Ok(());
        }
        let event = match driver.resume(rev).await {
            Ok(()) => {
                tracing::info!(workload = %key, attempt = attempt + 1, "restarted");
                self.history
                    .lock()
                    .expect("supervisor history")
                    .entry(key)
                    .and_modify(|h| h.last_restart = Instant::now());
                Event::WorkloadStarted {
                    cause: Cause::Supervisor,
                    namespace: exit.namespace,
                    workload: exit.workload,
                    revision: exit.revision,
                    previous: None,
                }
            }
            Err(e) => {
                tracing::warn!(workload = %key, attempt = attempt + 1, error = %e.report(), "restart failed");
                Event::WorkloadFailed {
                    cause: Cause::Supervisor,
                    namespace: exit.namespace,
                    workload: exit.workload,
                    code: e.code(),
                    message: e.report(),
                }
            }
        };
        log.append_durable(&[event]).await?;
        Ok(())
    }

    /// True when intent wants exactly this revision running.
    fn wanted(&self, exit: &Exit) -> bool {
        self.executor.log().with_intent(|intent| {
            intent
                .workload(&exit.namespace, &exit.workload)
                .is_some_and(|w| {
                    w.intent == RunIntent::Running
                        && w.active_revision.as_deref() == Some(exit.revision.as_str())
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
