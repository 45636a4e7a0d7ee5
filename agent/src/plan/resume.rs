//! What happens next to a command, from what the log holds of its id ([`resume`]):
//! answer it again, refuse a reused id, or go on — recording its arrival or resuming
//! it, then finishing an effect already logged, cutting it short, or deciding its step
//! (after recovering a grant a crash interrupted). Every state a crash can leave a
//! command in is one of these; the executor reads the log and the clock, asks, and
//! does what the answer says, one match arm per outcome.

use crate::event::{Event, Record};
use crate::log::PrunedCommand;
use capstan_common::{Command, CommandResult, ErrorCode, Outcome, Rejection};
use chrono::{DateTime, Utc};

/// What happens next to a command ([`resume`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The id was received before with other content: refuse this one (and record
    /// the refusal), so that a reused id is never answered "duplicate, succeeded" for
    /// a command that was not carried out.
    Conflict(Rejection),
    /// It completed before (also once retention pruned its records): its answer again,
    /// marked `duplicate`. Nothing is done.
    Answered(CommandResult),
    /// Not settled: go on.
    Go(Course),
}

/// How a command that is not settled goes on ([`Resume::Go`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Course {
    pub arrival: Arrival,
    /// The `cancel_command` recorded for it, if one was: what it is cut short by.
    pub cancelled_by: Option<String>,
    pub next: Next,
}

/// Whether a command is new to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Nothing of it is recorded: check its spec, then record `command_received`
    /// (durable) before anything else.
    New,
    /// Begun before (a crash, a redelivery): act only once its records up to `last`
    /// (the highest seq) are durable — records still in memory after a failed flush
    /// are not what was done.
    Resumed { last: u64 },
}

/// What is done about a command that goes on ([`Course::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Its effect is logged (a crash came after the driver step, before completion):
    /// only complete it, succeeded. `revoke_stale`: it started a revision, so first
    /// revoke what a replaced revision still holds.
    Finish { revoke_stale: bool },
    /// Cancelled, or past its deadline, before any hook began: complete it failed
    /// (`cancelled`) with this message. Nothing is done on the host.
    Cut(String),
    /// Decide its step and carry it out. `recover`: a preparing hook began before a
    /// crash, so first finish what the driver applied, or undo it
    /// ([`crate::plan::grants::recover`]).
    Carry { recover: bool },
}

/// What happens next to `command`, from `records` (everything the log holds under
/// its id), what retention kept of it once `pruned` (read only when `records` hold no
/// `command_received`: [`received`]) and the time `now`.
pub fn resume(
    command: &Command,
    records: &[Record],
    pruned: Option<&PrunedCommand>,
    now: DateTime<Utc>,
) -> Resume {
    let id = &command.id;
    let mine: Vec<&Record> = own(records).collect();
    let pruned = pruned.filter(|_| !received(records));
    if let Some(rejection) = id_conflict(&mine, pruned, command) {
        return Resume::Conflict(rejection);
    }
    let completion = mine.iter().find_map(|r| completed(r, id));
    if let Some(answer) = completion.or_else(|| pruned.map(|p| pruned_answer(p, id))) {
        return Resume::Answered(answer);
    }
    let arrival = match mine.iter().map(|r| r.seq).max() {
        None => Arrival::New,
        Some(last) => Arrival::Resumed { last },
    };
    let cancelled_by = requested_by(records).map(String::from);
    let began = |preparing: bool| {
        mine.iter().any(|r| {
            matches!(&r.event, Event::HookStarted { phase, .. } if !preparing || phase.is_preparing())
        })
    };
    let next = if mine.iter().any(|r| r.event.is_effect()) {
        Next::Finish {
            revoke_stale: command.op.starts(),
        }
    } else if let Some(why) = (cancelled_by.as_deref().map(at_request))
        .or_else(|| passed_deadline(command, now))
        .filter(|_| !began(false))
    {
        Next::Cut(format!("{why} before it began; nothing was done"))
    } else {
        Next::Carry {
            recover: began(true),
        }
    };
    Resume::Go(Course {
        arrival,
        cancelled_by,
        next,
    })
}

