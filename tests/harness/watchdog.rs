//! A time limit per e2e test, so that a regression that hangs fails the run instead of
//! holding CI until its own timeout. The harness's entry points (`Agent::builder`,
//! `NatsServer::start*`, `Coordinator::start*`, `wait_until`) call [`watch`]: the
//! first call on a test's thread starts that test's clock, and when the thread ends
//! (the test passed or failed) its clock goes away. A test still running after
//! `CAPSTAN_TEST_TIMEOUT` seconds (default [`DEFAULT_LIMIT`]) aborts the whole test
//! binary, naming the test: libtest cannot cancel one test thread.
//!
//! A program that is not a test but boots harness parts (`capstan-bench` boots a
//! [`crate::systemd::SystemdHost`]) calls [`off`] first: its runs are as long as it
//! asks for. Tests never call it.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The default limit: several times the slowest test's time on a loaded 2-core CI
/// machine.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(600);

/// The tests being timed: (id, name, started).
static RUNNING: Mutex<Vec<(u64, String, Instant)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Set by [`off`]: [`watch`] does nothing.
static OFF: AtomicBool = AtomicBool::new(false);

/// Turns the watchdog off for this process, for good: [`watch`] starts no clock, and
/// clocks already running never abort. For programs that are not tests
/// (`capstan-bench`); a test binary never calls it.
pub fn off() {
    OFF.store(true, Ordering::SeqCst);
}

/// Removes its test from [`RUNNING`] when the test's thread ends.
struct Clock(u64);

impl Drop for Clock {
    fn drop(&mut self) {
        if let Ok(mut running) = RUNNING.lock() {
            running.retain(|(id, _, _)| *id != self.0);
        }
    }
}

thread_local! {
    static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

/// The per-test limit: `CAPSTAN_TEST_TIMEOUT` (seconds) or [`DEFAULT_LIMIT`].
pub fn limit() -> Duration {
    match std::env::var("CAPSTAN_TEST_TIMEOUT") {
        Ok(s) => {
            Duration::from_secs(s.parse().unwrap_or_else(|_| {
                panic!("CAPSTAN_TEST_TIMEOUT={s:?} is not a number of seconds")
            }))
        }
        Err(_) => DEFAULT_LIMIT,
    }
}

/// Starts the current test's clock (once per test thread) and the watchdog (once per
/// process).
pub fn watch() {
    if OFF.load(Ordering::SeqCst) {
        return;
    }
    CLOCK.with(|clock| {
        let mut clock = clock.borrow_mut();
        if clock.is_some() {
            return;
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = std::thread::current()
            .name()
            .unwrap_or("an unnamed test thread")
            .to_string();
        RUNNING
            .lock()
            .expect("watchdog lock")
            .push((id, name, Instant::now()));
        *clock = Some(Clock(id));
    });
    static WATCHDOG: OnceLock<()> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let limit = limit();
        std::thread::Builder::new()
            .name("capstan-tests watchdog".into())
            .spawn(move || loop {
                // A poll of the clocks, not a wait for an event.
                std::thread::sleep(Duration::from_secs(1));
                if OFF.load(Ordering::SeqCst) {
                    return;
                }
                let running = RUNNING.lock().expect("watchdog lock");
                if let Some((_, name, _)) = running.iter().find(|(_, _, t)| t.elapsed() > limit) {
                    // Straight to stderr: `eprintln!` in a thread a test started is
                    // captured with the test's output, which the abort loses.
                    let _ = writeln!(
                        std::io::stderr(),
                        "capstan-tests watchdog: test {name} still runs after {}s \
                         (CAPSTAN_TEST_TIMEOUT): aborting the test binary",
                        limit.as_secs()
                    );
                    // The processes the tests started would outlive the abort.
                    crate::process::kill_children();
                    std::process::abort();
                }
            })
            .expect("start the watchdog thread");
    });
}
