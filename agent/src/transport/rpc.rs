//! Request/reply on `capstan.v1.rpc.<host>.<verb>`, JSON both ways:
//! - `ping` → `{host, version, at}`;
//! - `status` → `{host, version, last_seq, published_seq, healthy, degraded, log_failed,
//!   outbox_alarm, in_flight, drivers, capabilities}`: `healthy` is false while the log takes no
//!   writes, `degraded` (a bad record) or `log_failed` (a failed flush) says why;
//! - `intent` → the running intent (`capstan-agent intent --json`);
//! - `log` (body `{"since":N,"limit":M,"command","namespace","workload"}`, all
//!   optional) → `{records:[…], last_seq, anchor}` (`anchor`: `null`, or where a prune
//!   cut the log: `{seq, hash, pruned, file}`).
//!
//! Errors are `{"error":{"code","message"}}`.

use super::{pause, HostInfo};
use crate::event::Record;
use crate::executor::Executor;
use crate::log::Log;
use capstan_common::wire::{self, ErrorReply, LogRequest};
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The most records one `log` reply carries.
pub const MAX_LOG_RECORDS: usize = 1000;

/// Answers requests until `stop`. The client re-subscribes after reconnects.
pub async fn run(
    client: async_nats::Client,
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
        if let Err(e) = client.publish(reply, body.to_string().into()).await {
            tracing::debug!(error = %e, "cannot send an RPC reply");
        }
    }
}

/// `{"error":{"code","message"}}`, as every RPC and local-socket error reads.
pub(crate) fn error(code: &str, message: impl Into<String>) -> Value {
    serde_json::to_value(ErrorReply::new(code, message)).expect("error replies serialise")
}

/// The reply to one request.
pub fn answer(
    verb: &str,
    payload: &[u8],
    executor: &Executor,
    info: &HostInfo,
    published: u64,
) -> Value {
    let log = executor.log();
    match verb {
        "ping" => json!({"host": info.host, "version": info.version, "at": chrono::Utc::now()}),
        "status" => {
            let in_flight: Vec<String> =
                log.with_intent(|intent| intent.in_flight.keys().cloned().collect());
            json!({
                "host": info.host,
                "version": info.version,
                "last_seq": log.last_seq(),
                "published_seq": published,
                "healthy": log.healthy(),
                "degraded": log.degraded().map(ToString::to_string),
                "log_failed": log.flush_failed(),
                "outbox_alarm": info.outbox_alarm.get(),
                "in_flight": in_flight,
                "drivers": info.drivers,
                "capabilities": info.capabilities,
                "figures": executor.metrics().figures(log, log.last_seq(), published),
            })
        }
        "intent" => log.intent().to_json(),
        "log" => {
            let request: LogRequest = if payload.iter().all(u8::is_ascii_whitespace) {
                LogRequest::default()
            } else {
                match serde_json::from_slice(payload) {
                    Ok(r) => r,
                    Err(e) => return error("invalid_request", format!("bad log request: {e}")),
                }
            };
            read_log(log, &request)
        }
        other => error(
            "unknown_verb",
            format!(
                "unknown verb {:?}; known: {}",
                other.chars().take(32).collect::<String>(),
                wire::RPC_VERBS.join(", ")
            ),
        ),
    }
}

fn read_log(log: &Log, request: &LogRequest) -> Value {
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
    let out: Vec<Value> = match log.query(&request) {
        Ok(records) => records.iter().map(Record::to_json).collect(),
        Err(e) => return error("log_unreadable", e.to_string()),
    };
    // After a prune the log starts past its anchor: a reader comparing logs (`capstan
    // verify`) starts there too.
    let anchor = match log.anchor() {
        Ok(anchor) => anchor.map(|a| a.summary()),
        Err(e) => return error("log_unreadable", e.to_string()),
    };
    json!({"records": out, "last_seq": log.last_seq(), "anchor": anchor})
}
