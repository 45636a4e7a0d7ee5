//! Prometheus text metrics for `/metrics`, counted in process (per coordinator).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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

    pub fn render(&self, nats_connected: bool) -> String {
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
        out
    }
}
