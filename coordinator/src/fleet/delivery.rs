//! The coordinators' side of delivery (`docs/nats.md`, *Delivery*): on per-host
//! accounts a host may not read the command stream (it holds every host's commands),
//! so it asks on `capstan.v1.sync.<host>` and every coordinator, in one queue group,
//! answers from the stream with that host's commands after the position it gives.
//! The host is the one the subject names — on per-host accounts only that host can
//! publish there (the subject is exported to its account alone) — never one the
//! request's body names. The answer adds no trust: the agent checks each command's
//! signature as it checks every command. A command the host's results already show
//! final is handed as finished, not to be carried out again (a host whose data dir
//! was restored from an older copy).

use super::{check_host, Fleet, FleetError};
use capstan_common::nats::{self as cnats, SyncAnswer, SyncRequest};
use capstan_common::nats_layout;
use futures::StreamExt as _;
use std::time::Duration;

/// How many sync requests one coordinator answers at once.
const CONCURRENT: usize = 64;

impl Fleet {
    /// Answers hosts' sync requests for as long as the process runs, subscribing
    /// again (with a pause) whenever NATS or the stream is not there.
    pub async fn serve_sync(&self) {
        let mut retry = Duration::from_millis(200);
        loop {
            match self.serve_sync_once().await {
                Ok(()) => tracing::warn!("the sync subscription ended; subscribing again"),
                Err(e) => {
                    tracing::warn!(error = %capstan_common::report(&e), "cannot answer sync requests yet; retrying")
                }
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(5));
        }
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
        requests
            .for_each_concurrent(CONCURRENT, |request| {
                let stream = stream.clone();
                let client = self.client.clone();
                async move {
                    let Some(reply) = request.reply else { return };
                    let answer = self
                        .answer(&stream, &request.subject, &request.payload)
                        .await;
                    let body = serde_json::to_vec(&answer).expect("sync answers serialise");
                    if let Err(e) = client.publish(reply, body.into()).await {
                        tracing::debug!(error = %e, "a sync answer was not sent");
                    }
                }
            })
            .await;
        Ok(())
    }

    /// The answer to one request on `subject`.
    async fn answer(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        subject: &str,
        payload: &[u8],
    ) -> SyncAnswer {
        let refused = |error: String| SyncAnswer {
            error: Some(error),
            ..SyncAnswer::default()
        };
        let prefix = nats_layout::sync_subject("");
        let host = subject.strip_prefix(prefix.as_str()).unwrap_or_default();
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
