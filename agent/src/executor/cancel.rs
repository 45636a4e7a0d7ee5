//! Cancellation at the controller's request: a `cancel_command` for command `target`
//! records `cancel_requested` under `target` (durable first), then cuts `target` short
//! where it is carried out right now, exactly as the agent's stop does. The record is
//! what keeps `target` from beginning when it arrives later, or again after a restart:
//! [`Executor::cut_short`] reads it. A cancel of a command that completed records
//! nothing about it and changes nothing. A cancel takes no namespace's lock (it must
//! not wait behind the command it cancels); cancels run one at a time.

use super::{arrived, Earlier, Executor};
use crate::event::Event;
use crate::log::LogError;
use crate::plan::resume::{self, Arrival};
use capstan_common::{Command, CommandResult, Outcome};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The lock cancels take: a key no namespace has (namespaces are DNS labels).
const CANCELS: &str = "";

/// The cancellation tokens of the commands being carried out, or waiting for their
/// namespace, by id: what a cancel cuts.
#[derive(Default)]
pub(super) struct InFlight {
    tokens: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next: std::sync::atomic::AtomicU64,
}

impl InFlight {
    /// Makes `token` reachable as command `id`'s until the guard drops.
    pub(super) fn enter(&self, id: &str, token: &CancellationToken) -> Entered<'_> {
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tokens = self.tokens.lock().expect("in-flight tokens");
        tokens
            .entry(id.to_string())
            .or_default()
            .push((key, token.clone()));
        Entered {
            in_flight: self,
            id: id.to_string(),
            key,
        }
    }

    /// Cancels every execution of `id` in flight; false when there is none.
    fn cancel(&self, id: &str) -> bool {
        let tokens = self.tokens.lock().expect("in-flight tokens");
        let found = tokens.get(id).into_iter().flatten();
        let mut any = false;
        for (_, token) in found {
            token.cancel();
            any = true;
        }
        any
    }
}

/// One execution's place in [`InFlight`], left when dropped.
pub(super) struct Entered<'a> {
    in_flight: &'a InFlight,
    id: String,
    key: u64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut tokens = self.in_flight.tokens.lock().expect("in-flight tokens");
        if let Some(entries) = tokens.get_mut(&self.id) {
            entries.retain(|(key, _)| *key != self.key);
            if entries.is_empty() {
                tokens.remove(&self.id);
            }
        }
    }
}

impl Executor {
    /// Carries out `command`, a cancel of `target` (see the module docs). It succeeds
    /// once recorded, whatever `target`'s state: the controller reads `target`'s own
    /// outcome to learn what the cancel did.
    pub(super) async fn cancel_command(
        &self,
        command: &Command,
        target: &str,
    ) -> Result<CommandResult, LogError> {
        let id = &command.id;
        let lock = self.lock_for(CANCELS);
        let _serial = lock.lock().await;
        let course = match self.earlier(command).await? {
            Earlier::Settled(answer) => return Ok(answer),
            Earlier::Go(course, _) => course,
        };
        let mut events = Vec::new();
        if course.arrival == Arrival::New {
            events.push(arrived(command));
        }
        let theirs = self.log.for_command(target)?;
        let finished = theirs
            .iter()
            .any(|r| resume::completed(r, target).is_some())
            || (theirs.is_empty() && self.log.pruned_command(target)?.is_some());
        let request = !finished && resume::requested_by(&theirs).is_none();
        if request {
            events.push(Event::CancelRequested {
                command_id: target.to_string(),
                by: id.clone(),
            });
        }
        let answer = self.complete(id, events, Outcome::Succeeded, None).await?;
        if finished {
            tracing::info!(command_id = %id, %target, "cancel of a command that completed: nothing to do");
        } else {
            let cut = self.in_flight.cancel(target);
            tracing::info!(command_id = %id, %target, in_flight = cut, "cancel recorded");
        }
        Ok(answer)
    }

    /// Why `command` is to be cut short now, if it is: a cancel the log recorded for
    /// it, or its deadline having passed.
    pub(super) fn cut_short(&self, command: &Command) -> Result<Option<String>, LogError> {
        let records = self.log.for_command(&command.id)?;
        Ok((resume::requested_by(&records).map(resume::at_request))
            .or_else(|| resume::passed_deadline(command, chrono::Utc::now())))
    }
}