/// A command's own records among `records` (everything under its id): a rejection
/// of input under its id is not one of them, nor is a cancel another command recorded
/// for it.
pub fn own(records: &[Record]) -> impl Iterator<Item = &Record> {
    records.iter().filter(|r| {
        !matches!(
            r.event,
            Event::CommandRejected { .. } | Event::CancelRequested { .. }
        )
    })
}

/// Whether `records` hold the command's `command_received` (else what retention kept
/// of it, if anything, is what [`resume`] needs).
pub fn received(records: &[Record]) -> bool {
    records
        .iter()
        .any(|r| matches!(r.event, Event::CommandReceived { .. }))
}

/// The `cancel_requested` among `records`: by which cancel, if any.
pub fn requested_by(records: &[Record]) -> Option<&str> {
    records.iter().find_map(|r| match &r.event {
        Event::CancelRequested { by, .. } => Some(by.as_str()),
        _ => None,
    })
}

/// What the report of a command the controller cancelled starts with.
pub fn at_request(by: &str) -> String {
    format!("cancelled at the controller's request (cancel_command {by})")
}

/// "its deadline … passed", once `command`'s deadline is not after `now`.
pub fn passed_deadline(command: &Command, now: DateTime<Utc>) -> Option<String> {
    let at = command.deadline.filter(|at| *at <= now)?;
    Some(format!(
        "its deadline {} passed",
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    ))
}

/// `id_conflict` when the log received this id with other content
/// ([`Command::content`]: everything but `issued_at` and `sig`): its
/// `command_received` among `mine`, or what is kept of it once `pruned`. A stored
/// command that no longer parses cannot be compared and is not a conflict.
fn id_conflict(
    mine: &[&Record],
    pruned: Option<&PrunedCommand>,
    command: &Command,
) -> Option<Rejection> {
    let received = mine.iter().find_map(|r| match &r.event {
        Event::CommandReceived { command, .. } => Some((r.seq, command)),
        _ => None,
    });
    let (seq, same, since) = match (received, pruned) {
        (Some((seq, stored)), _) => {
            let stored = Command::parse(stored).ok()?;
            (seq, stored.content() == command.content(), "")
        }
        (None, Some(p)) => (p.received_seq, p.same_content(command)?, ", since pruned"),
        (None, None) => return None,
    };
    (!same).then(|| {
        Rejection::new(
            ErrorCode::IdConflict,
            format!(
                "id {} was already used for another command (received as seq {seq}{since}); send new content under a new id",
                command.id
            ),
        )
    })
}

/// The answer recorded for `id`, if `record` is its completion.
pub fn completed(record: &Record, id: &str) -> Option<CommandResult> {
    match &record.event {
        Event::CommandCompleted {
            outcome,
            code,
            message,
            ..
        } => Some(duplicate(id, *outcome, *code, message.as_deref())),
        _ => None,
    }
}

/// The answer for `id` from what the log kept of it once pruned: the same as from
/// its records.
fn pruned_answer(pruned: &PrunedCommand, id: &str) -> CommandResult {
    duplicate(id, pruned.outcome, pruned.code, pruned.message.as_deref())
}

/// A duplicate's answer: how `id` completed.
fn duplicate(
    id: &str,
    outcome: Outcome,
    code: Option<ErrorCode>,
    message: Option<&str>,
) -> CommandResult {
    let error = code.map(|c| Rejection::new(c, message.unwrap_or_default().to_string()));
    CommandResult {
        id: Some(id.to_string()),
        outcome,
        duplicate: true,
        retryable: error.as_ref().is_some_and(|e| e.code.is_retryable()),
        error,
    }
}

#[cfg(test)]
mod tests;
