//! The executor carries commands out, with the log as its memory:
//! `command_received` (durable) → decide → driver → effect + `command_completed`
//! (durable) → report. A command id already completed in the log is answered from
//! the log; one received but not completed (a crash, a redelivery) is resumed, and
//! since every driver step is idempotent and its effect is logged once, it is carried
//! out exactly once as far as the log and the host can tell.
//!
//! Lifecycle hooks wrap the driver steps (see [`crate::hooks`]): `ensure_namespace`
//! runs `after_namespace_prepared` after the driver and before reporting ready;
//! `activate_revision` and `start_workload` run `before_workload_start` first and hand
//! the accepted launch env to the driver; `stop_workload` and `retire_revision` run
//! `before_workload_stop`, and `delete_namespace` `before_namespace_delete`, before the
//! driver touches anything. A command that changes nothing (activating the running
//! revision, starting what runs) is decided as [`Step::AlreadyRunning`]: no hooks, no
//! driver call, no effect event.

use crate::event::{Event, Record};
use crate::hooks::{Hooks, Phase, PhaseError};
use crate::log::{Log, LogError};
use crate::metrics::Metrics;
use crate::plan::grants::Duties;
use crate::plan::resume::{self, Arrival, Course, Next};
use crate::plan::{self, Resume, Step};
use capstan_common::{Command, CommandResult, ErrorCode, Op, Outcome, Rejection};
use capstan_driver::Driver;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

mod cancel;
mod grants;
mod lifecycle;
mod look;
mod ready;
mod step;
pub use lifecycle::{ReconcileReport, SweepReport};
pub use look::Noticed;
use step::{Done, StepError};
#[cfg(test)]
mod tests;

/// Carries commands out against one driver, recording everything in one log.
pub struct Executor {
    host: String,
    log: Arc<Log>,
    driver: Arc<dyn Driver>,
    /// The frozen hook owners (none by default).
    hooks: Hooks,
    /// Who of them grants what (derived from `hooks`).
    duties: Duties,
    /// Cancelled when the agent stops: hooks in flight are cut short (and completed
    /// owners compensated under a fresh budget).
    shutdown: CancellationToken,
    /// Commands on one namespace run one at a time; namespaces run in parallel.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Every answer is counted here (see [`crate::metrics`]).
    metrics: Arc<Metrics>,
    /// What a `cancel_command` cuts: the commands being carried out.
    in_flight: cancel::InFlight,
}

fn result(
    id: Option<String>,
    outcome: Outcome,
    duplicate: bool,
    error: Option<Rejection>,
) -> CommandResult {
    CommandResult {
        id,
        outcome,
        duplicate,
        retryable: error.as_ref().is_some_and(|e| e.code.is_retryable()),
        error,
    }
}

fn log_failure(id: Option<String>, e: &LogError) -> CommandResult {
    let code = if matches!(e, LogError::Degraded(_)) {
        ErrorCode::LogDegraded
    } else {
        ErrorCode::LogFailed
    };
    let mut message = e.to_string();
    if let Some(source) = std::error::Error::source(e) {
        message = format!("{message}: {source}");
    }
    let outcome = if code == ErrorCode::LogDegraded {
        Outcome::Rejected
    } else {
        Outcome::Failed
    };
    result(id, outcome, false, Some(Rejection::new(code, message)))
}

impl Executor {
    pub fn new(host: impl Into<String>, log: Arc<Log>, driver: Arc<dyn Driver>) -> Executor {
        Executor {
            host: host.into(),
            log,
            driver,
            hooks: Hooks::none(),
            duties: Duties::default(),
            shutdown: CancellationToken::new(),
            locks: Mutex::new(HashMap::new()),
            metrics: Arc::new(Metrics::new()),
            in_flight: cancel::InFlight::default(),
        }
    }

