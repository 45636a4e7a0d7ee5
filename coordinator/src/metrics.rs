//! Prometheus text metrics for `/metrics`: request and beat counters counted in
//! process (per coordinator), and fleet gauges counted from the coordinator's memory
//! of beats at most once per [`FLEET_INTERVAL`] ([`FleetCache`]): `/metrics` needs no
//! token, and a count lists every host (and, on the shared account, reads the event
//! stream's subjects).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long fleet gauges read from the registry are served before the next scrape
/// reads again.
pub const FLEET_INTERVAL: Duration = Duration::from_secs(5);

/// How many hosts are in each state, read from the registry when scraped: counts only,
/// no host names (`/metrics` needs no token).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FleetGauges {
    pub alive: usize,
    pub stale: usize,
    pub gone: usize,
    /// Hosts whose beat is not signed by a key registered for them.
    pub unverified: usize,
    /// Hosts not heard yet by a coordinator warming up.
    pub warming: usize,
    /// Hosts whose last beat says their log takes no writes (`healthy: false`: a
    /// degraded log or a failed flush): they refuse every command.
    pub unhealthy: usize,
}

impl FleetGauges {
    pub fn count(hosts: &[crate::fleet::HostStatus]) -> FleetGauges {
        use crate::answers::HostState;
        let mut g = FleetGauges::default();
        for h in hosts {
            match h.status {
                HostState::Alive => g.alive += 1,
                HostState::Stale => g.stale += 1,
                HostState::Unverified => g.unverified += 1,
                HostState::Gone => g.gone += 1,
                HostState::Warming => g.warming += 1,
            }
            if h.beat.as_ref().is_some_and(|b| !b.healthy) {
                g.unhealthy += 1;
            }
        }
        g
    }
}

/// The fleet gauges of the last registry read, served until they are
/// [`FleetCache::interval`] old. One read at a time: scrapes that arrive while one
/// reads wait for it and share what it read (a failed read too, so a registry that
/// cannot be read costs one attempt per interval).
pub struct FleetCache {
    interval: Duration,
    /// When the last read began, and what it gave (`None`: the registry could not
    /// be read). The lock is held across a read.
    last: tokio::sync::Mutex<Option<(Instant, Option<FleetGauges>)>>,
    reads: AtomicU64,
}

/// Whether a read begun at `at` still serves a scrape at `now`.
fn fresh(at: Instant, now: Instant, interval: Duration) -> bool {
    now.saturating_duration_since(at) < interval
}

impl FleetCache {
    pub fn new(interval: Duration) -> FleetCache {
        FleetCache {
            interval,
            last: tokio::sync::Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The gauges for a scrape at `now`: the last read's while fresh, else `read`'s,
    /// awaited while other scrapes wait for it. A scrape that goes away mid-read
    /// leaves nothing behind: the next one reads.
    pub async fn get<F, R>(&self, now: Instant, read: F) -> Option<FleetGauges>
    where
        F: FnOnce() -> R,
        R: Future<Output = Option<FleetGauges>>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, gauges)) = *last {
            if fresh(at, now, self.interval) {
                return gauges;
            }
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let gauges = read().await;
        *last = Some((now, gauges));
        gauges
    }

    /// How many times the registry was read.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

pub struct Metrics {
    submitted: AtomicU64,
    requests: Mutex<BTreeMap<u16, u64>>,
    /// The fleet gauges, read at most once per interval.
    pub fleet: FleetCache,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::with_fleet_interval(FLEET_INTERVAL)
    }
}

impl Metrics {
    pub fn with_fleet_interval(interval: Duration) -> Metrics {
        Metrics {
            submitted: AtomicU64::new(0),
            requests: Mutex::default(),
            fleet: FleetCache::new(interval),
        }
    }

    pub fn submitted(&self) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request(&self, status: u16) {
        *self
            .requests
            .lock()
            .expect("metrics lock")
            .entry(status)
            .or_default() += 1;
    }

