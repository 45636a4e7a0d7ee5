//! Request/reply on `capstan.v1.rpc.<host>.<verb>`, JSON both ways:
//! - `ping` → `{host, version, at}`;
//! - `status` → `{host, version, last_seq, published_seq, healthy, degraded, log_failed,
//!   outbox_alarm, in_flight, drivers, capabilities}`: `healthy` is false while the log takes no
//!   writes, `degraded` (a bad record) or `log_failed` (a failed flush) says why;
//! - `intent` → the running intent (`capstan-agent intent --json`);
//! - `log` (body `{"since":N,"limit":M,"command","namespace","workload"}`, all
//!   optional) → `{records:[…], last_seq, anchor}` (`anchor`: `null`, or where a prune
//!   cut the log: `{seq, hash, pruned, file}`): at most [`MAX_LOG_RECORDS`] records and
//!   [`MAX_LOG_BYTES`] of them (but always the first), so that an answer fits in a
//!   NATS message; a reader goes on after the last record it got.
//!
//! Errors are `{"error":{"code","message"}}`. Every answer is signed by the host
//! ([`capstan_common::published`], bound to the request's subject).

use super::{pause, HostInfo};
use crate::event::Record;
use crate::executor::Executor;
use crate::log::{Log, LogError};
use capstan_common::answers::{
    AgentCode, ErrorReply, LogAnswer, LogRequest, PingAnswer, StatusAnswer, Verb,
};
use capstan_common::nats_layout;
use capstan_common::published::{self, Publication};
use capstan_common::signing::Signer;
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The most records one `log` reply carries.
pub const MAX_LOG_RECORDS: usize = 1000;
/// The most bytes of records (their JSON) one `log` reply carries, beyond the first
/// record: below NATS's default `max_payload` (1 MiB) with room for the rest of the
/// answer. (A record is at most a little over `MAX_COMMAND_BYTES` of JSON.)
pub const MAX_LOG_BYTES: usize = 768 * 1024;