    /// Counts into `metrics` (shared with the measured driver and the hooks).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Executor {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Uses these hook owners (frozen for the executor's life).
    pub fn with_hooks(mut self, hooks: Hooks) -> Executor {
        self.duties = Duties {
            workload: hooks.takers(Phase::BeforeWorkloadStart),
            namespace: hooks.takers(Phase::AfterNamespacePrepared),
        };
        self.hooks = hooks;
        self
    }

    /// Cancelling this token cancels every command's hooks in flight (agent stop).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// Holds `namespace` against commands (and other holders) until the guard drops:
    /// what the supervisor takes before it re-checks intent and restarts anything.
    pub async fn lock_namespace(&self, namespace: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.lock_for(namespace).lock_owned().await
    }

    /// Parses one line of input and carries it out, or rejects (and records) it.
    pub async fn submit(&self, text: &str) -> CommandResult {
        self.submit_at(text, 1).await
    }

    /// [`Executor::submit`] of line `line` (from 1) of a file of commands: a JSON
    /// error names that line (`capstan-agent apply`).
    pub async fn submit_at(&self, text: &str, line: usize) -> CommandResult {
        match Command::parse_at(text, line) {
            Ok(command) => self.execute(command).await,
            Err(rejection) => {
                self.reject(capstan_common::salvage_id(text), rejection)
                    .await
            }
        }
    }

    /// Records a rejection of input that is not (or not yet trusted as) a command,
    /// counts it (op `none`) and reports it. Nothing else happens.
    pub async fn reject(&self, id: Option<String>, rejection: Rejection) -> CommandResult {
        let answer = self.record_rejection(id, rejection).await;
        self.metrics.command(None, &answer);
        answer
    }

    /// Records a rejection and reports it, uncounted.
    async fn record_rejection(&self, id: Option<String>, rejection: Rejection) -> CommandResult {
        tracing::warn!(command_id = id.as_deref().unwrap_or("-"), code = %rejection.code, "command rejected: {}", rejection.message);
        let event = Event::CommandRejected {
            command_id: id.clone(),
            code: rejection.code,
            message: rejection.message.clone(),
        };
        if let Err(e) = self.log.append_durable(&[event]).await {
            return log_failure(id, &e);
        }
        result(id, Outcome::Rejected, false, Some(rejection))
    }

    /// Carries out one valid command exactly once.
    pub async fn execute(&self, command: Command) -> CommandResult {
        let cancel = self.shutdown.child_token();
        self.execute_until(command, &cancel).await
    }

    /// [`Executor::execute`], with its hooks cancelled when `cancel` fires.
    pub async fn execute_until(
        &self,
        command: Command,
        cancel: &CancellationToken,
    ) -> CommandResult {
        // The command's own deadline, and a cancel the controller sends, cancel it as
        // the agent's stop does.
        let cancel = cancel.child_token();
        let _entered = self.in_flight.enter(&command.id, &cancel);
        let deadline = command.deadline.map(|at| {
            let (token, wait) = (cancel.clone(), (at - chrono::Utc::now()).to_std());
            tokio::spawn(async move {
                tokio::time::sleep(wait.unwrap_or_default()).await;
                token.cancel();
            })
        });
        let answer = self.answer(&command, &cancel).await;
        if let Some(timer) = deadline {
            timer.abort();
        }
        self.metrics.command(Some(&command.op), &answer);
        answer
    }

