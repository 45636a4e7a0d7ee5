//! Taking commands: the host's commands sit in the fleet's command stream under
//! `capstan.v1.cmd.<host>`, in publish order, and nothing there is the host's. The
//! agent keeps its own [`position`] (in its log, mark [`position::MARK`]) and asks for
//! the commands after it ([`Source`]): on per-host accounts from the coordinators
//! (`capstan.v1.sync.<host>`), otherwise from the stream itself. It asks when it
//! starts, when it hears a bell (every publish on its command subject reaches it),
//! when it reconnects, and every [`SYNC_EVERY`] in case a bell was lost; up to
//! `commands_in_flight` commands are taken and not yet finished.
//!
//! Order: commands for one namespace run one after another in stream order;
//! commands for different namespaces run concurrently ([`lanes`]). A slow hook in
//! namespace A does not delay namespace B.
//!
//! The position moves past a command once the executor has returned, i.e. once its
//! `command_completed` (or `command_rejected`) record is durable, and past every
//! earlier one. Whatever happens before (a crash, an outage), the command is asked
//! for again and the executor answers it from the log or finishes it, never carries
//! it out twice. A stop leaves the commands still waiting in a lane unfinished: the
//! next start asks for them again, first in their namespace.
//!
//! When the log cannot record a command, the command's lane retries it (with a
//! pause), so nothing later in its namespace overtakes it.

use super::{auth, pause, Link};
use crate::executor::Executor;
use capstan_common::nats::SyncAnswer;
use capstan_common::signing::Policy;
use capstan_common::{nats_layout, CommandResult, ErrorCode};
use futures::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

mod lanes;
pub mod position;
mod source;
use lanes::{Lanes, Turn};
use position::Position;
use source::Source;

/// The default of `commands_in_flight` (agent.toml).
pub const DEFAULT_IN_FLIGHT: usize = 32;
/// The most `commands_in_flight` may be.
pub const MAX_IN_FLIGHT: usize = 1024;
/// How often the agent asks for its commands without a bell: a bell lost (core
/// NATS delivers at most once) delays a command by at most this.
pub const SYNC_EVERY: Duration = Duration::from_secs(60);
/// How often the agent looks for a reconnect (its bells may have been lost while
/// it was away): then it asks at once.
const RECONNECT_CHECK: Duration = Duration::from_secs(1);
/// A bell whose command is not found yet (its publish is still on its way into
/// the stream) is chased this many times, 25 ms apart and doubling.
const CHASE_TRIES: u32 = 8;
/// Test-only fault (feature `testing`): after the result is durable and before the
/// position moves past the command, say so on stderr and hang, so that a test can
/// SIGKILL the agent at exactly that point.
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

/// What a lane needs to carry out a command and report it finished.
struct Handler {
    executor: Arc<Executor>,
    policy: Policy,
    stop: watch::Receiver<bool>,
    position: Arc<Mutex<Position>>,
    finished: Notify,
}

/// A bell whose command was not among those read yet: its id and the tries left.
struct Chase {
    id: String,
    tries: u32,
}

