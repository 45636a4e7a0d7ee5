//! The command consumer: one durable pull consumer per host on `CAPSTAN_CMD`,
//! filtered to `capstan.v1.cmd.<host>`, with up to `commands_in_flight` commands
//! delivered and not yet acked.
//!
//! Order: commands for one namespace run one after another in the order they were
//! published; commands for different namespaces run concurrently ([`lanes`]). A slow
//! hook in namespace A does not delay namespace B.
//!
//! Ack point: a command is acked after the executor returns, i.e. after its
//! `command_completed` (or `command_rejected`) record is durable — whatever happens
//! before the ack (a crash, a lost ack, an outage), the command is redelivered and the
//! executor answers it from the log or finishes it, never carries it out twice. A
//! command delivered and waiting behind its namespace's earlier ones, or being carried
//! out, keeps its delivery alive with progress acks.
//!
//! Order across a restart: JetStream redelivers an unacked command only after its
//! ack wait, so a new process could be handed a namespace's later command before an
//! earlier one that the last process held. So each process starts by deleting and
//! re-creating the consumer: in a work-queue stream the messages still there are
//! exactly the unacked ones, and a fresh consumer delivers them in stream order.
//!
//! When the log cannot record a command, the command's lane retries it (with a
//! pause) instead of handing it back, so nothing later in its namespace overtakes it.

use super::{auth, pause, Link};
use crate::executor::Executor;
use async_nats::jetstream::{self, consumer::pull, AckKind};
use capstan_common::signing::Policy;
use capstan_common::{nats_layout, CommandResult, ErrorCode};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

mod lanes;
use lanes::{Lanes, Turn};

/// How long the server waits for an ack (or a progress ack) before redelivering.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// The default of `commands_in_flight` (agent.toml).
pub const DEFAULT_IN_FLIGHT: usize = 32;
/// The most `commands_in_flight` may be.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Test-only fault (feature `testing`): after the result is durable and before the
/// ack, say so on stderr and hang, so that a test can SIGKILL the agent at exactly
/// that point.
#[cfg(feature = "testing")]
pub const FAULT_HOLD_BEFORE_ACK: &str = "CAPSTAN_FAULT_HOLD_BEFORE_ACK";

/// [`FAULT_HOLD_BEFORE_ACK`], when set: says so and never returns.
#[cfg(feature = "testing")]
async fn hold_before_ack(result: &CommandResult) {
    if std::env::var_os(FAULT_HOLD_BEFORE_ACK).is_some() {
        eprintln!(
            "FAULT {FAULT_HOLD_BEFORE_ACK}: holding before the ack of {}",
            result.id.as_deref().unwrap_or("-")
        );
        std::future::pending::<()>().await;
    }
}

/// A release build has no fault to inject.
#[cfg(not(feature = "testing"))]
async fn hold_before_ack(_: &CommandResult) {}

/// Gets the host's consumer; with `fresh`, deletes it first (see the module doc).
/// On per-host accounts the stream is taken without reading its info: the host may
/// not read the fleet's command stream (its info lists every host's subject).
async fn consumer(
    link: &Link,
    host: &str,
    in_flight: usize,
    fresh: bool,
) -> Result<jetstream::consumer::PullConsumer, String> {
    if !link.host_accounts {
        capstan_common::nats::cmd_stream(&link.js, link.replicas)
            .await
            .map_err(|e| capstan_common::report(&e))?;
    }
    let stream = link
        .js
        .get_stream_no_info(nats_layout::CMD_STREAM)
        .await
        .map_err(|e| format!("cannot reach {}: {e}", nats_layout::CMD_STREAM))?;
    let name = nats_layout::consumer_name(host);
    if fresh {
        match stream.delete_consumer(&name).await {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => {
                // Deleting is how a restart keeps each namespace in order: without it,
                // commands are not taken (the shipped permissions allow it).
                return Err(format!(
                    "cannot re-create consumer {name} (needs $JS.API.CONSUMER.DELETE.{}.{name}): {e}",
                    nats_layout::CMD_STREAM
                ));
            }
        }
    }
    stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: nats_layout::cmd_subject(host),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: i64::try_from(in_flight).unwrap_or(1),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("cannot get consumer {name}: {e}"))
}

fn not_found(e: &jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), jetstream::stream::ConsumerErrorKind::JetStream(e)
        if e.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND)
}

/// What a lane needs to carry out a command.
struct Handler {
    executor: Arc<Executor>,
    policy: Policy,
    stop: watch::Receiver<bool>,
}

