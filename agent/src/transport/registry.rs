//! The heartbeat: the agent publishes a signed [`HostBeat`] on its core subject
//! `capstan.v1.beat.<host>` once a pace, and soon after its log grows. Every
//! coordinator hears it and keeps it in memory; nothing is stored in NATS and the
//! host owns nothing there. The pace is the fleet's: a coordinator says it in each
//! sync answer (`beat_secs`, larger in larger fleets so that the fleet's beats a
//! second stay bounded); until one does, and on the shared account, it is
//! [`nats_layout::HEARTBEAT_SECS`].
//!
//! On per-host accounts each beat is followed by a probe of the connection
//! ([`probe`]): a connection gone silent — a partition: no reset, no FIN, packets
//! just lost — is replaced once a probe goes unanswered for [`SILENT_AFTER`], and the
//! client's own pings are only a backstop ([`BACKSTOP_PING`]). A client pinging every
//! 5 s was 2,000 PINGs and 2,000 PONGs a second for 10,000 hosts, most of an idle
//! fleet's messages; a probe a beat is one round trip a pace (20 s at that size).

use super::{pause, HostInfo, Link};
use crate::executor::Executor;
use capstan_common::answers::HostBeat;
use capstan_common::nats_layout;
use capstan_common::published::Publication;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How soon a beat follows new log records (so `last_seq` stays fresh), at the
/// fastest; beats are at least [`FRESH_SHARE`] of the pace apart all the same.
pub const FRESH: Duration = Duration::from_millis(250);
/// Beats for new records are at least this part of the pace apart, so that the
/// fleet's beats a second stay within this many times the pace's during a rollout.
pub const FRESH_SHARE: u32 = 4;

/// How long a probe may go unanswered before the connection is taken for silent and
/// replaced: as long as async-nats' own pings allowed (two unanswered, 5 s apart).
pub const SILENT_AFTER: Duration = Duration::from_secs(10);
/// How often the client pings while it hears nothing, where the beats' probes check
/// the connection: async-nats' default.
pub const BACKSTOP_PING: Duration = Duration::from_secs(60);

/// Beats until `stop`. Failures are logged when they start and when they end.
pub(crate) async fn run(
    link: Link,
    executor: Arc<Executor>,
    info: HostInfo,
    published: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let log = executor.log();
    let mut pace = link.pace.subscribe();
    let mut failing = false;
    let mut appended = log.subscribe();
    let subject = nats_layout::beat_subject(&info.host);
    let probe_subject = nats_layout::probe_subject(&info.host);
    let mut jitter = Jitter::new();
    let client = link.js.client();
    loop {
        let sent_seq = *appended.borrow_and_update();
        let beat = beat(&info, &executor, sent_seq, *published.borrow());
        let body = serde_json::to_vec(&beat).expect("beats serialise");
        let headers = link.sign(async_nats::HeaderMap::new(), Publication::Beat, &body);
        match client
            .publish_with_headers(subject.clone(), headers, body.into())
            .await
        {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("heartbeat resumed");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "heartbeat failed");
            }
            Err(_) => {}
        }
        let sent_at = tokio::time::Instant::now();
        if link.host_accounts && !failing {
            tokio::select! {
                silent = probe(&client, &probe_subject, SILENT_AFTER) => if silent {
                    replace(&client).await;
                },
                _ = stop.changed() => return,
            }
        }
        // The next beat: when the pace is up (spread by a tenth either way, so that
        // hosts started together do not beat together), or soon after the log grows
        // past what this beat reported (a burst of records costs one beat).
        let period = *pace.borrow_and_update();
        let due = sent_at + jitter.spread(period);
        let grew = async { drop(appended.wait_for(|seq| *seq != sent_seq).await) };
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = grew => {
                let soonest = (sent_at + period / FRESH_SHARE).max(tokio::time::Instant::now() + FRESH);
                if pause(&mut stop, soonest.min(due) - tokio::time::Instant::now()).await {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Whether the connection is silent: a request to `subject` — which nothing answers,
/// so the server says at once that nobody listens — got no answer at all within
/// `within`. A connection that is down is not silent (the client is reconnecting).
pub async fn probe(client: &async_nats::Client, subject: &str, within: Duration) -> bool {
    use async_nats::RequestErrorKind;
    let request = async_nats::Request::new().timeout(Some(within));
    match tokio::time::timeout(within, client.send_request(subject.to_string(), request)).await {
        Err(_) => true,
        Ok(Err(e)) => e.kind() == RequestErrorKind::TimedOut,
        Ok(Ok(_)) => false,
    }
}

/// Replaces a silent connection (the reconnect loop takes a new one as soon as the
/// network lets it).
pub(super) async fn replace(client: &async_nats::Client) {
    tracing::warn!(
        after = ?SILENT_AFTER,
        "the NATS connection is silent (a probe went unanswered): replacing it"
    );
    match tokio::time::timeout(SILENT_AFTER, client.force_reconnect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "the reconnect was not taken"),
        Err(_) => tracing::debug!("the reconnect was not taken in time"),
    }
}

/// This host's beat: what it runs, how far its log is, whether the log takes
/// writes, and its key figures (`published`: the outbox's acknowledged seq).
pub fn beat(info: &HostInfo, executor: &Executor, last_seq: u64, published: u64) -> HostBeat {
    let log = executor.log();
    HostBeat {
        host: info.host.clone(),
        version: info.version.clone(),
        drivers: info.drivers.clone(),
        capabilities: info.capabilities.clone(),
        last_seq,
        healthy: log.healthy(),
        degraded: log.degraded().map(ToString::to_string),
        log_failed: log.flush_failed(),
        outbox_alarm: info.outbox_alarm.get(),
        figures: Some(executor.metrics().figures(log, last_seq, published)),
        at: chrono::Utc::now(),
    }
}

/// A cheap random spread of each period (xorshift, seeded at random).
struct Jitter(u64);

impl Jitter {
    fn new() -> Jitter {
        let mut seed = [0u8; 8];
        // A fixed seed only makes hosts beat in step: never a reason to fail.
        let _ = getrandom::getrandom(&mut seed);
        Jitter(u64::from_le_bytes(seed) | 1)
    }

    /// `period` give or take a tenth.
    fn spread(&mut self, period: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let tenth = period / 10;
        let nanos = tenth.as_nanos().max(1) as u64 * 2;
        period - tenth + Duration::from_nanos(self.0 % nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Given a pace, when periods are spread, then each is within a tenth of it and
    /// they differ (hosts started together drift apart).
    #[test]
    fn a_spread_period_stays_within_a_tenth_of_the_pace() {
        let mut jitter = Jitter::new();
        let pace = Duration::from_secs(20);
        let periods: Vec<Duration> = (0..100).map(|_| jitter.spread(pace)).collect();
        for p in &periods {
            assert!(
                *p >= Duration::from_secs(18) && *p < Duration::from_secs(22),
                "{p:?}"
            );
        }
        let distinct: std::collections::BTreeSet<_> = periods.iter().collect();
        assert!(distinct.len() > 50, "{distinct:?}");
    }
}