    /// The text exposition; `fleet` is `None` when the registry could not be read
    /// (then the fleet gauges are left out rather than reported as zero); `beats`:
    /// how many beats ended as each outcome (`Fleet::beat_receipts`).
    pub fn render(
        &self,
        nats_connected: bool,
        fleet: Option<FleetGauges>,
        beats: &[(&str, u64)],
    ) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP capstan_coordinator_commands_submitted_total Commands signed and published.\n",
        );
        out.push_str("# TYPE capstan_coordinator_commands_submitted_total counter\n");
        out.push_str(&format!(
            "capstan_coordinator_commands_submitted_total {}\n",
            self.submitted.load(Ordering::Relaxed)
        ));
        out.push_str("# HELP capstan_coordinator_http_requests_total HTTP requests by status.\n");
        out.push_str("# TYPE capstan_coordinator_http_requests_total counter\n");
        for (status, n) in self.requests.lock().expect("metrics lock").iter() {
            out.push_str(&format!(
                "capstan_coordinator_http_requests_total{{status=\"{status}\"}} {n}\n"
            ));
        }
        out.push_str("# HELP capstan_coordinator_nats_connected 1 when connected to NATS.\n");
        out.push_str("# TYPE capstan_coordinator_nats_connected gauge\n");
        out.push_str(&format!(
            "capstan_coordinator_nats_connected {}\n",
            u8::from(nats_connected)
        ));
        out.push_str(
            "# HELP capstan_coordinator_beats_total Heartbeats heard, by what became of them.\n",
        );
        out.push_str("# TYPE capstan_coordinator_beats_total counter\n");
        for (outcome, n) in beats {
            out.push_str(&format!(
                "capstan_coordinator_beats_total{{outcome=\"{outcome}\"}} {n}\n"
            ));
        }
        if let Some(f) = fleet {
            out.push_str("# HELP capstan_coordinator_hosts Hosts by registry status.\n");
            out.push_str("# TYPE capstan_coordinator_hosts gauge\n");
            for (status, n) in [
                ("alive", f.alive),
                ("stale", f.stale),
                ("gone", f.gone),
                ("unverified", f.unverified),
                ("warming", f.warming),
            ] {
                out.push_str(&format!(
                    "capstan_coordinator_hosts{{status=\"{status}\"}} {n}\n"
                ));
            }
            out.push_str(
                "# HELP capstan_coordinator_hosts_unhealthy Hosts whose log takes no writes.\n",
            );
            out.push_str("# TYPE capstan_coordinator_hosts_unhealthy gauge\n");
            out.push_str(&format!(
                "capstan_coordinator_hosts_unhealthy {}\n",
                f.unhealthy
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn gauges(alive: usize) -> Option<FleetGauges> {
        Some(FleetGauges {
            alive,
            ..FleetGauges::default()
        })
    }

    /// Given 50 scrapes at once, when the registry read is slow, then it is read once
    /// and every scrape gets its figures.
    #[tokio::test]
    async fn concurrent_scrapes_share_one_registry_read() {
        let cache = Arc::new(FleetCache::new(FLEET_INTERVAL));
        let now = Instant::now();
        let (release, released) = tokio::sync::watch::channel(false);
        let scrapes: Vec<_> = (0..50)
            .map(|_| {
                let (cache, mut released) = (Arc::clone(&cache), released.clone());
                tokio::spawn(async move {
                    cache
                        .get(now, || async move {
                            let _ = released.wait_for(|r| *r).await;
                            gauges(3)
                        })
                        .await
                })
            })
            .collect();
        // Every scrape is either reading or queued behind the read.
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        for scrape in scrapes {
            assert_eq!(scrape.await.unwrap(), gauges(3));
        }
        assert_eq!(cache.reads(), 1);
    }

    /// Given figures read at `t`, when scraped before and after the interval, then
    /// the first are served until the interval has passed, a failed read is served
    /// as none for an interval too, and the next read's figures replace them.
    #[tokio::test]
    async fn figures_are_served_for_the_interval_then_read_again() {
        let cache = FleetCache::new(Duration::from_secs(5));
        let t = Instant::now();
        assert_eq!(cache.get(t, || async { gauges(1) }).await, gauges(1));
        let just_before = t + Duration::from_millis(4999);
        assert_eq!(
            cache.get(just_before, || async { gauges(2) }).await,
            gauges(1)
        );
        assert_eq!(cache.reads(), 1);
        let after = t + Duration::from_secs(5);
        assert_eq!(cache.get(after, || async { None }).await, None);
        assert_eq!(
            cache.get(after, || async { gauges(9) }).await,
            None,
            "a failed read is kept too"
        );
        let later = after + Duration::from_secs(5);
        assert_eq!(cache.get(later, || async { gauges(2) }).await, gauges(2));
        assert_eq!(cache.reads(), 3);
        // A clock that steps back never makes the figures older.
        assert_eq!(cache.get(t, || async { gauges(7) }).await, gauges(2));
    }
}
