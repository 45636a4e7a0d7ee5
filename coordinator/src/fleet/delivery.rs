//! The coordinators' side of delivery (`docs/nats.md`, *Delivery*): on per-host
//! accounts a host may not read the command stream (it holds every host's commands),
//! so it asks on `capstan.v1.sync.<host>` and every coordinator, in one queue group,
//! answers from the stream with that host's commands after the position it gives.
//! The host is the one the subject names — on per-host accounts only that host can
//! publish there (the subject is exported to its account alone) — never one the
//! request's body names. The answer adds no trust: the agent checks each command's
//! signature as it checks every command. A command the host's results already show
//! final is handed as finished, not to be carried out again (a host whose data dir
//! was restored from an older copy). Each answer says the fleet's heartbeat pace
//! (`beat_secs`, [`super::liveness`]).

use super::{check_host, Fleet, FleetError};
use capstan_common::nats::{self as cnats, SyncAnswer, SyncRequest};
use capstan_common::nats_layout;
use futures::StreamExt as _;
use std::collections::HashMap;
use std::sync::Mutex;

/// How many sync requests one coordinator answers at once.
const CONCURRENT: usize = 64;

/// How many sync requests of one host a coordinator works on at once. An agent asks
/// one at a time; more (whoever holds the host's credentials, flooding) are answered
/// [`BUSY`] at once, without reading the stream, so that one host's flood cannot take
/// the [`CONCURRENT`] places every host's requests share.
pub const PER_HOST: usize = 2;

/// The `error` of a sync answer refused for [`PER_HOST`].
pub const BUSY: &str = "busy: this host's earlier sync requests are still being answered";

/// Sync requests being worked on, by host.
#[derive(Default)]
struct InFlight(Mutex<HashMap<String, usize>>);

impl InFlight {
    /// A place for one more request of `host`, if it has fewer than [`PER_HOST`].
    fn take<'a>(&'a self, host: &str) -> Option<Place<'a>> {
        let mut hosts = self.0.lock().expect("in-flight counts");
        let n = hosts.entry(host.to_string()).or_default();
        if *n >= PER_HOST {
            return None;
        }
        *n += 1;
        Some(Place {
            of: self,
            host: host.to_string(),
        })
    }
}

/// One request's place in [`InFlight`], given back when dropped.
struct Place<'a> {
    of: &'a InFlight,
    host: String,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut hosts = self.of.0.lock().expect("in-flight counts");
        if let Some(n) = hosts.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                hosts.remove(&self.host);
            }
        }
    }
}

impl Fleet {
    /// Answers hosts' sync requests for as long as the process runs, subscribing
    /// again (with a pause) whenever NATS or the stream is not there.
    pub async fn serve_sync(&self) {
        super::forever("sync requests", || self.serve_sync_once(), || {}).await
    }

    async fn serve_sync_once(&self) -> Result<(), FleetError> {
        let stream = self.layout().await?.commands_stream.clone();
        let requests = self
            .client
            .queue_subscribe(
                nats_layout::sync_subject("*"),
                nats_layout::SYNC_QUEUE.to_string(),
            )
            .await
            .map_err(FleetError::nats)?;
        tracing::info!(subject = %nats_layout::sync_subject("*"), "answering sync requests");
        let in_flight = InFlight::default();
        let prefix = nats_layout::sync_subject("");
        requests
            .for_each_concurrent(CONCURRENT, |request| {
                let stream = stream.clone();
                let client = self.client.clone();
                let (in_flight, prefix) = (&in_flight, &prefix);
                async move {
                    let Some(reply) = request.reply else { return };
                    let host = request
                        .subject
                        .strip_prefix(prefix.as_str())
                        .unwrap_or_default();
                    let mut answer = match in_flight.take(host) {
                        Some(_place) => self.answer(&stream, host, &request.payload).await,
                        None => SyncAnswer {
                            error: Some(BUSY.to_string()),
                            ..SyncAnswer::default()
                        },
                    };
                    answer.beat_secs = Some(self.pace().beat_secs);
                    let body = serde_json::to_vec(&answer).expect("sync answers serialise");
                    if let Err(e) = client.publish(reply, body.into()).await {
                        tracing::debug!(error = %e, "a sync answer was not sent");
                    }
                }
            })
            .await;
        Ok(())
    }

    /// The answer to one request of `host` (its subject's last token).
    async fn answer(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        host: &str,
        payload: &[u8],
    ) -> SyncAnswer {
        let refused = |error: String| SyncAnswer {
            error: Some(error),
            ..SyncAnswer::default()
        };
        if let Err(e) = check_host(host) {
            return refused(e.to_string());
        }
        let request: SyncRequest = match serde_json::from_slice(payload) {
            Ok(r) => r,
            Err(e) => return refused(format!("not a sync request: {e}")),
        };
        let results = match self.stores.of(host).await {
            Ok(storage) => storage.results,
            Err(e) => return refused(e.to_string()),
        };
        match cnats::commands_after(stream, &results, host, request.after, request.max).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(host, error = %capstan_common::report(&e), "cannot read a host's commands");
                refused(capstan_common::report(&e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_gets_at_most_per_host_places_and_gets_them_back() {
        let in_flight = InFlight::default();
        let first: Vec<_> = (0..PER_HOST).filter_map(|_| in_flight.take("h1")).collect();
        assert_eq!(first.len(), PER_HOST);
        assert!(in_flight.take("h1").is_none(), "h1 is at its bound");
        let other = in_flight.take("h2");
        assert!(other.is_some(), "another host is not");
        drop(first);
        assert!(in_flight.take("h1").is_some(), "given back");
        drop(other);
        assert!(
            in_flight.0.lock().unwrap().is_empty(),
            "nothing left behind"
        );
    }
}
