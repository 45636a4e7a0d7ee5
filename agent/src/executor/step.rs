//! One step of a command carried out: its hook phase around the driver call
//! ([`Executor::run_step`], the sequence [`Step::hooks`] decides), the driver call
//! itself ([`Executor::perform`]), and the completion record.

use super::{ready, result, Executor};
use crate::event::Event;
use crate::hooks::{self, HookContext, OnFailure, PhaseError};
use crate::log::LogError;
use crate::plan::{self, HookSequence, Step};
use capstan_common::{CommandResult, ErrorCode, Outcome, Rejection, Strategy};
use capstan_driver::{DriverError, LaunchEnv, RevisionRef};
use tokio_util::sync::CancellationToken;

impl Executor {
    /// The one way a hook context is built: what a call is about.
    pub(super) fn hook_context(
        &self,
        id: &str,
        namespace: &str,
        workload: Option<&str>,
        revision: Option<&str>,
    ) -> HookContext {
        HookContext {
            host: self.host.clone(),
            command_id: id.to_string(),
            namespace: namespace.to_string(),
            workload: workload.map(Into::into),
            revision: revision.map(Into::into),
        }
    }

    /// Runs `step` inside its hook phase (see the module docs).
    pub(super) async fn run_step(
        &self,
        id: &str,
        step: Step,
        cancel: &CancellationToken,
    ) -> Result<Done, StepError> {
        let (namespace, workload, revision) = step.target();
        let ctx = self.hook_context(id, &namespace, workload.as_deref(), revision.as_deref());
        let hooks = &self.hooks;
        let log = &self.log;
        // A re-grant of what runs revokes nothing if it fails.
        let on_failure = match log.with_intent(|i| plan::grants::regrant(i, &step)) {
            Some(what) => OnFailure::Keep(what),
            None => OnFailure::Compensate,
        };
        if let Step::AlreadyRunning {
            namespace,
            workload,
            revision,
        } = &step
        {
            tracing::info!(command_id = %id, "already running: no driver call");
            let then = self
                .revoke_stale(id, namespace, workload, revision, None, cancel)
                .await
                .err();
            return Ok(Done { effect: None, then });
        }
        let effect = match step.hooks() {
            HookSequence::None => {
                if let Step::AlreadyReady { .. } = step {
                    tracing::info!(command_id = %id, "namespace already ready: no hooks, no driver call");
                }
                self.perform(id, step, &LaunchEnv::new(), cancel).await?
            }
            HookSequence::DriverThenGrant(phase) => {
                let effect = self.perform(id, step, &LaunchEnv::new(), cancel).await?;
                hooks.prepare(log, &ctx, phase, &on_failure, cancel).await?;
                effect
            }
            HookSequence::GrantThenDriver(phase) => {
                let no_env = std::collections::BTreeMap::new();
                let spec_env = step.spec().map_or(&no_env, |spec| &spec.env);
                let strategy = step.spec().map(|spec| spec.strategy).unwrap_or_default();
                let prepared = hooks.prepare(log, &ctx, phase, &on_failure, cancel).await?;
                let launch_env = match hooks::env::accept(&prepared.env, spec_env) {
                    Ok(env) => env,
                    Err(rejection) => {
                        let aftermath = hooks
                            .undo(log, &ctx, phase, &prepared.completed, &on_failure)
                            .await
                            .map_err(PhaseError::Log)?;
                        return Err(PhaseError::Env {
                            rejection,
                            aftermath,
                        }
                        .into());
                    }
                };
                let (namespace, workload, revision) = (
                    ctx.namespace.clone(),
                    workload.unwrap_or_default(),
                    revision.unwrap_or_default(),
                );
                let replaced = self
                    .log
                    .with_intent(|i| plan::grants::intended(i, &namespace, &workload))
                    .filter(|p| p != &revision);
                match self.perform(id, step, &launch_env, cancel).await {
                    Ok(effect) => {
                        let then = self
                            .revoke_stale(
                                id,
                                &namespace,
                                &workload,
                                &revision,
                                replaced.as_deref(),
                                cancel,
                            )
                            .await
                            .err();
                        return Ok(Done { effect, then });
                    }
                    Err(e) => {
                        let aftermath = self
                            .roll_back(id, (&namespace, &workload, &revision), strategy)
                            .await
                            .map_err(PhaseError::Log)?;
                        tracing::info!(command_id = %id, "driver failed after {phase}{aftermath}");
                        return Err(e);
                    }
                }
            }
            HookSequence::RevokeThenDriver(phase) => {
                hooks.revoke(log, &ctx, phase, cancel).await?;
                self.perform(id, step, &LaunchEnv::new(), cancel).await?
            }
        };
        Ok(Done { effect, then: None })
    }

