//! What the API refuses before doing any work: requests for another host name on a
//! coordinator without tokens (DNS rebinding), and requests beyond the bounds on
//! what each kind may hold at once (waits, stream reads).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Whether a request's `Host` (`name[:port]`) names this machine's loopback, so no
/// other site can have sent it through a browser: `localhost` (any case), an IPv4
/// address in `127.0.0.0/8` or `[::1]`, each with an optional port. A DNS-rebinding
/// page always sends the name it was loaded from, which resolves elsewhere first.
/// Anything else — other names, `localhost.`, `*.localhost`, IPv4-mapped addresses,
/// a port that is not 1–5 digits — is not.
pub fn is_loopback_host(host: &str) -> bool {
    let port_ok = |p: &str| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        let after_ok = after.is_empty() || after.strip_prefix(':').is_some_and(port_ok);
        return after_ok && inside.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    }
    let name = match host.split_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return false,
        None => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// The bounds on requests that hold resources while they run (`max_waits`,
/// `max_stream_reads` in the config). A request takes a permit for its whole run,
/// or is refused at once when none is left.
pub struct Limits {
    waits: Arc<Semaphore>,
    stream_reads: Arc<Semaphore>,
}

/// Which bound a refused request hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `GET /v1/commands/{id}/wait`: a NATS subscription for up to 5 minutes each.
    Waits,
    /// Requests that read `CAPSTAN_EVT` through a consumer of their own.
    StreamReads,
}

impl Bound {
    /// The config key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Bound::Waits => "max_waits",
            Bound::StreamReads => "max_stream_reads",
        }
    }
}

impl Limits {
    pub fn new(max_waits: usize, max_stream_reads: usize) -> Limits {
        Limits {
            waits: Arc::new(Semaphore::new(max_waits)),
            stream_reads: Arc::new(Semaphore::new(max_stream_reads)),
        }
    }

    /// A permit of `bound`, held until dropped; `None` when all are taken.
    pub fn try_take(&self, bound: Bound) -> Option<OwnedSemaphorePermit> {
        let semaphore = match bound {
            Bound::Waits => &self.waits,
            Bound::StreamReads => &self.stream_reads,
        };
        Arc::clone(semaphore).try_acquire_owned().ok()
    }

    /// How many permits of `bound` are free now.
    pub fn available(&self, bound: Bound) -> usize {
        match bound {
            Bound::Waits => self.waits.available_permits(),
            Bound::StreamReads => self.stream_reads.available_permits(),
        }
    }
}

impl Default for Limits {
    /// The config's defaults: 1024 waits, 64 stream reads.
    fn default() -> Limits {
        Limits::new(1024, 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_and_addresses_are_loopback_hosts() {
        for ok in [
            "localhost",
            "LocalHost:7400",
            "127.0.0.1",
            "127.0.0.1:7400",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:7400",
            "[0:0:0:0:0:0:0:1]:80",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:7400",
            "localhost.",
            "localhost.evil.example",
            "app.localhost",
            "127.0.0.1.nip.io",
            "10.0.0.5:7400",
            "0.0.0.0:7400",
            "[::]:7400",
            "[::ffff:127.0.0.1]:7400",
            "::1",
            "[::1",
            "[::1]7400",
            "localhost:",
            "localhost:123456",
            "localhost:80:80",
            "localhost:x",
            "127.0.0.1 :80",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn a_bound_refuses_once_its_permits_are_taken_and_frees_them_when_dropped() {
        let limits = Limits::new(2, 1);
        let held: Vec<_> = (0..2)
            .map(|_| limits.try_take(Bound::Waits).expect("a permit"))
            .collect();
        assert!(limits.try_take(Bound::Waits).is_none());
        assert_eq!(limits.available(Bound::Waits), 0);
        let read = limits
            .try_take(Bound::StreamReads)
            .expect("the other bound is its own");
        assert!(limits.try_take(Bound::StreamReads).is_none());
        drop(held);
        drop(read);
        assert_eq!(limits.available(Bound::Waits), 2);
        assert!(limits.try_take(Bound::StreamReads).is_some());
        assert_eq!(
            (Bound::Waits.key(), Bound::StreamReads.key()),
            ("max_waits", "max_stream_reads")
        );
    }
}