    async fn answer(&self, command: &Command, cancel: &CancellationToken) -> CommandResult {
        let id = command.id.clone();
        if let Some(corruption) = self.log.degraded() {
            let message = format!(
                "the log is degraded ({corruption}); refusing to act until an operator repairs it"
            );
            return result(
                Some(id),
                Outcome::Rejected,
                false,
                Some(Rejection::new(ErrorCode::LogDegraded, message)),
            );
        }
        if command.host != self.host {
            let message = format!(
                "command is for host {}, this is {}",
                command.host, self.host
            );
            return self
                .record_rejection(Some(id), Rejection::new(ErrorCode::WrongHost, message))
                .await;
        }
        let done = match (command.op.cancels(), command.op.namespace()) {
            (Some(target), _) => self.cancel_command(command, target).await,
            (None, namespace) => {
                let lock = self.lock_for(namespace.unwrap_or_default());
                let _serial = lock.lock().await;
                self.carry_out(command, cancel).await
            }
        };
        match done {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(command_id = %id, error = %e, "log write failed");
                log_failure(Some(id), &e)
            }
        }
    }

    fn lock_for(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().expect("executor locks");
        Arc::clone(locks.entry(namespace.to_string()).or_default())
    }

    async fn carry_out(
        &self,
        command: &Command,
        cancel: &CancellationToken,
    ) -> Result<CommandResult, LogError> {
        let id = &command.id;
        let (course, history) = match self.earlier(command).await? {
            Earlier::Settled(answer) => return Ok(answer),
            Earlier::Go(course, history) => (course, history),
        };
        if course.cancelled_by.is_some() {
            cancel.cancel();
        }
        match course.arrival {
            Arrival::New => {
                if let Some(rejection) = self.refused_spec(command) {
                    return Ok(self.record_rejection(Some(id.clone()), rejection).await);
                }
                self.log.append_durable(&[arrived(command)]).await?;
            }
            Arrival::Resumed { last } => {
                self.log.durable(last).await?;
                tracing::info!(command_id = %id, "resuming a command the log shows as begun");
            }
        }
        match course.next {
            Next::Finish { revoke_stale } => {
                let then = match command.op.workload().filter(|_| revoke_stale) {
                    Some(w) => self.revoke_after_start(id, &w, cancel).await,
                    None => None,
                };
                self.finish(id, Done { effect: None, then }).await
            }
            Next::Cut(message) => {
                let error = Rejection::new(ErrorCode::Cancelled, message);
                (self.complete(id, Vec::new(), Outcome::Failed, Some(error))).await
            }
            Next::Carry { recover } => self.carry(command, recover, &history, cancel).await,
        }
    }

    /// After a crash that logged a start's effect: revokes what a replaced revision of
    /// `w` still holds (the revision intent now runs keeps its grants).
    async fn revoke_after_start(
        &self,
        id: &str,
        w: &capstan_common::WorkloadRef,
        cancel: &CancellationToken,
    ) -> Option<PhaseError> {
        let (ns, wl) = (w.namespace.as_str(), w.workload.as_str());
        let running = self
            .log
            .with_intent(|i| plan::grants::intended(i, ns, wl))?;
        (self.revoke_stale(id, ns, wl, &running, None, cancel).await).err()
    }

    /// Decides `command`'s step and carries it out; `recover`: a crash interrupted its
    /// granting, so first finish what the driver applied, or undo it, then fail
    /// retryably (`history`: its records).
    async fn carry(
        &self,
        command: &Command,
        recover: bool,
        history: &[Record],
        cancel: &CancellationToken,
    ) -> Result<CommandResult, LogError> {
        let id = &command.id;
        let step: Result<Step, plan::Refusal> = self.log.with_intent(|intent| {
            let step = plan::decide(intent, self.driver.kind(), &command.op)?;
            Ok(plan::grants::with_grants(step, intent, &self.duties))
        });
        if recover {
            if let Some(done) = self
                .recover_step(id, command, step.as_ref().ok(), history, cancel)
                .await?
            {
                return self.finish(id, done).await;
            }
        }
        let step = match step {
            Ok(step) => step,
            Err(refusal) => {
                let error = Rejection::new(refusal.code, refusal.message);
                return (self.complete(id, Vec::new(), Outcome::Failed, Some(error))).await;
            }
        };
        match self.run_step(id, step, cancel).await {
            Ok(done) => self.finish(id, done).await,
            Err(StepError::Phase(PhaseError::Log(e))) => Err(e),
            Err(e) => {
                let why = match e.code() {
                    ErrorCode::Cancelled => self.cut_short(command)?,
                    _ => None,
                };
                self.fail(id, e, why).await
            }
        }
    }

    /// Why the driver refuses the spec `command` prepares, by its own rules
    /// ([`Driver::check_spec`]) or because it has a readiness check the driver does
    /// not carry out (no `probes` capability): checked before the command is
    /// recorded, as what every spec shares was when it was parsed. A spec for another
    /// driver is the plan's to refuse (`driver_mismatch`).
    fn refused_spec(&self, command: &Command) -> Option<Rejection> {
        match &command.op {
            Op::PrepareRevision { spec, .. } if spec.driver == self.driver.kind() => {
                if spec.readiness.is_some() && !self.driver.capabilities().probes {
                    return Some(Rejection::new(
                        ErrorCode::InvalidSpec,
                        "`readiness`: this driver carries out no readiness checks (it does not declare `probes`)",
                    ));
                }
                self.driver.check_spec(spec).err()
            }
            _ => None,
        }
    }

    /// What the log already holds of `command`'s id, and what happens next
    /// ([`plan::resume`]): the answer when it is settled there (completed, also once
    /// retention pruned its records, or the id reused for other content: that
    /// rejection recorded); else how it goes on, with its own records.
    async fn earlier(&self, command: &Command) -> Result<Earlier, LogError> {
        let id = &command.id;
        let records = self.log.for_command(id)?;
        // Retention may have pruned its records: what the log kept of it answers.
        let pruned = match resume::received(&records) {
            true => None,
            false => self.log.pruned_command(id)?,
        };
        let now = chrono::Utc::now();
        match plan::resume(command, &records, pruned.as_ref(), now) {
            Resume::Conflict(rejection) => {
                let answer = self.record_rejection(Some(id.clone()), rejection).await;
                Ok(Earlier::Settled(answer))
            }
            Resume::Answered(answer) => {
                tracing::info!(command_id = %id, "duplicate command answered from the log");
                Ok(Earlier::Settled(answer))
            }
            Resume::Go(course) => {
                let own = resume::own(&records).cloned().collect();
                Ok(Earlier::Go(course, own))
            }
        }
    }

    /// Completes a step that was carried out: with its effect, succeeded, or failed
    /// when something after the effect did not (revoking a replaced revision).
    async fn finish(&self, id: &str, done: Done) -> Result<CommandResult, LogError> {
        let effect: Vec<Event> = done.effect.into_iter().collect();
        match done.then {
            None => self.complete(id, effect, Outcome::Succeeded, None).await,
            Some(PhaseError::Log(e)) => Err(e),
            Some(e) => {
                let e = StepError::Phase(e);
                tracing::warn!(command_id = %id, error = %e.report(), "command failed after its effect");
                let error = Rejection::new(e.code(), e.report());
                self.complete(id, effect, Outcome::Failed, Some(error))
                    .await
            }
        }
    }

    /// Completes a step that failed; `why`, when given, says what cut it short.
    async fn fail(
        &self,
        id: &str,
        e: StepError,
        why: Option<String>,
    ) -> Result<CommandResult, LogError> {
        tracing::warn!(command_id = %id, error = %e.report(), "command failed");
        let message = match why {
            Some(why) => format!("{why}: {}", e.report()),
            None => e.report(),
        };
        let error = Rejection::new(e.code(), message);
        self.complete(id, Vec::new(), Outcome::Failed, Some(error))
            .await
    }
}

/// What the log holds of a command's id before it is carried out ([`Executor::earlier`]).
enum Earlier {
    /// Answered from the log: nothing more is done.
    Settled(CommandResult),
    /// How it goes on, and its own records so far (none for a new command).
    Go(Course, Vec<Record>),
}

/// The record of `command` arriving, written before anything is done about it.
fn arrived(command: &Command) -> Event {
    let op = &command.op;
    Event::CommandReceived {
        command_id: command.id.clone(),
        op: op.name().into(),
        // A cancel addresses no namespace.
        namespace: op.namespace().unwrap_or_default().into(),
        workload: op.workload().map(|w| w.workload),
        revision: op.revision().map(Into::into),
        command: command.to_json(),
    }
}
