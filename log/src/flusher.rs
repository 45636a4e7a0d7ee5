//! Group commit: one flusher thread makes appends durable. Writers append (cheap, in
//! memory), then wait for a flush that covers their seq; every writer that arrives
//! while a flush runs shares the next one. Writers announce themselves before they
//! append ([`Flusher::arriving`]); the flusher holds a flush (at most [`MAX_LINGER`])
//! until every announced writer has registered, so a burst of writers shares one flush
//! while a lone writer never waits. A single flusher also sidesteps sled's
//! `flush_async`, which deadlocks when called concurrently.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The longest a flush waits for writers that are still appending.
pub const MAX_LINGER: Duration = Duration::from_millis(2);

type Waiter = (u64, oneshot::Sender<Result<(), String>>);

#[derive(Default)]
struct State {
    /// Highest seq appended.
    written: u64,
    /// Highest seq known durable.
    flushed: u64,
    waiters: Vec<Waiter>,
    /// Writers between "about to append" and "waiting for durability".
    arriving: usize,
    /// How many flushes ran.
    flushes: u64,
    /// Set once a flush failed: nothing written after it is durable.
    failed: Option<String>,
    stop: bool,
}

pub struct Flusher {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    /// Starts the flusher thread; `flush` makes everything written so far durable.
    pub fn start(
        durable_seq: u64,
        flush: impl Fn() -> Result<(), String> + Send + 'static,
    ) -> Flusher {
        Self::with_linger(durable_seq, MAX_LINGER, flush)
    }

    /// [`Flusher::start`] with a chosen bound on waiting for announced writers.
    pub fn with_linger(
        durable_seq: u64,
        linger: Duration,
        flush: impl Fn() -> Result<(), String> + Send + 'static,
    ) -> Flusher {
        let shared = Arc::new((
            Mutex::new(State {
                written: durable_seq,
                flushed: durable_seq,
                ..State::default()
            }),
            Condvar::new(),
        ));
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("capstan-log-flush".into())
            .spawn(move || run(&worker, linger, flush))
            .expect("spawn the log flusher thread");
        Flusher {
            shared,
            thread: Some(thread),
        }
    }

    /// Records that everything up to `seq` has been written (not yet durable).
    pub fn written(&self, seq: u64) {
        let mut s = self.shared.0.lock().expect("flusher lock");
        s.written = s.written.max(seq);
    }

    /// Announces a writer that is about to append and then wait for durability.
    pub fn arriving(&self) -> Arriving<'_> {
        self.shared.0.lock().expect("flusher lock").arriving += 1;
        Arriving { flusher: self }
    }

    /// How many flushes have run (group commit shares one among many appends).
    pub fn flushes(&self) -> u64 {
        self.shared.0.lock().expect("flusher lock").flushes
    }

    /// How many announced writers have not waited for durability yet (for tests that
    /// line writers up).
    #[cfg(test)]
    pub fn announced(&self) -> usize {
        self.shared.0.lock().expect("flusher lock").arriving
    }

    /// Why a flush failed, once one has: nothing written since is durable.
    pub fn failed(&self) -> Option<String> {
        self.shared.0.lock().expect("flusher lock").failed.clone()
    }

    /// Marks the log failed without a flush failing: an append could not be written
    /// whole. As after a failed flush, nothing written from now on is durable; writers
    /// already waiting for whole appends are still served.
    pub fn fail(&self, reason: String) {
        let mut s = self.shared.0.lock().expect("flusher lock");
        s.failed.get_or_insert(reason);
    }

    /// Waits until `seq` is durable. A writer announced by [`Flusher::arriving`] hands
    /// its guard in here, so it stops holding the flush back the moment it waits.
    pub async fn durable(&self, seq: u64, arrived: Option<Arriving<'_>>) -> Result<(), String> {
        let rx = {
            let mut s = self.shared.0.lock().expect("flusher lock");
            if let Some(guard) = arrived {
                s.arriving -= 1;
                // Already counted out under this lock; its Drop must not do it again.
                std::mem::forget(guard);
            }
            if let Some(e) = &s.failed {
                return Err(e.clone());
            }
            if s.flushed >= seq {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            s.waiters.push((seq, tx));
            self.shared.1.notify_one();
            rx
        };
        rx.await
            .unwrap_or_else(|_| Err("the log flusher stopped".into()))
    }
}