    pub(super) async fn complete(
        &self,
        id: &str,
        mut events: Vec<Event>,
        outcome: Outcome,
        error: Option<Rejection>,
    ) -> Result<CommandResult, LogError> {
        events.push(Event::CommandCompleted {
            command_id: id.to_string(),
            outcome,
            code: error.as_ref().map(|e| e.code),
            message: error.as_ref().map(|e| e.message.clone()),
        });
        self.log.append_durable(&events).await?;
        tracing::info!(command_id = %id, outcome = ?outcome, "command completed");
        Ok(result(Some(id.to_string()), outcome, false, error))
    }

    /// Performs one step through the driver and returns the event that records it.
    pub(super) async fn perform(
        &self,
        id: &str,
        step: Step,
        launch_env: &LaunchEnv,
        cancel: &CancellationToken,
    ) -> Result<Option<Event>, StepError> {
        let rev = |namespace, workload, revision| RevisionRef {
            namespace,
            workload,
            revision,
        };
        match &step {
            Step::AlreadyRunning { .. } | Step::AlreadyReady { .. } => {}
            Step::EnsureNamespace { namespace } => {
                self.driver.ensure_namespace(namespace).await?;
            }
            Step::DeleteNamespace { namespace } => {
                self.driver.delete_namespace(namespace).await?;
            }
            Step::Prepare {
                namespace,
                workload,
                revision,
                spec,
            } => {
                self.driver
                    .prepare(rev(namespace, workload, revision), spec)
                    .await?
            }
            Step::Activate {
                namespace,
                workload,
                revision,
                spec,
                previous,
            } => {
                let rev = rev(namespace, workload, revision);
                if let (Strategy::StopFirst, Some(p)) = (spec.strategy, previous) {
                    // Stopped before anything starts; it keeps its grants until the
                    // new revision runs, and is started again if that fails.
                    self.driver.stop(RevisionRef { revision: p, ..rev }).await?;
                }
                if let Some(readiness) = &spec.readiness {
                    // Started alone (a start stops nothing else): the predecessor
                    // runs on until the new revision is ready; then the activation
                    // (its start a no-op now) stops it.
                    self.driver.start(rev, spec, launch_env).await?;
                    self.until_ready(rev, readiness, cancel).await?;
                }
                (self.driver)
                    .activate(rev, spec, launch_env, previous.as_deref())
                    .await?;
            }
            Step::Start {
                namespace,
                workload,
                revision,
                spec,
            } => {
                let rev = rev(namespace, workload, revision);
                self.driver.start(rev, spec, launch_env).await?;
                if let Some(readiness) = &spec.readiness {
                    self.until_ready(rev, readiness, cancel).await?;
                }
            }
            Step::Stop {
                namespace,
                workload,
                revision,
            } => {
                if let Some(r) = revision {
                    self.driver.stop(rev(namespace, workload, r)).await?;
                }
            }
            Step::Retire {
                namespace,
                workload,
                revision,
            } => {
                self.driver
                    .retire(rev(namespace, workload, revision))
                    .await?
            }
        }
        Ok(step.effect(id))
    }
}

/// A step that was carried out: its effect (if it has one), and what failed after it
/// (revoking a replaced revision's grants), which fails the command but keeps the
/// effect.
pub(super) struct Done {
    pub(super) effect: Option<Event>,
    pub(super) then: Option<PhaseError>,
}

/// A step that did not happen: the driver failed, or a hook phase did.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Phase(#[from] PhaseError),
    #[error(transparent)]
    Ready(#[from] ready::NotReady),
}

impl StepError {
    pub(super) fn code(&self) -> ErrorCode {
        match self {
            StepError::Driver(e) => e.code(),
            StepError::Phase(e) => e.code(),
            StepError::Ready(e) => e.code(),
        }
    }

    /// The report: a driver error with its causes; a phase error alone (its causes
    /// could carry a hook's words).
    pub(super) fn report(&self) -> String {
        match self {
            StepError::Driver(e) => e.report(),
            StepError::Phase(e) => e.to_string(),
            StepError::Ready(e) => e.report(),
        }
    }
}
