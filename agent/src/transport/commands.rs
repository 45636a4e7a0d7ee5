//! The command consumer: one durable pull consumer per host on `CAPSTAN_CMD`,
//! filtered to `capstan.v1.cmd.<host>`, read one command at a time so that commands
//! run in the order they were published.
//!
//! Ack point: a command is acked after the executor returns, i.e. after its
//! `command_completed` (or `command_rejected`) record is durable — later than the
//! minimum (`command_received` durable) and simpler: whatever happens before the ack
//! (a crash, a lost ack, an outage), the command is redelivered and the executor
//! answers it from the log or finishes it, never carries it out twice. Long commands
//! keep their delivery alive with progress acks. When the log itself cannot be
//! written, the command is not acked but nak'ed with a delay, so it waits in the
//! stream until the agent can record it.

use super::{auth, pause};
use crate::event::Event;
use crate::executor::Executor;
use async_nats::jetstream::{self, consumer::pull, AckKind};
use capstan_common::signing::Policy;
use capstan_common::{wire, CommandResult, ErrorCode};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the server waits for an ack (or a progress ack) before redelivering.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// Test-only fault: after the result is durable and before the ack, say so on stderr
/// and hang, so that a test can SIGKILL the agent at exactly that point.
pub const FAULT_HOLD_BEFORE_ACK: &str = "CAPSTAN_FAULT_HOLD_BEFORE_ACK";

async fn consumer(
    js: &jetstream::Context,
    replicas: usize,
    host: &str,
) -> Result<jetstream::consumer::PullConsumer, String> {
    let stream = capstan_common::nats::cmd_stream(js, replicas)
        .await
        .map_err(|e| format!("{e}: {}", source_text(&e)))?;
    let name = wire::consumer_name(host);
    stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: wire::cmd_subject(host),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: 1,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("cannot get consumer {name}: {e}"))
}

fn source_text(e: &dyn std::error::Error) -> String {
    e.source().map(|s| s.to_string()).unwrap_or_default()
}

/// Reads and carries out commands until `stop`. A command being carried out when
/// `stop` arrives is finished (and acked) first. `replicas`: for the command stream,
/// if this agent is the first to need it.
pub async fn run(
    js: jetstream::Context,
    replicas: usize,
    executor: Arc<Executor>,
    policy: Policy,
    host: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(200);
    'setup: loop {
        let consumer = match consumer(&js, replicas, &host).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "command consumer not ready; retrying");
                if pause(&mut stop, retry).await {
                    return;
                }
                retry = (retry * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        tracing::info!(subject = %wire::cmd_subject(&host), "taking commands");
        retry = Duration::from_millis(200);
        loop {
            // Cancel-safe: nothing has been taken from the server until `fetch`
            // returns, and a delivered but unacked command is redelivered.
            let batch = tokio::select! {
                b = consumer.fetch().max_messages(1).expires(Duration::from_secs(5)).messages() => b,
                _ = stop.changed() => return,
            };
            let mut messages = match batch {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot fetch commands; reconnecting the consumer");
                    if pause(&mut stop, retry).await {
                        return;
                    }
                    continue 'setup;
                }
            };
            loop {
                let next = tokio::select! {
                    m = messages.next() => m,
                    _ = stop.changed() => return,
                };
                match next {
                    None => break,
                    Some(Ok(message)) => handle(&executor, &policy, message).await,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "fetching commands failed");
                        if pause(&mut stop, retry).await {
                            return;
                        }
                        continue 'setup;
                    }
                }
            }
        }
    }
}

/// Admits and carries out one delivered command, then acks it.
async fn handle(executor: &Executor, policy: &Policy, message: jetstream::Message) {
    let text = String::from_utf8_lossy(&message.payload).into_owned();
    if let Ok(info) = message.info() {
        if info.delivered > 1 {
            tracing::info!(
                delivered = info.delivered,
                stream_seq = info.stream_sequence,
                "command redelivered"
            );
        }
    }
    let work = async {
        let known = |id: &str| {
            executor.log().for_command(id).is_ok_and(|records| {
                records
                    .iter()
                    .any(|r| matches!(r.event, Event::CommandReceived { .. }))
            })
        };
        match auth::admit(policy, &text, chrono::Utc::now(), known) {
            Ok(command) => executor.execute(command).await,
            Err((id, rejection)) => executor.reject(id, rejection).await,
        }
    };
    let result = with_progress(&message, work).await;
    if not_recorded(&result) {
        tracing::error!(
            command_id = result.id.as_deref().unwrap_or("-"),
            "the log could not record the command; leaving it in the stream"
        );
        if let Err(e) = message
            .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
            .await
        {
            tracing::warn!(error = %e, "nak failed");
        }
        return;
    }
    if std::env::var_os(FAULT_HOLD_BEFORE_ACK).is_some() {
        eprintln!(
            "FAULT {FAULT_HOLD_BEFORE_ACK}: holding before the ack of {}",
            result.id.as_deref().unwrap_or("-")
        );
        std::future::pending::<()>().await;
    }
    if let Err(e) = message.ack().await {
        // The command is durably in the log: a redelivery is answered from there.
        tracing::warn!(error = %e, "ack failed; the command will be redelivered and answered from the log");
    }
}

/// True when the log did not take the command: do not ack.
fn not_recorded(result: &CommandResult) -> bool {
    result
        .error
        .as_ref()
        .is_some_and(|e| matches!(e.code, ErrorCode::LogFailed | ErrorCode::LogDegraded))
}

/// Runs `work`, sending progress acks so that a long command is not redelivered
/// while it is still being carried out.
async fn with_progress<T>(
    message: &jetstream::Message,
    work: impl std::future::Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(ACK_WAIT / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => {
                if let Err(e) = message.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "progress ack failed");
                }
            }
        }
    }
}
