//! The contract every driver keeps, runnable against any `&dyn Driver` (behind the
//! `testkit` feature, so production builds do not carry it). A driver's own tests run
//! [`Kit::run`] against a real backend; each rule is also callable on its own.
//!
//! The kit works in a namespace of its own, which it creates and deletes, under
//! workloads named after its rules; it leaves nothing behind when the driver keeps
//! the contract. Revision states are read with [`Driver::state`] (authoritative);
//! which revisions exist, with [`Driver::observe`].

use crate::{BackendState, Driver, DriverError, LaunchEnv, Observed, RevisionRef};
use capstan_common::Spec;
use std::collections::BTreeSet;

/// A rule the driver broke, or a driver call that failed while checking one.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("{rule}: {call} failed")]
    Call {
        rule: &'static str,
        call: &'static str,
        #[source]
        source: DriverError,
    },
    #[error("{rule}: {what}")]
    Broken { rule: &'static str, what: String },
}

/// The kit, bound to one driver, the namespace it works in and the spec every
/// revision gets (one the driver can run: for docker, an image on the host).
pub struct Kit<'a> {
    driver: &'a dyn Driver,
    namespace: String,
    spec: Spec,
}

impl<'a> Kit<'a> {
    pub fn new(driver: &'a dyn Driver, namespace: &str, spec: Spec) -> Kit<'a> {
        Kit {
            driver,
            namespace: namespace.to_string(),
            spec,
        }
    }

    /// Every rule, in order: the namespace first, its deletion last.
    pub async fn run(&self) -> Result<(), ContractError> {
        self.ensure_namespace_converges().await?;
        self.activate_twice_runs_one_revision().await?;
        self.activate_stops_the_previous_revision().await?;
        self.retire_converges_and_is_exact().await?;
        self.stop_and_start_converge().await?;
        self.observe_shows_only_what_was_asked().await?;
        self.delete_namespace_converges().await
    }

    /// `ensure_namespace` twice succeeds and the namespace is observed.
    pub async fn ensure_namespace_converges(&self) -> Result<(), ContractError> {
        const RULE: &str = "ensure_namespace converges";
        for _ in 0..2 {
            let call = self.driver.ensure_namespace(&self.namespace).await;
            call.map_err(failed(RULE, "ensure_namespace"))?;
        }
        self.expect_namespace(RULE, true).await
    }

    /// A prepared revision exists without running; activating it twice leaves exactly
    /// that one revision, running.
    pub async fn activate_twice_runs_one_revision(&self) -> Result<(), ContractError> {
        const RULE: &str = "prepare, then activate twice, runs one revision";
        let r1 = self.rev("once", "r1");
        self.prepare(RULE, r1).await?;
        self.prepare(RULE, r1).await?;
        self.expect(RULE, r1, Some(BackendState::Stopped)).await?;
        for _ in 0..2 {
            self.activate(RULE, r1, None).await?;
        }
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        self.only(RULE, "once", &["r1"]).await?;
        self.retire(RULE, r1).await
    }

    /// Activating r2 with r1 as the previous revision runs r2 and stops r1, which
    /// stays (a later retire removes it).
    pub async fn activate_stops_the_previous_revision(&self) -> Result<(), ContractError> {
        const RULE: &str = "activate stops the previous revision";
        let (r1, r2) = (self.rev("swap", "r1"), self.rev("swap", "r2"));
        self.prepare(RULE, r1).await?;
        self.prepare(RULE, r2).await?;
        self.activate(RULE, r1, None).await?;
        self.activate(RULE, r2, Some("r1")).await?;
        self.expect(RULE, r2, Some(BackendState::Running)).await?;
        self.expect(RULE, r1, Some(BackendState::Stopped)).await?;
        self.only(RULE, "swap", &["r1", "r2"]).await?;
        self.retire(RULE, r1).await?;
        self.retire(RULE, r2).await
    }

    /// Retiring a revision twice (or one never prepared) succeeds and removes exactly
    /// it: the workload's running revision and another workload's revision of the
    /// same name are untouched.
    pub async fn retire_converges_and_is_exact(&self) -> Result<(), ContractError> {
        const RULE: &str = "retire converges and touches only its revision";
        let (r1, r2) = (self.rev("retire", "r1"), self.rev("retire", "r2"));
        let other = self.rev("retire-other", "r1");
        for rev in [r1, r2, other] {
            self.prepare(RULE, rev).await?;
        }
        self.activate(RULE, r2, None).await?;
        self.retire(RULE, r1).await?;
        self.retire(RULE, r1).await?;
        self.retire(RULE, self.rev("retire", "never")).await?;
        self.expect(RULE, r1, None).await?;
        self.expect(RULE, r2, Some(BackendState::Running)).await?;
        self.expect(RULE, other, Some(BackendState::Stopped))
            .await?;
        self.only(RULE, "retire", &["r2"]).await?;
        self.retire(RULE, r2).await?;
        self.retire(RULE, other).await
    }

    /// Stop, start and resume each converge when repeated; stopping a revision that
    /// was never prepared succeeds.
    pub async fn stop_and_start_converge(&self) -> Result<(), ContractError> {
        const RULE: &str = "stop and start converge";
        let r1 = self.rev("restart", "r1");
        let env = LaunchEnv::new();
        self.prepare(RULE, r1).await?;
        self.activate(RULE, r1, None).await?;
        for _ in 0..2 {
            let call = self.driver.stop(r1).await;
            call.map_err(failed(RULE, "stop"))?;
        }
        self.expect(RULE, r1, Some(BackendState::Stopped)).await?;
        for _ in 0..2 {
            let call = self.driver.start(r1, &self.spec, &env).await;
            call.map_err(failed(RULE, "start"))?;
        }
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        let call = self.driver.stop(r1).await;
        call.map_err(failed(RULE, "stop"))?;
        for _ in 0..2 {
            let call = self.driver.resume(r1).await;
            call.map_err(failed(RULE, "resume"))?;
        }
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        let call = self.driver.stop(self.rev("restart", "never")).await;
        call.map_err(failed(RULE, "stop of an unknown revision"))?;
        self.only(RULE, "restart", &["r1"]).await?;
        self.retire(RULE, r1).await
    }

    /// After the rules above cleaned up, nothing of the kit's is observed but its
    /// namespace: no workload under it.
    pub async fn observe_shows_only_what_was_asked(&self) -> Result<(), ContractError> {
        const RULE: &str = "observe shows only what was asked";
        let prefix = format!("{}/", self.namespace);
        let observed = self.observe(RULE).await?;
        let left: Vec<&String> = observed
            .workloads
            .iter()
            .filter(|(key, revisions)| key.starts_with(&prefix) && !revisions.is_empty())
            .map(|(key, _)| key)
            .collect();
        if !left.is_empty() {
            return broken(RULE, format!("retired workloads still observed: {left:?}"));
        }
        Ok(())
    }

    /// `delete_namespace` twice succeeds and the namespace is no longer observed.
    pub async fn delete_namespace_converges(&self) -> Result<(), ContractError> {
        const RULE: &str = "delete_namespace converges";
        for _ in 0..2 {
            let call = self.driver.delete_namespace(&self.namespace).await;
            call.map_err(failed(RULE, "delete_namespace"))?;
        }
        self.expect_namespace(RULE, false).await
    }

    fn rev<'r>(&'r self, workload: &'r str, revision: &'r str) -> RevisionRef<'r> {
        RevisionRef {
            namespace: &self.namespace,
            workload,
            revision,
        }
    }

    async fn prepare(&self, rule: &'static str, rev: RevisionRef<'_>) -> Result<(), ContractError> {
        let call = self.driver.prepare(rev, &self.spec).await;
        call.map_err(failed(rule, "prepare"))
    }

    async fn activate(
        &self,
        rule: &'static str,
        rev: RevisionRef<'_>,
        previous: Option<&str>,
    ) -> Result<(), ContractError> {
        let env = LaunchEnv::new();
        let call = self.driver.activate(rev, &self.spec, &env, previous).await;
        call.map_err(failed(rule, "activate"))
    }

    async fn retire(&self, rule: &'static str, rev: RevisionRef<'_>) -> Result<(), ContractError> {
        self.driver
            .retire(rev)
            .await
            .map_err(failed(rule, "retire"))
    }

    async fn observe(&self, rule: &'static str) -> Result<Observed, ContractError> {
        self.driver.observe().await.map_err(failed(rule, "observe"))
    }

    /// The kit's namespace is observed (`present`), or not.
    async fn expect_namespace(
        &self,
        rule: &'static str,
        present: bool,
    ) -> Result<(), ContractError> {
        let observed = self.observe(rule).await?;
        if observed.namespaces.contains(&self.namespace) != present {
            let what = if present { "is not" } else { "is still" };
            return broken(rule, format!("{} {what} observed", self.namespace));
        }
        Ok(())
    }

    /// `rev`'s state is `want` (`None`: it has no backend).
    async fn expect(
        &self,
        rule: &'static str,
        rev: RevisionRef<'_>,
        want: Option<BackendState>,
    ) -> Result<(), ContractError> {
        let have = self
            .driver
            .state(rev)
            .await
            .map_err(failed(rule, "state"))?;
        if have != want {
            return broken(rule, format!("{rev} is {have:?}, expected {want:?}"));
        }
        Ok(())
    }

    /// `observe` shows exactly `revisions` for `workload`.
    async fn only(
        &self,
        rule: &'static str,
        workload: &str,
        revisions: &[&str],
    ) -> Result<(), ContractError> {
        let observed = self.observe(rule).await?;
        let have: BTreeSet<&str> = observed
            .workloads
            .get(&capstan_common::workload_key(&self.namespace, workload))
            .into_iter()
            .flat_map(|revs| revs.keys().map(String::as_str))
            .collect();
        let want: BTreeSet<&str> = revisions.iter().copied().collect();
        if have != want {
            return broken(
                rule,
                format!("observed revisions of {workload}: {have:?}, expected {want:?}"),
            );
        }
        Ok(())
    }
}

fn failed(rule: &'static str, call: &'static str) -> impl FnOnce(DriverError) -> ContractError {
    move |source| ContractError::Call { rule, call, source }
}

fn broken(rule: &'static str, what: String) -> Result<(), ContractError> {
    Err(ContractError::Broken { rule, what })
}
