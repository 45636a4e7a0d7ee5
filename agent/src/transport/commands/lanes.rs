//! Lanes: work items keyed by a name (a namespace) run one after another in the order
//! they were pushed; items of different names run concurrently. Each item is handed
//! its [`Turn`], which it awaits before doing anything its lane must order (so it can
//! keep a delivery alive while it waits).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// The last item pushed to each lane still running: its number and its end.
type Tails = HashMap<String, (u64, oneshot::Receiver<()>)>;

pub struct Lanes {
    tails: Arc<Mutex<Tails>>,
    next: u64,
    tasks: JoinSet<()>,
}

/// An item's turn: ready once every earlier item of its lane has ended (finished,
/// panicked or been dropped).
pub struct Turn(Option<oneshot::Receiver<()>>);

impl Turn {
    pub async fn wait(self) {
        if let Some(previous) = self.0 {
            let _ = previous.await;
        }
    }
}

impl Lanes {
    pub fn new() -> Lanes {
        Lanes {
            tails: Arc::default(),
            next: 0,
            tasks: JoinSet::new(),
        }
    }

    /// Runs `work(turn)` as the last item of lane `key`.
    pub fn push<W, F>(&mut self, key: String, work: W)
    where
        W: FnOnce(Turn) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let (end, ended) = oneshot::channel();
        let number = self.next;
        self.next += 1;
        let previous = lock(&self.tails)
            .insert(key.clone(), (number, ended))
            .map(|(_, previous)| previous);
        let work = work(Turn(previous));
        let tails = Arc::clone(&self.tails);
        self.tasks.spawn(async move {
            // Ends the lane's entry even if `work` panics (the guard drops `end`).
            let guard = Ended {
                tails,
                key,
                number,
                end: Some(end),
            };
            work.await;
            drop(guard);
        });
        while let Some(joined) = self.tasks.try_join_next() {
            report(joined);
        }
    }

    /// How many items are running or waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Waits for every item pushed.
    pub async fn finish(mut self) {
        while let Some(joined) = self.tasks.join_next().await {
            report(joined);
        }
    }
}

fn lock(tails: &Mutex<Tails>) -> std::sync::MutexGuard<'_, Tails> {
    tails.lock().unwrap_or_else(|e| e.into_inner())
}

fn report(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        tracing::error!(error = %e, "a command task failed");
    }
}

/// Signals an item's end and forgets its lane when nothing was pushed behind it.
struct Ended {
    tails: Arc<Mutex<Tails>>,
    key: String,
    number: u64,
    end: Option<oneshot::Sender<()>>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(end) = self.end.take() {
            let _ = end.send(());
        }
        let mut tails = lock(&self.tails);
        if tails.get(&self.key).is_some_and(|(n, _)| *n == self.number) {
            tails.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// Pushes an item that waits its turn, then for `gate`, then reports `name`.
    fn item(
        lanes: &mut Lanes,
        lane: &str,
        name: &'static str,
        gate: Option<oneshot::Receiver<()>>,
        seen: &mpsc::UnboundedSender<&'static str>,
    ) {
        let seen = seen.clone();
        lanes.push(lane.into(), move |turn| async move {
            turn.wait().await;
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            let _ = seen.send(name);
        });
    }

    #[tokio::test]
    async fn a_lane_keeps_its_order_and_other_lanes_do_not_wait_for_it() {
        let (seen, mut order) = mpsc::unbounded_channel();
        let mut lanes = Lanes::new();
        let (open_a1, gate) = oneshot::channel();
        // Given a1 held (a slow hook), a2 behind it, and b1 in another lane,
        item(&mut lanes, "a", "a1", Some(gate), &seen);
        item(&mut lanes, "a", "a2", None, &seen);
        item(&mut lanes, "b", "b1", None, &seen);
        // then b1 finishes while a1 is still held,
        assert_eq!(order.recv().await, Some("b1"));
        // and a2 waits for a1.
        open_a1.send(()).unwrap();
        assert_eq!(order.recv().await, Some("a1"));
        assert_eq!(order.recv().await, Some("a2"));
        lanes.finish().await;
    }

    #[tokio::test]
    async fn an_item_that_panics_does_not_stall_its_lane() {
        let (seen, mut order) = mpsc::unbounded_channel();
        let mut lanes = Lanes::new();
        lanes.push("a".into(), |turn| async move {
            turn.wait().await;
            panic!("a command task panicked");
        });
        item(&mut lanes, "a", "a2", None, &seen);
        assert_eq!(order.recv().await, Some("a2"));
        lanes.finish().await;
    }

    #[tokio::test]
    async fn finished_lanes_are_forgotten() {
        let (seen, mut order) = mpsc::unbounded_channel();
        let mut lanes = Lanes::new();
        for lane in ["a", "b", "c"] {
            item(&mut lanes, lane, "x", None, &seen);
        }
        for _ in 0..3 {
            assert_eq!(order.recv().await, Some("x"));
        }
        // Every task has ended once its report is in and its join is collected.
        while lanes.len() > 0 {
            report(lanes.tasks.join_next().await.expect("a task"));
        }
        assert!(lock(&lanes.tails).is_empty());
    }
}