/// A writer announced by [`Flusher::arriving`]. Handing it to [`Flusher::durable`], or
/// dropping it (the append failed), lets the flusher go.
pub struct Arriving<'a> {
    flusher: &'a Flusher,
}

impl Drop for Arriving<'_> {
    fn drop(&mut self) {
        let mut s = self.flusher.shared.0.lock().expect("flusher lock");
        s.arriving -= 1;
        self.flusher.shared.1.notify_one();
    }
}

fn run(shared: &(Mutex<State>, Condvar), linger: Duration, flush: impl Fn() -> Result<(), String>) {
    let (lock, wake) = shared;
    loop {
        let target = {
            let mut s = lock.lock().expect("flusher lock");
            while s.waiters.is_empty() && !s.stop {
                s = wake.wait(s).expect("flusher lock");
            }
            if s.waiters.is_empty() && s.stop {
                return;
            }
            // Let writers already appending join this flush.
            let deadline = Instant::now() + linger;
            while s.arriving > 0 && !s.stop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                s = wake.wait_timeout(s, left).expect("flusher lock").0;
            }
            s.written
        };
        let result = flush();
        let mut s = lock.lock().expect("flusher lock");
        s.flushes += 1;
        match result {
            Ok(()) => {
                s.flushed = s.flushed.max(target);
                let flushed = s.flushed;
                let (done, waiting): (Vec<Waiter>, Vec<Waiter>) =
                    s.waiters.drain(..).partition(|(seq, _)| *seq <= flushed);
                s.waiters = waiting;
                for (_, tx) in done {
                    let _ = tx.send(Ok(()));
                }
            }
            Err(e) => {
                s.failed = Some(e.clone());
                for (_, tx) in s.waiters.drain(..) {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.0.lock().expect("flusher lock").stop = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A flush that blocks until the test lets it finish, and counts itself.
    fn gated() -> (
        impl Fn() -> Result<(), String> + Send + 'static,
        mpsc::Sender<()>,
        mpsc::Receiver<()>,
    ) {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let flush = move || {
            started_tx.send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
            Ok(())
        };
        (flush, release_tx, started_rx)
    }

    #[test]
    fn writers_arriving_during_a_flush_share_the_next_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (flush, release, started) = gated();
        let flusher = Flusher::start(0, flush);
        rt.block_on(async {
            flusher.written(1);
            let first = flusher.durable(1, None);
            tokio::pin!(first);
            // Poll once so the waiter registers, then let the flush start.
            assert!(futures::poll!(first.as_mut()).is_pending());
            started.recv().unwrap();
            // Ten writers arrive while flush #1 is running.
            flusher.written(11);
            let rest: Vec<_> = (2..=11).map(|seq| flusher.durable(seq, None)).collect();
            let rest = futures::future::join_all(rest);
            tokio::pin!(rest);
            assert!(futures::poll!(rest.as_mut()).is_pending());
            release.send(()).unwrap(); // flush #1 ends: only seq 1 is durable
            first.await.unwrap();
            started.recv().unwrap(); // flush #2 covers all ten
            release.send(()).unwrap();
            assert!(rest.await.into_iter().all(|r| r.is_ok()));
        });
        assert_eq!(flusher.flushes(), 2);
    }

    #[test]
    fn an_announced_writer_holds_the_flush_until_it_waits() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // A long linger: the flush may only start once both writers wait.
        let flusher = Flusher::with_linger(0, Duration::from_secs(60), || Ok(()));
        rt.block_on(async {
            let a = flusher.arriving();
            let b = flusher.arriving();
            flusher.written(2);
            let (ra, rb) = tokio::join!(flusher.durable(1, Some(a)), flusher.durable(2, Some(b)));
            ra.unwrap();
            rb.unwrap();
        });
        assert_eq!(
            flusher.flushes(),
            1,
            "both announced writers shared one flush"
        );
    }

    #[test]
    fn a_failed_flush_fails_every_waiter_and_later_ones() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let flusher = Flusher::start(0, || Err("disk on fire".into()));
        rt.block_on(async {
            flusher.written(1);
            assert_eq!(flusher.durable(1, None).await.unwrap_err(), "disk on fire");
            flusher.written(2);
            assert_eq!(flusher.durable(2, None).await.unwrap_err(), "disk on fire");
        });
    }
}
