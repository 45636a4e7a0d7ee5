//! Carrying out what [`crate::plan::grants`] decides: revoking what a replaced
//! revision still holds, rolling back an activation that did not complete, and ending
//! an activation a crash interrupted. Grants follow what runs.

use super::{Done, Executor};
use crate::event::{Cause, Event, Record};
use crate::hooks::phase::Aftermath;
use crate::hooks::{Phase, PhaseError};
use crate::log::LogError;
use crate::plan::grants::{self as decide, Fix, Recovery, Seen};
use crate::plan::Step;
use capstan_common::{Command, ErrorCode, Strategy};
use capstan_driver::{BackendState, RevisionRef};
use tokio_util::sync::CancellationToken;

impl Executor {
    /// Revokes every grant of `ns/wl`'s revisions other than `running`, the one that
    /// now runs: `replaced` (the revision the command replaced) and any the ledger
    /// says still hold something. Each gets `before_workload_stop`, in reverse order,
    /// stopping at the first failure (the command then fails retryably, its effect
    /// kept).
    pub(super) async fn revoke_stale(
        &self,
        id: &str,
        ns: &str,
        wl: &str,
        running: &str,
        replaced: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<(), PhaseError> {
        let mut revisions: Vec<String> = replaced
            .filter(|r| *r != running)
            .map(String::from)
            .into_iter()
            .collect();
        for rev in self.log.with_intent(|i| decide::stale(i, ns, wl, running)) {
            if !revisions.contains(&rev) {
                revisions.push(rev);
            }
        }
        for rev in revisions {
            let ctx = self.hook_context(id, ns, Some(wl), Some(&rev));
            let phase = Phase::BeforeWorkloadStop;
            match self.hooks.revoke(&self.log, &ctx, phase, cancel).await {
                Ok(()) => {}
                Err(PhaseError::Hook {
                    phase,
                    owner,
                    failure,
                    ..
                }) => {
                    return Err(PhaseError::Hook {
                        phase,
                        owner,
                        failure,
                        aftermath: Aftermath::StillHeld { revision: rev },
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// What the driver reports now for `rev` and for `intended`. A revision that
    /// cannot be read counts as running: nothing is revoked from what may run, and
    /// nothing is started twice.
    async fn seen(&self, ns: &str, wl: &str, rev: &str, intended: Option<&str>) -> Seen {
        let state = |revision: &str| {
            let (driver, revision) = (self.driver.clone(), revision.to_string());
            let (ns, wl) = (ns.to_string(), wl.to_string());
            async move {
                let r = RevisionRef {
                    namespace: &ns,
                    workload: &wl,
                    revision: &revision,
                };
                match driver.state(r).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e.report(), revision = %r, "cannot read a revision's state; taking it as running");
                        Some(BackendState::Running)
                    }
                }
            }
        };
        let target = state(rev).await;
        let intended = match intended {
            Some(p) if p != rev => state(p).await,
            _ => None,
        };
        Seen {
            target,
            intended,
            unready: None,
        }
    }

    /// After an activation or start of `rev` failed in the driver: converge the
    /// workload to what intent runs (see [`decide::roll_back`]).
    pub(super) async fn roll_back(
        &self,
        id: &str,
        (ns, wl, rev): (&str, &str, &str),
        strategy: Strategy,
    ) -> Result<Aftermath, LogError> {
        let intended = self.log.with_intent(|i| decide::intended(i, ns, wl));
        let seen = self.seen(ns, wl, rev, intended.as_deref()).await;
        let fixes = self
            .log
            .with_intent(|i| decide::roll_back(i, ns, wl, rev, strategy, &seen));
        self.fix(id, ns, wl, fixes).await
    }

    /// Carries `fixes` out, in order, carrying on past failures.
    async fn fix(
        &self,
        id: &str,
        ns: &str,
        wl: &str,
        fixes: Vec<Fix>,
    ) -> Result<Aftermath, LogError> {
        let mut aftermath = Aftermath::Nothing;
        let mut still_running = Vec::new();
        for fix in fixes {
            match fix {
                Fix::Stop(rev) => {
                    let r = RevisionRef {
                        namespace: ns,
                        workload: wl,
                        revision: &rev,
                    };
                    if let Err(e) = self.driver.stop(r).await {
                        tracing::warn!(command_id = %id, error = %e.report(), "cannot stop a revision intent does not run; it keeps its grants");
                        still_running.push(rev);
                    }
                }
                Fix::Revoke(rev) if still_running.contains(&rev) => {}
                Fix::Revoke(rev) => {
                    let holders: Vec<String> = self.log.with_intent(|i| {
                        (i.grants.of_revision(ns, wl, &rev))
                            .map(|h| h.keys().cloned().collect())
                            .unwrap_or_default()
                    });
                    let owners = self.hooks.indexes(&holders);
                    let ctx = self.hook_context(id, ns, Some(wl), Some(&rev));
                    let phase = Phase::BeforeWorkloadStart;
                    aftermath = self
                        .hooks
                        .compensate(&self.log, &ctx, phase, &owners)
                        .await?;
                }
                Fix::Resume(rev) => {
                    let r = RevisionRef {
                        namespace: ns,
                        workload: wl,
                        revision: &rev,
                    };
                    let event = match self.driver.resume(r).await {
                        Ok(()) => Event::WorkloadStarted {
                            cause: Cause::Supervisor,
                            namespace: ns.into(),
                            workload: wl.into(),
                            revision: rev,
                            previous: None,
                        },
                        Err(e) => Event::WorkloadFailed {
                            cause: Cause::Supervisor,
                            namespace: ns.into(),
                            workload: wl.into(),
                            code: e.code(),
                            message: e.report(),
                        },
                    };
                    self.log.append_durable(&[event]).await?;
                }
            }
        }
        Ok(aftermath)
    }

    /// For a command whose granting began before a crash: finishes or undoes it when
    /// it is an activation or start ([`decide::recover`]); otherwise compensates the
    /// owners that began, as [`crate::hooks::Hooks::recover_interrupted`] does, unless
    /// the namespace they granted for is ready (a re-grant: what was granted stays).
    /// `None`: nothing began that needs this (carry the command out).
    pub(super) async fn recover_step(
        &self,
        id: &str,
        command: &Command,
        step: Option<&Step>,
        history: &[Record],
        cancel: &CancellationToken,
    ) -> Result<Option<Done>, LogError> {
        let interrupted = |phase, aftermath| Done {
            effect: None,
            then: Some(PhaseError::Interrupted { phase, aftermath }),
        };
        match step {
            Some(Step::AlreadyRunning { .. }) | Some(Step::AlreadyReady { .. }) => {
                // Every grant is held again: nothing to undo, nothing to apply.
                return Ok(Some(Done {
                    effect: None,
                    then: None,
                }));
            }
            Some(Step::EnsureNamespace { namespace })
                if self
                    .log
                    .with_intent(|i| i.namespaces.contains_key(namespace)) =>
            {
                let phase = Phase::AfterNamespacePrepared;
                return Ok(Some(interrupted(phase, Aftermath::Nothing)));
            }
            _ => {}
        }
        if let Some((step, start)) = step.and_then(|st| Some((st, decide::starting(st)?))) {
            let decide::Starting {
                namespace: ns,
                workload: wl,
                revision: rev,
                previous,
                readiness,
                ..
            } = start;
            let intended = self.log.with_intent(|i| decide::intended(i, ns, wl));
            let mut seen = self.seen(ns, wl, rev, intended.as_deref()).await;
            // Probed only when it would otherwise be finished: running, and granted.
            let granted =
                (self.log).with_intent(|i| decide::surely_granted(i, &self.duties, ns, wl, rev));
            if let (Some(BackendState::Running), true) = (&seen.target, granted) {
                let r = RevisionRef {
                    namespace: ns,
                    workload: wl,
                    revision: rev,
                };
                // As far as the start would have waited before it returned (kube: its
                // rollout), then its readiness check: one meaning of "started".
                tracing::info!(command_id = %id, revision = %rev, "the interrupted start is applied; waiting until the driver has it started");
                let settled = match self.driver.settle(r).await {
                    Ok(()) => None,
                    Err(e) => Some(e.report()),
                };
                seen.unready = match (settled, readiness) {
                    (Some(why), _) => Some(why),
                    (None, Some(readiness)) => self
                        .until_ready(r, readiness, cancel)
                        .await
                        .err()
                        .map(|e| e.report()),
                    (None, None) => None,
                };
            }
            let recovery = self
                .log
                .with_intent(|i| decide::recover(i, &self.duties, step, &seen));
            return Ok(Some(match recovery {
                Some(Recovery::Finish { stop }) => {
                    tracing::info!(command_id = %id, revision = %rev, "the driver had applied the interrupted start; finishing it");
                    if let Some(p) = &stop {
                        let r = RevisionRef {
                            namespace: ns,
                            workload: wl,
                            revision: p,
                        };
                        if let Err(e) = self.driver.stop(r).await {
                            tracing::warn!(command_id = %id, error = %e.report(), "cannot stop the replaced revision");
                        }
                    }
                    let then = self
                        .revoke_stale(id, ns, wl, rev, intended.as_deref(), cancel)
                        .await
                        .err();
                    Done {
                        effect: Some(Event::WorkloadStarted {
                            cause: Cause::Command(id.into()),
                            namespace: ns.into(),
                            workload: wl.into(),
                            revision: rev.into(),
                            previous: previous.map(String::from),
                        }),
                        then,
                    }
                }
                Some(Recovery::RollBack(fixes)) => {
                    tracing::info!(command_id = %id, revision = %rev, "rolling back a start interrupted by a restart");
                    let aftermath = self.fix(id, ns, wl, fixes).await?;
                    interrupted(Phase::BeforeWorkloadStart, aftermath)
                }
                None => unreachable!("recover decides every activation and start"),
            }));
        }
        let ctx = match step {
            Some(step) => {
                let (ns, wl, rev) = step.target();
                self.hook_context(id, &ns, wl.as_deref(), rev.as_deref())
            }
            None => {
                let op = &command.op;
                let wl = op.workload().map(|w| w.workload);
                let ns = op.namespace().unwrap_or_default();
                self.hook_context(id, ns, wl.as_deref(), op.revision())
            }
        };
        let e = self
            .hooks
            .recover_interrupted(&self.log, &ctx, history)
            .await?;
        Ok(e.map(|e| {
            debug_assert_eq!(e.code(), ErrorCode::Interrupted);
            Done {
                effect: None,
                then: Some(e),
            }
        }))
    }
}
