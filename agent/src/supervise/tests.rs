//! The real supervisor, executor and sim driver; the sim declares the capabilities
//! under test, and tests wait on the log and on handled exits, never on time (the
//! backoff's tests pause tokio's clock and read how long the supervisor waited).

use super::*;
use crate::testkit::{wait_for, Rig};
use capstan_common::Op;
use capstan_driver::sim::SimConfig;
use capstan_driver::Capabilities;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

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
    probes: true,
};

/// What systemd declares by default: exits are reported, the backend restarts.
const BACKEND_RESTARTS: Capabilities = Capabilities {
    manages_lifecycle: false,
    reports_exits: true,
    restarts_exits: false,
    reaps_orphans: false,
    probes: true,
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

/// Restarts after 1 s, doubling; a minute up resets it. Tests pause tokio's clock.
const SLOW: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(3600),
    reset_after: Duration::from_secs(60),
};

/// `web@r1`'s exit with status `code`, as the driver reports it.
fn crash(code: i64) -> Exit {
    Exit {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: "r1".into(),
        exit_code: Some(code),
    }
}

/// Drives `handling` (the supervisor's handling of `web@r1`'s exit, polled by no
/// one else) until the supervisor has recorded the exit, found intent wanting `r1`
/// running, and scheduled the restart (the attempt is counted): it then waits out
/// its backoff, and goes on only when polled again.
async fn until_restart_scheduled(supervisor: &Supervisor, mut handling: Pin<&mut impl Future>) {
    let key = capstan_common::workload_key("ns", "web");
    std::future::poll_fn(|cx| {
        assert!(
            handling.as_mut().poll(cx).is_pending(),
            "the exit was handled to the end without waiting"
        );
        let history = supervisor.history.lock().expect("supervisor history");
        match history.contains_key(&key) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await
}

#[tokio::test]
async fn a_stop_recorded_while_a_restart_waits_wins_over_it() {
    // Given: web@r1 crashed and, intent still wanting it running, its restart is
    // scheduled (the backoff's first delay, on tokio's paused clock)
    let rig = Rig::new(SimConfig::declaring(DOCKER));
    rig.running_r1().await;
    let supervisor = Supervisor::new(Arc::clone(&rig.executor), SLOW);
    tokio::time::pause();
    rig.sim.exit(R1, 137).unwrap();
    let handling = supervisor.handle(crash(137));
    tokio::pin!(handling);
    until_restart_scheduled(&supervisor, handling.as_mut()).await;
    assert_eq!(rig.kinds().last(), Some(&"workload_exited"));

    // When: a stop_workload command is carried out before the restart, and the
    // supervisor then goes on (its delay over)
    let stop = Op::StopWorkload {
        namespace: "ns".into(),
        workload: "web".into(),
    };
    rig.ok("s1", stop).await;
    handling.await;

    // Then: the stop wins: the supervisor re-read intent and did not restart r1
    assert_eq!(restarts(&rig), 0);
    assert_eq!(rig.kinds().last(), Some(&"command_completed"));
    let r1 = rig.sim.host().revisions["ns/web@r1"].clone();
    assert_eq!((r1.state, r1.starts), (BackendState::Stopped, 1));
}

/// Crashes `web@r1` and hands its exit to the supervisor, which restarts it: how long
/// it waited first, on tokio's paused clock, in whole seconds (the timer rounds a
/// deadline up to its next millisecond tick, and never fires early).
async fn crash_and_restart(rig: &Rig, supervisor: &Supervisor) -> Duration {
    let before = restarts(rig);
    rig.sim.exit(R1, 1).unwrap();
    let crashed = Instant::now();
    supervisor.handle(crash(1)).await;
    let waited = crashed.elapsed();
    assert_eq!(restarts(rig), before + 1, "restarted");
    Duration::from_secs(waited.as_secs())
}

/// `web@r1` running, supervised with [`SLOW`] (its exits handed over by the test), and
/// tokio's clock paused.
async fn paused_with_slow_backoff() -> (Rig, Arc<Supervisor>) {
    let rig = Rig::new(SimConfig::declaring(DOCKER));
    rig.running_r1().await;
    let supervisor = Supervisor::new(Arc::clone(&rig.executor), SLOW);
    tokio::time::pause();
    (rig, supervisor)
}

#[tokio::test]
async fn a_crash_before_reset_after_keeps_the_grown_delay() {
    // Given: web@r1 crashed once and was restarted after the initial delay
    let (rig, supervisor) = paused_with_slow_backoff().await;
    assert_eq!(crash_and_restart(&rig, &supervisor).await, SLOW.base);

    // When: it crashes again, having run a second short of reset_after
    tokio::time::advance(SLOW.reset_after - Duration::from_secs(1)).await;
    let waited = crash_and_restart(&rig, &supervisor).await;

    // Then: the restart waited the grown delay
    assert_eq!(waited, SLOW.delay(1));
    assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 3);
}

#[tokio::test]
async fn a_crash_after_reset_after_restarts_with_the_initial_delay_again() {
    // Given: web@r1 crash-looped: restarted after 1 s, then after 2 s
    let (rig, supervisor) = paused_with_slow_backoff().await;
    assert_eq!(crash_and_restart(&rig, &supervisor).await, SLOW.delay(0));
    assert_eq!(crash_and_restart(&rig, &supervisor).await, SLOW.delay(1));

    // When: it stays up for reset_after since its last restart, then crashes
    tokio::time::advance(SLOW.reset_after).await;
    let waited = crash_and_restart(&rig, &supervisor).await;

    // Then: the restart waited the initial delay, not the grown one
    assert_eq!(waited, SLOW.base);
    assert_eq!(rig.sim.host().revisions["ns/web@r1"].starts, 4);
}

#[tokio::test]
async fn after_the_exit_feed_breaks_the_supervisor_subscribes_again_and_keeps_restarting() {
    // Given: a supervisor following the sim's exit feed, with docker's capabilities
    let (rig, supervisor) = supervised(DOCKER).await;

    // When: the feed breaks, and web@r1 crashes once the supervisor has subscribed
    // again
    rig.sim.break_exit_feeds();
    tokio::time::timeout(Duration::from_secs(10), rig.sim.watched())
        .await
        .expect("the supervisor subscribes again");
    rig.sim.exit(R1, 137).unwrap();

    // Then: the exit reported on the new feed is recorded and r1 restarted
    handled(&supervisor, 1).await;
    assert!(exited(137)(&rig.records()));
    assert_eq!(restarts(&rig), 1);
    let r1 = rig.sim.host().revisions["ns/web@r1"].clone();
    assert_eq!((r1.state, r1.starts), (BackendState::Running, 2));
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
