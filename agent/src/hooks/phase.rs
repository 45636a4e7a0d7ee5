//! Running one phase across the owners, with every call recorded in the log
//! (`hook_started` durable before the call, then `hook_succeeded` / `hook_failed`).
//!
//! - Preparing phases call owners in config order. When one fails (or is cancelled,
//!   or times out), the owners that completed are compensated with the matching
//!   revoking phase, in reverse, under a fresh budget that no cancellation can cut
//!   short. The failing owner is compensated too (first) when it may have granted:
//!   it timed out, was cancelled or replied invalidly; one that reported failure or
//!   could not be reached is not called (it cleans up its own partial work). A
//!   re-grant ([`OnFailure::Keep`]: for a revision that runs, a namespace that is
//!   ready, and still will when the command ends) compensates no one.
//! - Revoking phases call owners in reverse config order and stop at the first
//!   failure: the caller then keeps the runtime so a retry can finish the teardown.
//! - After a crash, [`Hooks::recover_interrupted`] reads a command's records and
//!   compensates every owner whose preparing call began and was not already undone.

use super::env::EnvRejection;
use super::{CallFailure, HookReply, HookRequest, Hooks, Phase};
use crate::event::{Event, Record};
use crate::log::{Log, LogError};
use capstan_common::ErrorCode;
use std::collections::BTreeMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a phase is about: the request fields other than phase and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookContext {
    pub host: String,
    pub command_id: String,
    pub namespace: String,
    pub workload: Option<String>,
    pub revision: Option<String>,
}

/// A preparing phase that succeeded: the merged (not yet validated) launch env and
/// the owners that completed, for compensation if a later step fails.
#[derive(Debug, Default)]
pub struct Prepared {
    pub env: BTreeMap<String, String>,
    pub completed: Vec<usize>,
}

/// What a preparing phase that fails undoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFailure {
    /// Compensates what the phase granted: it was for a revision that starts, or a
    /// namespace being made ready, which a failure leaves not running (not ready).
    Compensate,
    /// Revokes nothing: a re-grant for what runs (a revision) or is ready (a
    /// namespace), named here, which still does when the command ends. What its owners
    /// held before the command, and what they granted in it, stays held: compensation
    /// never touches what runs.
    Keep(String),
}

/// What happened after a failure, for the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aftermath {
    /// Nothing had completed; nothing to undo.
    Nothing,
    /// Every completed owner was compensated.
    Compensated,
    /// A compensating call failed (the others were still made).
    Incomplete { phase: Phase, owner: String },
    /// A revocation failed: the teardown stopped and the runtime is kept.
    TeardownStopped,
    /// A re-grant failed: nothing was revoked from what runs (named: `revision r1`,
    /// `namespace shop`).
    Kept { what: String },
    /// Revoking a replaced revision failed: the new one runs, the replaced one is
    /// stopped and keeps what was not revoked until a later start or activation of
    /// the workload revokes it.
    StillHeld { revision: String },
}

impl std::fmt::Display for Aftermath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Aftermath::Nothing => Ok(()),
            Aftermath::Compensated => f.write_str("; completed owners were compensated"),
            Aftermath::Incomplete { phase, owner } => write!(
                f,
                "; compensation incomplete: {phase} hook of owner {owner} failed"
            ),
            Aftermath::TeardownStopped => {
                f.write_str("; teardown stopped, the runtime is kept for a retry")
            }
            Aftermath::Kept { what } => write!(
                f,
                "; nothing was revoked: {what} keeps its grants, and a retry grants what is missing"
            ),
            Aftermath::StillHeld { revision } => write!(
                f,
                "; revision {revision} is stopped and keeps those grants until a later start or activation of the workload revokes them"
            ),
        }
    }
}

/// A phase that did not complete. Names phase and owner only.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    #[error("{phase} hook of owner {owner} {}{aftermath}", failure.as_str())]
    Hook {
        phase: Phase,
        owner: String,
        failure: CallFailure,
        aftermath: Aftermath,
    },
    #[error("launch environment from before_workload_start rejected: {rejection}{aftermath}")]
    Env {
        rejection: EnvRejection,
        aftermath: Aftermath,
    },
    #[error("{phase} was interrupted by an agent restart{aftermath}")]
    Interrupted { phase: Phase, aftermath: Aftermath },
    #[error("cannot record hook progress")]
    Log(#[from] LogError),
}

impl PhaseError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PhaseError::Hook {
                failure: CallFailure::Cancelled,
                ..
            } => ErrorCode::Cancelled,
            PhaseError::Hook { .. } => ErrorCode::HookFailed,
            PhaseError::Env { .. } => ErrorCode::LaunchEnvRejected,
            PhaseError::Interrupted { .. } => ErrorCode::Interrupted,
            PhaseError::Log(_) => ErrorCode::LogFailed,
        }
    }
}