/// Answers requests until `stop`. The client re-subscribes after reconnects.
pub async fn run(
    client: async_nats::Client,
    key: Arc<Signer>,
    executor: Arc<Executor>,
    info: HostInfo,
    published: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let subject = format!("capstan.v1.rpc.{}.*", info.host);
    let mut subscription = loop {
        match client.subscribe(subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to RPC; retrying");
                if pause(&mut stop, Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    };
    loop {
        let request = tokio::select! {
            r = subscription.next() => r,
            _ = stop.changed() => return,
        };
        let Some(request) = request else { return };
        let Some(reply) = request.reply.clone() else {
            continue;
        };
        let verb = request.subject.rsplit('.').next().unwrap_or_default();
        let body = answer(
            verb,
            &request.payload,
            &executor,
            &info,
            *published.borrow(),
        );
        let body = body.to_string().into_bytes();
        let mut headers = async_nats::HeaderMap::new();
        // Bound to the request's nonce when it has one (every coordinator of this
        // release sends one): a signed answer cannot be replayed to another request.
        let nonce = request
            .headers
            .as_ref()
            .and_then(|h| h.get(published::NONCE_HEADER))
            .map(|v| v.as_str());
        let what = Publication::Answer {
            subject: request.subject.as_str(),
            nonce: published::nonce_of(nonce),
        };
        headers.insert(
            published::HEADER,
            key.sign_publication(what, &body).as_str(),
        );
        if let Err(e) = client
            .publish_with_headers(reply, headers, body.into())
            .await
        {
            tracing::debug!(error = %e, "cannot send an RPC reply");
        }
    }
}

/// `{"error":{"code","message"}}`, as every RPC and local-socket error reads.
pub(crate) fn error(code: AgentCode, message: impl Into<String>) -> Value {
    to_json(ErrorReply::agent(code, message))
}

/// Any answer as the JSON it is sent as.
pub(crate) fn to_json(answer: impl serde::Serialize) -> Value {
    serde_json::to_value(answer).expect("answers serialise")
}

/// The reply to one request: `verb` one of the RPC's ([`Verb::is_local_only`] ones
/// are the local socket's, [`crate::local_socket`]).
pub fn answer(
    verb: &str,
    payload: &[u8],
    executor: &Executor,
    info: &HostInfo,
    published: u64,
) -> Value {
    let log = executor.log();
    match Verb::parse(verb) {
        Some(Verb::Ping) => to_json(PingAnswer {
            host: info.host.clone(),
            version: info.version.clone(),
            at: chrono::Utc::now(),
        }),
        Some(Verb::Status) => to_json(StatusAnswer {
            host: info.host.clone(),
            version: info.version.clone(),
            last_seq: log.last_seq(),
            published_seq: published,
            healthy: log.healthy(),
            degraded: log.degraded().map(|d| d.to_string()),
            log_failed: log.flush_failed(),
            outbox_alarm: info.outbox_alarm.get(),
            in_flight: log.with_intent(|intent| intent.in_flight.keys().cloned().collect()),
            drivers: info.drivers.clone(),
            capabilities: info.capabilities.clone(),
            figures: Some(executor.metrics().figures(log, log.last_seq(), published)),
        }),
        Some(Verb::Intent) => to_json(log.intent().answer()),
        Some(Verb::Log) => {
            let request: LogRequest = if payload.iter().all(u8::is_ascii_whitespace) {
                LogRequest::default()
            } else {
                match serde_json::from_slice(payload) {
                    Ok(r) => r,
                    Err(e) => {
                        return error(AgentCode::InvalidRequest, format!("bad log request: {e}"))
                    }
                }
            };
            read_log(log, &request)
                .unwrap_or_else(|e| error(AgentCode::LogUnreadable, e.to_string()))
        }
        // The local socket's own verbs are not the RPC's.
        Some(Verb::Verify | Verb::Export | Verb::Layout) | None => error(
            AgentCode::UnknownVerb,
            format!(
                "unknown verb {:?}; known: {}",
                verb.chars().take(32).collect::<String>(),
                nats_layout::RPC_VERBS.join(", ")
            ),
        ),
    }
}

fn read_log(log: &Log, request: &LogRequest) -> Result<Value, LogError> {
    let limit = request
        .limit
        .unwrap_or(MAX_LOG_RECORDS)
        .min(MAX_LOG_RECORDS);
    // One command's, one workload's or a time range's records come from the log's
    // indexes; the rest from a scan after `since`.
    let request = LogRequest {
        limit: Some(limit),
        ..request.clone()
    };
    let records = log.query(&request)?;
    let records = within_bytes(records.iter().map(Record::to_json), MAX_LOG_BYTES);
    // After a prune the log starts past its anchor: a reader comparing logs (`capstan
    // verify`) starts there too.
    let anchor = log.anchor()?.map(|a| a.summary());
    Ok(to_json(LogAnswer {
        records,
        last_seq: log.last_seq(),
        anchor,
    }))
}

/// The first of `records`, and those after it while their JSON stays within `bytes`.
fn within_bytes(records: impl Iterator<Item = Value>, bytes: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut total = 0;
    for record in records {
        let size = record.to_string().len() + 1;
        if !out.is_empty() && total + size > bytes {
            break;
        }
        total += size;
        out.push(record);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_page_stops_before_its_byte_budget_but_keeps_its_first_record() {
        let record = |n: usize| json!({"seq": n, "pad": "x".repeat(100)});
        let size = record(1).to_string().len() + 1;
        let page = within_bytes((1..=10).map(record), 3 * size);
        assert_eq!(page.len(), 3);
        let page = within_bytes((1..=10).map(record), size - 1);
        assert_eq!(page.len(), 1, "the first record goes alone however large");
        assert!(within_bytes(std::iter::empty(), 10).is_empty());
    }
}
