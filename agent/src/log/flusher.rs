//! Group commit: one flusher thread makes appends durable. Writers append (cheap, in
//! memory), then wait for a flush that covers their seq; every writer that arrives
//! while a flush runs shares the next one. A single flusher also sidesteps sled's
//! `flush_async`, which deadlocks when called concurrently.

use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::oneshot;

type Waiter = (u64, oneshot::Sender<Result<(), String>>);

#[derive(Default)]
struct State {
    /// Highest seq appended.
    written: u64,
    /// Highest seq known durable.
    flushed: u64,
    waiters: Vec<Waiter>,
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
            .spawn(move || run(&worker, flush))
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

    /// Waits until `seq` is durable.
    pub async fn durable(&self, seq: u64) -> Result<(), String> {
        let rx = {
            let mut s = self.shared.0.lock().expect("flusher lock");
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

fn run(shared: &(Mutex<State>, Condvar), flush: impl Fn() -> Result<(), String>) {
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
            s.written
        };
        let result = flush();
        let mut s = lock.lock().expect("flusher lock");
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