/// Takes commands until `stop` and hands each to its namespace's lane. Commands being
/// carried out when `stop` arrives are finished first; those still waiting in a lane
/// are left for the next start.
pub(crate) async fn run(
    link: Link,
    executor: Arc<Executor>,
    policy: Policy,
    host: String,
    in_flight: usize,
    mut stop: watch::Receiver<bool>,
) {
    let in_flight = in_flight.clamp(1, MAX_IN_FLIGHT);
    let mark = executor.log().mark(position::MARK).unwrap_or_else(|e| {
        tracing::error!(error = %capstan_common::report(&e), "cannot read the command position; asking from the start of the stream");
        0
    });
    let handler = Arc::new(Handler {
        executor,
        policy,
        stop: stop.clone(),
        position: Arc::new(Mutex::new(Position::new(mark))),
        finished: Notify::new(),
    });
    let source = Source::new(&link, &host);
    let client = link.js.client();
    let mut lanes = Lanes::new();
    let mut retry = Duration::from_millis(200);
    'setup: loop {
        let mut bells = match client.subscribe(nats_layout::cmd_subject(&host)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hear command bells; retrying");
                if pause(&mut stop, retry).await {
                    break 'setup;
                }
                retry = (retry * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        tracing::info!(
            subject = %nats_layout::cmd_subject(&host),
            position = handler.taken(),
            in_flight,
            "taking commands"
        );
        let mut ask = true;
        let mut starved = false;
        let mut chase: Option<Chase> = None;
        let mut every = tokio::time::interval(SYNC_EVERY);
        every.tick().await;
        let mut check = tokio::time::interval(RECONNECT_CHECK);
        let connects = || {
            client
                .statistics()
                .connects
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let mut seen_connects = connects();
        loop {
            if ask {
                let room = in_flight.saturating_sub(handler.open());
                if room == 0 {
                    starved = true;
                    ask = false;
                } else {
                    let after = handler.taken();
                    match source.after(after, room).await {
                        Ok(answer) => {
                            retry = Duration::from_millis(200);
                            ask = answer.more;
                            if let Some(secs) = answer.beat_secs {
                                follow_pace(&link, secs);
                            }
                            let took = handler.take(answer, &mut lanes);
                            if let Some(c) = &chase {
                                if took.iter().any(|id| id == &c.id)
                                    || handler.executor.log().knows_command(&c.id)
                                {
                                    chase = None;
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, after, "cannot read the commands; asking again");
                            if pause(&mut stop, retry).await {
                                break 'setup;
                            }
                            retry = (retry * 2).min(Duration::from_secs(10));
                            continue;
                        }
                    }
                }
            }
            if ask {
                continue;
            }
            let chase_after = chase.as_ref().map_or(Duration::MAX, |c| {
                Duration::from_millis(25 << (CHASE_TRIES - c.tries).min(10))
            });
            tokio::select! {
                bell = bells.next() => match bell {
                    Some(bell) => {
                        ask = true;
                        chase = command_id(&bell.payload).map(|id| Chase { id, tries: CHASE_TRIES });
                    }
                    None => continue 'setup,
                },
                _ = handler.finished.notified() => {
                    ask = std::mem::take(&mut starved);
                }
                _ = tokio::time::sleep(chase_after), if chase.is_some() => {
                    ask = true;
                    if let Some(c) = &mut chase {
                        c.tries -= 1;
                        if c.tries == 0 {
                            chase = None;
                        }
                    }
                }
                _ = every.tick() => ask = true,
                _ = check.tick() => {
                    let now = connects();
                    ask = now != seen_connects;
                    seen_connects = now;
                }
                _ = stop.changed() => break 'setup,
            }
        }
    }
    lanes.finish().await;
}

/// Beats at the pace a coordinator says (held to [`nats_layout::HEARTBEAT_SECS`] ..=
/// [`nats_layout::MAX_HEARTBEAT_SECS`]).
fn follow_pace(link: &Link, secs: u64) {
    let secs = secs.clamp(nats_layout::HEARTBEAT_SECS, nats_layout::MAX_HEARTBEAT_SECS);
    let pace = Duration::from_secs(secs);
    link.pace.send_if_modified(|now| {
        let changed = *now != pace;
        if changed {
            tracing::info!(beat_secs = secs, "beating at the fleet's pace");
        }
        *now = pace;
        changed
    });
}

/// What a command says of itself, read without admitting it (admission judges the
/// rest): its id, and the namespace it is for — its lane (input that names none,
/// malformed, shares the lane `""`; admission rejects it).
#[derive(Default, serde::Deserialize)]
struct Head {
    id: Option<String>,
    namespace: Option<String>,
}

impl Head {
    fn of(payload: &[u8]) -> Head {
        serde_json::from_slice(payload).unwrap_or_default()
    }
}

/// The id a bell's command gives itself.
fn command_id(payload: &[u8]) -> Option<String> {
    Head::of(payload).id
}

impl Handler {
    fn lock(&self) -> std::sync::MutexGuard<'_, Position> {
        self.position.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn taken(&self) -> u64 {
        self.lock().taken()
    }

    fn open(&self) -> usize {
        self.lock().open()
    }

    /// Takes the commands of `answer` into their lanes, in order; their ids.
    fn take(self: &Arc<Self>, answer: SyncAnswer, lanes: &mut Lanes) -> Vec<String> {
        let mut ids = Vec::with_capacity(answer.commands.len());
        for queued in answer.commands {
            if !self.lock().take(queued.seq) {
                continue;
            }
            let Head { id, namespace } = Head::of(queued.command.as_bytes());
            // Finished by this host (its result is final) but unknown to its log: a
            // log restored from an older copy, which would run it again. One the log
            // knows is answered from the log as ever (a duplicate, or `id_conflict`
            // for other content under its id).
            if let (Some(status), Some(command_id)) = (&queued.finished, id.as_deref()) {
                if !self.executor.log().knows_command(command_id) {
                    tracing::warn!(
                        command_id,
                        status,
                        stream_seq = queued.seq,
                        "the command is already finished by this host (its result is final), \
                         but the log does not know it (restored from an older copy?): not carried out again"
                    );
                    ids.extend(id);
                    self.done(queued.seq);
                    continue;
                }
            }
            ids.extend(id);
            let handler = Arc::clone(self);
            lanes.push(namespace.unwrap_or_default(), move |turn| async move {
                handler.handle(queued.seq, queued.command, turn).await
            });
        }
        ids
    }

    /// Waits for its turn in the namespace, admits and carries out one command, then
    /// moves the position; or, when stopping before it began, leaves it unfinished.
    async fn handle(&self, seq: u64, text: String, turn: Turn) {
        turn.wait().await;
        if *self.stop.borrow() {
            return;
        }
        let mut stop = self.stop.clone();
        let mut retry = Duration::from_millis(200);
        let result = loop {
            let result = self.carry_out(&text).await;
            if !not_recorded(&result) {
                break result;
            }
            tracing::error!(
                command_id = result.id.as_deref().unwrap_or("-"),
                "the log could not record the command; retrying it"
            );
            // Kept in its lane: nothing later in the namespace overtakes it.
            if pause(&mut stop, retry).await {
                // Stopping: unfinished, it is the first of its namespace next start.
                return;
            }
            retry = (retry * 2).min(Duration::from_secs(5));
        };
        hold_before_ack(&result).await;
        self.done(seq);
    }

    /// Command `seq` is finished: the position moves past it when it can.
    fn done(&self, seq: u64) {
        let kept = self.lock().finish(seq);
        if let Some(kept) = kept {
            if let Err(e) = self.executor.log().advance_mark(position::MARK, kept) {
                // The command is durably in the log: asked for again, it is answered there.
                tracing::warn!(error = %capstan_common::report(&e), stream_seq = seq, "cannot keep the command position");
            }
        }
        self.finished.notify_one();
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

/// True when the log did not take the command: ask for it again.
fn not_recorded(result: &CommandResult) -> bool {
    result
        .error
        .as_ref()
        .is_some_and(|e| matches!(e.code, ErrorCode::LogFailed | ErrorCode::LogDegraded))
}
