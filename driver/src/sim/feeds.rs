//! The sim's exit feeds: the open `watch_exits` calls, each with its queue of exits,
//! and breaking them as a backend's event stream that ends under the agent.

use super::SimDriver;
use crate::Exit;
use tokio::sync::mpsc;

/// The open exit feeds: one queue each (unbounded: reporting never blocks the host),
/// by id. A feed leaves the list when its `watch_exits` call ends, or when it is
/// broken ([`SimDriver::break_exit_feeds`]).
#[derive(Default)]
pub(super) struct Feeds {
    next: u64,
    open: Vec<(u64, mpsc::UnboundedSender<Exit>)>,
}

impl SimDriver {
    /// Waits until at least one exit feed is open: an exit before that reaches no one,
    /// as with a real backend.
    pub async fn watched(&self) {
        let mut open = self.watchers.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = open.wait_for(|n| *n > 0).await;
    }

    /// Breaks every open exit feed, as a backend's event stream that ends under the
    /// agent (docker's engine restarting): each open `watch_exits` call returns `Err`,
    /// as a real driver's does when its feed breaks, and the exits from then on reach
    /// only feeds opened after ([`SimDriver::watched`] waits for one).
    pub fn break_exit_feeds(&self) {
        let mut feeds = self.feeds.lock().expect("sim feeds lock");
        feeds.open.clear();
        self.watchers.send_replace(0);
    }

    /// Sends `exits` to every open feed (when the sim reports exits).
    pub(super) fn report_exits(&self, exits: Vec<Exit>) {
        if !self.config.reports_exits || exits.is_empty() {
            return;
        }
        let mut feeds = self.feeds.lock().expect("sim feeds lock");
        feeds
            .open
            .retain(|(_, feed)| exits.iter().all(|e| feed.send(e.clone()).is_ok()));
    }
}

/// Lists one exit feed (and counts it open) until its `watch_exits` call ends
/// (returned or dropped).
pub(super) struct Watching<'a> {
    sim: &'a SimDriver,
    id: u64,
}

impl<'a> Watching<'a> {
    pub(super) fn open(sim: &'a SimDriver, feed: mpsc::UnboundedSender<Exit>) -> Watching<'a> {
        let mut feeds = sim.feeds.lock().expect("sim feeds lock");
        let id = feeds.next;
        feeds.next += 1;
        feeds.open.push((id, feed));
        sim.watchers.send_replace(feeds.open.len());
        Watching { sim, id }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        let mut feeds = self.sim.feeds.lock().expect("sim feeds lock");
        feeds.open.retain(|(id, _)| *id != self.id);
        self.sim.watchers.send_replace(feeds.open.len());
    }
}