/// Reads commands until `stop` and hands each to its namespace's lane. Commands being
/// carried out when `stop` arrives are finished (and acked) first; those still
/// waiting in a lane are left unacked for the next start. `replicas`: for the command
/// stream, if this agent is the first to need it.
pub(crate) async fn run(
    link: Link,
    executor: Arc<Executor>,
    policy: Policy,
    host: String,
    in_flight: usize,
    mut stop: watch::Receiver<bool>,
) {
    let in_flight = in_flight.clamp(1, MAX_IN_FLIGHT);
    let handler = Arc::new(Handler {
        executor,
        policy,
        stop: stop.clone(),
    });
    let mut lanes = Lanes::new();
    let mut retry = Duration::from_millis(200);
    let mut fresh = true;
    'setup: loop {
        let consumer = match consumer(&link, &host, in_flight, fresh).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "command consumer not ready; retrying");
                if pause(&mut stop, retry).await {
                    break 'setup;
                }
                retry = (retry * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        // Later set-ups (after an outage) keep the consumer: this process still
        // holds what it was delivered, in order.
        fresh = false;
        tracing::info!(subject = %nats_layout::cmd_subject(&host), in_flight, "taking commands");
        retry = Duration::from_millis(200);
        let messages = consumer
            .stream()
            .max_messages_per_batch(in_flight)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await;
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot pull commands; reconnecting the consumer");
                if pause(&mut stop, retry).await {
                    break 'setup;
                }
                continue 'setup;
            }
        };
        loop {
            let next = tokio::select! {
                m = messages.next() => m,
                _ = stop.changed() => break 'setup,
            };
            match next {
                Some(Ok(message)) => {
                    let namespace = namespace_of(&message.payload);
                    let handler = Arc::clone(&handler);
                    lanes.push(namespace, move |turn| async move {
                        handler.handle(message, turn).await
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pulling commands failed; reconnecting the consumer");
                    if pause(&mut stop, retry).await {
                        break 'setup;
                    }
                    continue 'setup;
                }
                None => continue 'setup,
            }
        }
    }
    lanes.finish().await;
}

/// The namespace a delivered command is for, read without admitting it: its lane.
/// Input that names none (malformed) shares the lane `""`; admission rejects it.
fn namespace_of(payload: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Head {
        namespace: Option<String>,
    }
    serde_json::from_slice::<Head>(payload)
        .ok()
        .and_then(|h| h.namespace)
        .unwrap_or_default()
}

impl Handler {
    /// Waits for its turn in the namespace, admits and carries out one delivered
    /// command, then acks it; or, when stopping before it began, leaves it unacked.
    async fn handle(&self, message: jetstream::Message, turn: Turn) {
        with_progress(&message, turn.wait()).await;
        if *self.stop.borrow() {
            return;
        }
        if let Ok(info) = message.info() {
            if info.delivered > 1 {
                tracing::info!(
                    delivered = info.delivered,
                    stream_seq = info.stream_sequence,
                    "command redelivered"
                );
            }
        }
        let text = String::from_utf8_lossy(&message.payload).into_owned();
        let mut stop = self.stop.clone();
        let mut retry = Duration::from_millis(200);
        let result = loop {
            let result = with_progress(&message, self.carry_out(&text)).await;
            if !not_recorded(&result) {
                break result;
            }
            tracing::error!(
                command_id = result.id.as_deref().unwrap_or("-"),
                "the log could not record the command; retrying it"
            );
            // Kept in its lane (nothing later in the namespace overtakes it), alive.
            let waited = with_progress(&message, pause(&mut stop, retry)).await;
            if waited {
                // Stopping: unacked, it is the first of its namespace next start.
                return;
            }
            retry = (retry * 2).min(Duration::from_secs(5));
        };
        hold_before_ack(&result).await;
        if let Err(e) = message.ack().await {
            // The command is durably in the log: a redelivery is answered from there.
            tracing::warn!(error = %e, "ack failed; the command will be redelivered and answered from the log");
        }
    }

    async fn carry_out(&self, text: &str) -> CommandResult {
        let executor = &self.executor;
        let known = |id: &str| executor.log().knows_command(id);
        match auth::admit(&self.policy, text, chrono::Utc::now(), known) {
            Ok(command) => executor.execute(command).await,
            Err((id, rejection)) => executor.reject(id, rejection).await,
        }
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
    // The first tick one period from now: `interval`'s immediate first tick still
    // waits for the timer wheel (about 1 ms), on every command.
    let period = ACK_WAIT / 3;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
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
