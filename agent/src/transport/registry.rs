//! The host registry: every [`nats_layout::HEARTBEAT_SECS`] (and within [`FRESH`] of its log
//! growing) the agent puts a [`HostBeat`] under its host name in the `capstan_hosts`
//! bucket. The bucket's max age removes the entries of hosts that stopped beating.

use super::{pause, HostInfo, Link};
use crate::executor::Executor;
use capstan_common::answers::HostBeat;
use capstan_common::nats::Retention;
use capstan_common::nats_layout;
use capstan_common::published::Publication;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How soon a beat follows new log records (so `last_seq` stays fresh).
pub const FRESH: Duration = Duration::from_millis(250);

/// Beats until `stop`. Failures are logged when they start and when they end. Each
/// beat is a signed put of `$KV.capstan_hosts.<host>`. Without per-host accounts the
/// bucket is made first if no coordinator has made it yet; on them the host may not
/// read the bucket (its info names every host) and only puts.
pub(crate) async fn run(
    link: Link,
    executor: Arc<Executor>,
    info: HostInfo,
    published: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let log = executor.log();
    let mut bucket = link.host_accounts.then_some(());
    let mut failing = false;
    let mut appended = log.subscribe();
    let subject = format!("$KV.{}.{}", nats_layout::HOSTS_BUCKET, info.host);
    loop {
        if bucket.is_none() {
            match capstan_common::nats::bucket(
                &link.js,
                nats_layout::HOSTS_BUCKET,
                Retention::default().hosts_max_age,
                link.replicas,
            )
            .await
            {
                Ok(_) => bucket = Some(()),
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "host registry not reachable");
                }
                Err(_) => {}
            }
        }
        // The seq the beat reported, when one was sent.
        let mut sent = None;
        if bucket.is_some() {
            let sent_seq = *appended.borrow_and_update();
            sent = Some(sent_seq);
            let beat = beat(&info, &executor, sent_seq, *published.borrow());
            let body = serde_json::to_vec(&beat).expect("beats serialise");
            let put = async {
                link.publish_signed(subject.clone(), Publication::Beat, body)
                    .await?
                    .await
            };
            match put.await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("host registry heartbeat resumed");
                }
                Ok(_) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "host registry heartbeat failed");
                }
                Err(_) => {}
            }
        }
        // The next beat: when the period is up, or FRESH after the log grows past what
        // the last beat reported (so a burst of records costs one beat).
        let due = tokio::time::Instant::now() + Duration::from_secs(nats_layout::HEARTBEAT_SECS);
        let grew = async {
            match sent {
                Some(s) => drop(appended.wait_for(|seq| *seq != s).await),
                None => std::future::pending().await,
            }
        };
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = grew => {
                if pause(&mut stop, FRESH).await {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// This host's entry: what it runs, how far its log is, whether the log takes
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
