//! Prometheus text metrics for `/metrics`: request counters counted in process (per
//! coordinator), and fleet gauges read from the host registry at scrape time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How many hosts are in each state, read from the registry when scraped: counts only,
/// no host names (`/metrics` needs no token).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FleetGauges {
    pub alive: usize,
    pub stale: usize,
    pub gone: usize,
    /// Hosts whose beat is not signed by a key registered for them.
    pub unverified: usize,
    /// Hosts whose last beat says their log takes no writes (`healthy: false`: a
    /// degraded log or a failed flush): they refuse every command.
    pub unhealthy: usize,
}

impl FleetGauges {
    pub fn count(hosts: &[crate::fleet::HostStatus]) -> FleetGauges {
        let mut g = FleetGauges::default();
        for h in hosts {
            match h.status {
                "alive" => g.alive += 1,
                "stale" => g.stale += 1,
                "unverified" => g.unverified += 1,
                _ => g.gone += 1,
            }
            if h.beat.as_ref().is_some_and(|b| !b.healthy) {
                g.unhealthy += 1;
            }
        }
        g
    }
}

#[derive(Default)]
pub struct Metrics {
    submitted: AtomicU64,
    requests: Mutex<BTreeMap<u16, u64>>,
}

impl Metrics {
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
    /// (then the fleet gauges are left out rather than reported as zero).
    pub fn render(&self, nats_connected: bool, fleet: Option<FleetGauges>) -> String {
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
        if let Some(f) = fleet {
            out.push_str("# HELP capstan_coordinator_hosts Hosts by registry status.\n");
            out.push_str("# TYPE capstan_coordinator_hosts gauge\n");
            for (status, n) in [
                ("alive", f.alive),
                ("stale", f.stale),
                ("gone", f.gone),
                ("unverified", f.unverified),
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
