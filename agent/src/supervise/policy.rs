//! The supervisor's decisions, without I/O: which restart attempt an exit is (the
//! backoff's count, reset after a long enough run) and, once its delay has passed and
//! intent still wants the revision, what to do given what the backend says of it now.
//! The supervisor reads the clock, the log and the driver, and carries these out.

use capstan_driver::BackendState;
use std::time::Duration;
use tokio::time::Instant;

/// A workload's restarts so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct History {
    attempt: u32,
    last_restart: Instant,
}

impl History {
    /// No restart yet; counted from `now` (the first exit).
    pub(super) fn new(now: Instant) -> History {
        History {
            attempt: 0,
            last_restart: now,
        }
    }

    /// The restart an exit at `now` gets (0-based, what [`super::Backoff::delay`]
    /// takes), counted: a workload that stayed up for `reset_after` since its last
    /// restart starts again from 0.
    pub(super) fn next_attempt(&mut self, now: Instant, reset_after: Duration) -> u32 {
        if now.saturating_duration_since(self.last_restart) >= reset_after {
            self.attempt = 0;
        }
        let attempt = self.attempt;
        self.attempt = self.attempt.saturating_add(1);
        attempt
    }

    /// The workload was started again at `now`.
    pub(super) fn restarted(&mut self, now: Instant) {
        self.last_restart = now;
    }
}

/// What to do about an exited revision that intent still wants running, its delay
/// over and re-checked under the namespace's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterExit {
    /// It runs again (the backend, or a command, started it): nothing to do.
    NotNeeded,
    /// The backend has given up on it: record `workload_failed/backend_failed`.
    GaveUp { reason: String },
    /// Resume it.
    Restart,
}

/// The decision, from the backend's state of the revision now (`None`: no backend
/// object, or the state could not be read — a restart finds out).
pub(super) fn after_exit(state: Option<BackendState>) -> AfterExit {
    match state {
        Some(BackendState::Running) => AfterExit::NotNeeded,
        Some(BackendState::Failed { reason }) => AfterExit::GaveUp { reason },
        _ => AfterExit::Restart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESET: Duration = Duration::from_secs(120);

    #[test]
    fn exits_count_up_while_the_workload_keeps_failing_soon_after_its_restarts() {
        // Given a workload first seen exiting at t0,
        let t0 = Instant::now();
        let mut h = History::new(t0);
        // when it exits again and again, each time soon after its last restart,
        let mut attempts = Vec::new();
        for n in 0..4 {
            let at = t0 + Duration::from_secs(n * 10);
            attempts.push(h.next_attempt(at, RESET));
            h.restarted(at);
        }
        // then each exit is the next attempt.
        assert_eq!(attempts, [0, 1, 2, 3]);
    }

    #[test]
    fn a_run_of_reset_after_since_the_last_restart_starts_the_count_again() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        assert_eq!(h.next_attempt(t0, RESET), 0);
        h.restarted(t0);
        assert_eq!(h.next_attempt(t0 + Duration::from_secs(1), RESET), 1);
        h.restarted(t0 + Duration::from_secs(1));
        // Just short of reset_after: the count goes on.
        let almost = t0 + Duration::from_secs(1) + RESET - Duration::from_millis(1);
        assert_eq!(h.next_attempt(almost, RESET), 2);
        h.restarted(almost);
        // reset_after exactly: from 0 again.
        assert_eq!(h.next_attempt(almost + RESET, RESET), 0);
    }

    #[test]
    fn an_exit_without_a_restart_since_counts_from_the_first_exit() {
        // A restart that failed records no `restarted`: the next exit compares with
        // the first one.
        let t0 = Instant::now();
        let mut h = History::new(t0);
        assert_eq!(h.next_attempt(t0, RESET), 0);
        assert_eq!(h.next_attempt(t0 + RESET, RESET), 0);
    }

    #[test]
    fn after_the_delay_the_backends_state_decides() {
        assert_eq!(
            after_exit(Some(BackendState::Running)),
            AfterExit::NotNeeded
        );
        let failed = BackendState::Failed {
            reason: "start limit hit".into(),
        };
        assert_eq!(
            after_exit(Some(failed)),
            AfterExit::GaveUp {
                reason: "start limit hit".into()
            }
        );
        assert_eq!(after_exit(Some(BackendState::Stopped)), AfterExit::Restart);
        assert_eq!(after_exit(None), AfterExit::Restart);
    }
}