/// The code a failed call is recorded with. It says whether the owner may have granted
/// (cut short or an invalid reply: compensated, live and after a crash) or not (it
/// reported failure or could not be reached: it cleans up after itself).
fn failure_code(f: CallFailure) -> ErrorCode {
    match f {
        CallFailure::Cancelled => ErrorCode::Cancelled,
        CallFailure::Timeout => ErrorCode::HookTimeout,
        CallFailure::Reply => ErrorCode::HookInvalidReply,
        CallFailure::Spawn | CallFailure::Exit => ErrorCode::HookFailed,
    }
}

/// How a call is bounded, besides the owner's own timeout.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// A regular call: the command's cancellation cuts it short.
    Run(&'a CancellationToken),
    /// A compensating call: never cancelled, but cut at the cleanup deadline.
    Compensate(Instant),
}

impl Hooks {
    /// Calls owner `i` once, recording it.
    async fn call_logged(
        &self,
        log: &Log,
        ctx: &HookContext,
        phase: Phase,
        i: usize,
        mode: Mode<'_>,
    ) -> Result<Result<HookReply, CallFailure>, LogError> {
        let owner = &self.owners()[i];
        let event = |e: fn(String, Phase, String) -> Event| {
            e(ctx.command_id.clone(), phase, owner.name.clone())
        };
        log.append_durable(&[Event::HookStarted {
            command_id: ctx.command_id.clone(),
            phase,
            owner: owner.name.clone(),
            revision: ctx.revision.clone(),
        }])
        .await?;
        let request = HookRequest {
            v: 1,
            phase,
            owner: owner.name.clone(),
            host: ctx.host.clone(),
            command_id: ctx.command_id.clone(),
            namespace: ctx.namespace.clone(),
            workload: ctx.workload.clone(),
            revision: ctx.revision.clone(),
            compensating: matches!(mode, Mode::Compensate(_)),
        };
        let never = CancellationToken::new();
        let (cancel, timeout) = match mode {
            Mode::Run(cancel) => (cancel, owner.timeout),
            Mode::Compensate(deadline) => (
                &never,
                owner
                    .timeout
                    .min(deadline.saturating_duration_since(Instant::now())),
            ),
        };
        let began = Instant::now();
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Err(CallFailure::Cancelled),
            r = self.runner.call(owner, &request) => r,
            () = tokio::time::sleep(timeout) => Err(CallFailure::Timeout),
        };
        let result = match &outcome {
            Ok(_) => "ok",
            Err(f) => failure_code(*f).as_str(),
        };
        self.metrics
            .hook_call(&owner.name, phase, result, began.elapsed());
        let done = match &outcome {
            Ok(_) => event(|command_id, phase, owner| Event::HookSucceeded {
                command_id,
                phase,
                owner,
            }),
            Err(f) => Event::HookFailed {
                command_id: ctx.command_id.clone(),
                phase,
                owner: owner.name.clone(),
                code: failure_code(*f),
            },
        };
        if let Err(f) = &outcome {
            tracing::warn!(command_id = %ctx.command_id, %phase, owner = %owner.name, "hook {}", f.as_str());
        }
        log.append_durable(&[done]).await?;
        Ok(outcome)
    }

    /// Runs preparing `phase`; on a failure undoes what `on_failure` says (compensates
    /// the completed owners, or nothing for a re-grant) and returns the error.
    pub async fn prepare(
        &self,
        log: &Log,
        ctx: &HookContext,
        phase: Phase,
        on_failure: &OnFailure,
        cancel: &CancellationToken,
    ) -> Result<Prepared, PhaseError> {
        let mut prepared = Prepared::default();
        for i in self.order(phase) {
            match self
                .call_logged(log, ctx, phase, i, Mode::Run(cancel))
                .await?
            {
                Ok(reply) => {
                    if phase == Phase::BeforeWorkloadStart {
                        super::env::merge(&mut prepared.env, reply.env);
                    }
                    prepared.completed.push(i);
                }
                Err(failure) => {
                    let mut undo = prepared.completed;
                    if failure.may_have_granted() {
                        undo.push(i);
                    }
                    let aftermath = self.undo(log, ctx, phase, &undo, on_failure).await?;
                    return Err(PhaseError::Hook {
                        phase,
                        owner: self.owners()[i].name.clone(),
                        failure,
                        aftermath,
                    });
                }
            }
        }
        Ok(prepared)
    }

    /// What a failed preparing `phase` undoes: [`Hooks::compensate`] of `completed`,
    /// or nothing for a re-grant ([`OnFailure::Keep`]).
    pub async fn undo(
        &self,
        log: &Log,
        ctx: &HookContext,
        phase: Phase,
        completed: &[usize],
        on_failure: &OnFailure,
    ) -> Result<Aftermath, LogError> {
        match on_failure {
            OnFailure::Compensate => self.compensate(log, ctx, phase, completed).await,
            OnFailure::Keep(what) => {
                tracing::info!(command_id = %ctx.command_id, %phase, "a re-grant failed; nothing is revoked from {what}");
                Ok(Aftermath::Kept { what: what.clone() })
            }
        }
    }

    /// Undoes preparing `phase` for the `completed` owners (config-order indexes),
    /// in reverse, under a fresh budget: no cancellation applies, and each call's
    /// timeout is cut to what is left of the budget. Carries on past failures.
    pub async fn compensate(
        &self,
        log: &Log,
        ctx: &HookContext,
        phase: Phase,
        completed: &[usize],
    ) -> Result<Aftermath, LogError> {
        let Some(undo) = phase.compensation() else {
            return Ok(Aftermath::Nothing);
        };
        let owners: Vec<usize> = completed
            .iter()
            .rev()
            .copied()
            .filter(|&i| self.owners()[i].takes(undo))
            .collect();
        if owners.is_empty() {
            return Ok(Aftermath::Nothing);
        }
        let deadline = Instant::now() + self.cleanup_budget();
        let mut aftermath = Aftermath::Compensated;
        for i in owners {
            let r = self
                .call_logged(log, ctx, undo, i, Mode::Compensate(deadline))
                .await?;
            if r.is_err() && aftermath == Aftermath::Compensated {
                aftermath = Aftermath::Incomplete {
                    phase: undo,
                    owner: self.owners()[i].name.clone(),
                };
            }
        }
        Ok(aftermath)
    }

    /// Runs revoking `phase` in reverse order, stopping at the first failure.
    pub async fn revoke(
        &self,
        log: &Log,
        ctx: &HookContext,
        phase: Phase,
        cancel: &CancellationToken,
    ) -> Result<(), PhaseError> {
        for i in self.order(phase) {
            if let Err(failure) = self
                .call_logged(log, ctx, phase, i, Mode::Run(cancel))
                .await?
            {
                return Err(PhaseError::Hook {
                    phase,
                    owner: self.owners()[i].name.clone(),
                    failure,
                    aftermath: Aftermath::TeardownStopped,
                });
            }
        }
        Ok(())
    }

    /// For a command resumed after a crash, given its records so far: if a preparing
    /// phase had begun, compensates every owner whose preparing call began (it may
    /// have granted even if its reply was lost) except one recorded as failed (not
    /// cancelled), and not already compensated, and returns the error the command completes with. `None`
    /// when no preparing phase had begun: the command can simply be carried out.
    pub async fn recover_interrupted(
        &self,
        log: &Log,
        ctx: &HookContext,
        history: &[Record],
    ) -> Result<Option<PhaseError>, LogError> {
        let Some(phase) = history.iter().find_map(|r| match &r.event {
            Event::HookStarted { phase, .. } if phase.is_preparing() => Some(*phase),
            _ => None,
        }) else {
            return Ok(None);
        };
        let undo = phase.compensation();
        let owners_where = |want: fn(&Event) -> Option<(Phase, &str)>, p: Option<Phase>| {
            history
                .iter()
                .filter_map(|r| want(&r.event))
                .filter(|(ph, _)| Some(*ph) == p)
                .map(|(_, o)| o.to_string())
                .collect::<Vec<_>>()
        };
        let started = owners_where(started_of, Some(phase));
        // A call recorded as failed is skipped only when the owner reported failure or
        // could not be reached (`hook_failed`); one cut short or with an invalid reply
        // (`cancelled`, `hook_timeout`, `hook_invalid_reply`) may have granted.
        let failed = owners_where(failed_without_granting_of, Some(phase));
        let undone = owners_where(succeeded_of, undo);
        let mut todo = Vec::new();
        for name in &started {
            if failed.contains(name) || undone.contains(name) {
                continue;
            }
            match self.owners().iter().position(|o| &o.name == name) {
                Some(i) if !todo.contains(&i) => todo.push(i),
                Some(_) => {}
                None => {
                    tracing::warn!(command_id = %ctx.command_id, %phase, owner = %name, "an owner that began before the restart is no longer configured; it cannot be compensated")
                }
            }
        }
        todo.sort_unstable();
        tracing::info!(command_id = %ctx.command_id, %phase, owners = todo.len(), "compensating hooks interrupted by a restart");
        let aftermath = self.compensate(log, ctx, phase, &todo).await?;
        Ok(Some(PhaseError::Interrupted { phase, aftermath }))
    }
}

fn started_of(e: &Event) -> Option<(Phase, &str)> {
    match e {
        Event::HookStarted { phase, owner, .. } => Some((*phase, owner)),
        _ => None,
    }
}

fn failed_without_granting_of(e: &Event) -> Option<(Phase, &str)> {
    match e {
        Event::HookFailed {
            phase, owner, code, ..
        } if *code == ErrorCode::HookFailed => Some((*phase, owner)),
        _ => None,
    }
}

fn succeeded_of(e: &Event) -> Option<(Phase, &str)> {
    match e {
        Event::HookSucceeded { phase, owner, .. } => Some((*phase, owner)),
        _ => None,
    }
}
