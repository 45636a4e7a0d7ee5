//! The contract every driver keeps, runnable against any `&dyn Driver` (behind the
//! `testkit` feature, so production builds do not carry it). A driver's own tests run
//! [`Kit::run`] against a real backend; each rule is also callable on its own.
//!
//! The kit works in a namespace of its own, which it creates and deletes, under
//! workloads named after its rules; it leaves nothing behind when the driver keeps
//! the contract. Revision states are read with [`Driver::state`] (authoritative);
//! which revisions exist, with [`Driver::observe`]; the environment a workload runs
//! with, with the [`EnvProbe`] a backend's tests give ([`Kit::with_env_probe`]).

use crate::{merged_env, BackendState, Driver, DriverError, LaunchEnv, Observed, RevisionRef};
use capstan_common::Spec;
use std::collections::{BTreeMap, BTreeSet};

/// Reads the environment a revision's workload runs with, as its backend holds it (a
/// process's environ, a container's `Config.Env`, a pod template's env): how the kit
/// sees that a launch environment reached the workload. The backend may add variables
/// of its own (`PATH`, `HOSTNAME`); the kit looks only at the spec's and its own.
#[async_trait::async_trait]
pub trait EnvProbe: Send + Sync {
    /// The environment of `rev`'s workload as it runs now; `Err` says why it cannot be
    /// read (nothing runs, no such object).
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String>;
}

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
    /// The [`EnvProbe`] could not read a workload's environment.
    #[error("{rule}: reading the environment of {rev} failed: {reason}")]
    EnvProbe {
        rule: &'static str,
        rev: String,
        reason: String,
    },
}

/// The kit, bound to one driver, the namespace it works in and the spec every
/// revision gets (one the driver can run: for docker, an image on the host; with an
/// env, so that the launch environment is seen to win on a shared name).
pub struct Kit<'a> {
    driver: &'a dyn Driver,
    namespace: String,
    spec: Spec,
    env_probe: Option<&'a dyn EnvProbe>,
    one_backend_per_workload: bool,
}

impl<'a> Kit<'a> {
    pub fn new(driver: &'a dyn Driver, namespace: &str, spec: Spec) -> Kit<'a> {
        Kit {
            driver,
            namespace: namespace.to_string(),
            spec,
            env_probe: None,
            one_backend_per_workload: false,
        }
    }

    /// Reads each workload's environment with `probe`: the launch environment rule
    /// then checks what reached the workload, not only that the calls succeed.
    pub fn with_env_probe(mut self, probe: &'a dyn EnvProbe) -> Kit<'a> {
        self.env_probe = Some(probe);
        self
    }

    /// For a backend that keeps one object per workload, on one revision at a time
    /// (kube: one Deployment per workload, `docs/kube.md` *Mapping*; a prepared
    /// revision is only staged, and a newer revision's rollout replaces the older
    /// one's pods): a revision that is only prepared, or that a newer one replaced,
    /// has no backend (`state` is `None`, `observe` does not list it) where the other
    /// drivers keep it `Stopped`. Every other expectation is unchanged.
    pub fn one_backend_per_workload(mut self) -> Kit<'a> {
        self.one_backend_per_workload = true;
        self
    }

    /// What a revision that is prepared, or replaced by a newer one, shows.
    fn not_running(&self) -> Option<BackendState> {
        (!self.one_backend_per_workload).then_some(BackendState::Stopped)
    }

    /// Every rule, in order: the namespace first, its deletion last.
    pub async fn run(&self) -> Result<(), ContractError> {
        self.run_until_namespace_deletion().await?;
        self.delete_namespace_converges().await
    }

    /// Every rule of [`Kit::run`] but the last, [`Kit::delete_namespace_converges`]:
    /// for a backend whose test checks the namespace's deletion its own way (kube:
    /// `tests/tests/e2e/kube/contract.rs`). The kit's namespace is left, empty.
    pub async fn run_until_namespace_deletion(&self) -> Result<(), ContractError> {
        self.ensure_namespace_converges().await?;
        self.activate_twice_runs_one_revision().await?;
        self.activate_stops_the_previous_revision().await?;
        self.retire_converges_and_is_exact().await?;
        self.stop_and_start_converge().await?;
        self.launch_env_reaches_the_workload().await?;
        self.observe_shows_only_what_was_asked().await
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
        self.expect(RULE, r1, self.not_running()).await?;
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
        self.expect(RULE, r1, self.not_running()).await?;
        let observed: &[&str] = match self.one_backend_per_workload {
            false => &["r1", "r2"],
            true => &["r2"],
        };
        self.only(RULE, "swap", observed).await?;
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
        self.expect(RULE, other, self.not_running()).await?;
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

    /// The launch environment reaches the workload, merged over the spec's env (the
    /// launch env wins on a shared name): activated with `L1` (a non-ASCII value
    /// among it), stopped and started with `L2` (other values; a name of `L1`
    /// dropped, which must be gone), stopped and resumed (exactly as last configured:
    /// `L2`). With an [`EnvProbe`] the workload's env is read after each start and
    /// must equal `merged_env(spec, L)` on the spec's names and the kit's (the
    /// backend's own variables are not looked at); without one, the calls must
    /// succeed and the states converge.
    pub async fn launch_env_reaches_the_workload(&self) -> Result<(), ContractError> {
        const RULE: &str = "the launch environment reaches the workload";
        let r1 = self.rev("env", "r1");
        let shared = self.spec.env.keys().next();
        let launch = |pairs: &[(&str, &str)], shared_value: &str| -> LaunchEnv {
            let mut env: LaunchEnv = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if let Some(name) = shared {
                env.insert(name.clone(), shared_value.to_string());
            }
            env
        };
        let l1 = launch(
            &[
                ("CAPSTAN_KIT_TOKEN", "tök-1 ✓"),
                ("CAPSTAN_KIT_ROLE", "opaque-role-1"),
                ("CAPSTAN_KIT_DROPPED", "only-at-the-first-start"),
            ],
            "from-launch-1",
        );
        let l2 = launch(
            &[
                ("CAPSTAN_KIT_TOKEN", "tök-2 ✓ ünïcode"),
                ("CAPSTAN_KIT_ROLE", "opaque-role-2"),
                ("CAPSTAN_KIT_ADDED", "only-at-the-second-start"),
            ],
            "from-launch-2",
        );
        let names: BTreeSet<&str> = (self.spec.env.keys())
            .chain(l1.keys())
            .chain(l2.keys())
            .map(String::as_str)
            .collect();
        self.prepare(RULE, r1).await?;
        let call = self.driver.activate(r1, &self.spec, &l1, None).await;
        call.map_err(failed(RULE, "activate"))?;
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        self.expect_env(RULE, r1, "activated with L1", &l1, &names)
            .await?;
        self.stop_to_stopped(RULE, r1).await?;
        let call = self.driver.start(r1, &self.spec, &l2).await;
        call.map_err(failed(RULE, "start"))?;
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        self.expect_env(RULE, r1, "started with L2", &l2, &names)
            .await?;
        self.stop_to_stopped(RULE, r1).await?;
        let call = self.driver.resume(r1).await;
        call.map_err(failed(RULE, "resume"))?;
        self.expect(RULE, r1, Some(BackendState::Running)).await?;
        self.expect_env(RULE, r1, "resumed after L2", &l2, &names)
            .await?;
        self.only(RULE, "env", &["r1"]).await?;
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

    /// Stops `rev`, which must then be stopped.
    async fn stop_to_stopped(
        &self,
        rule: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<(), ContractError> {
        let call = self.driver.stop(rev).await;
        call.map_err(failed(rule, "stop"))?;
        self.expect(rule, rev, Some(BackendState::Stopped)).await
    }

    /// With a probe: `rev`'s env, on `names`, is exactly the spec's env with `launch`
    /// over it (a name of `names` outside both must be absent). `when` says after
    /// which step.
    async fn expect_env(
        &self,
        rule: &'static str,
        rev: RevisionRef<'_>,
        when: &str,
        launch: &LaunchEnv,
        names: &BTreeSet<&str>,
    ) -> Result<(), ContractError> {
        let Some(probe) = self.env_probe else {
            return Ok(());
        };
        let have = probe
            .env(rev)
            .await
            .map_err(|reason| ContractError::EnvProbe {
                rule,
                rev: rev.to_string(),
                reason,
            })?;
        let have: BTreeMap<&str, &str> = have
            .iter()
            .filter(|(k, _)| names.contains(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let want = merged_env(&self.spec, launch);
        let want: BTreeMap<&str, &str> =
            want.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if have != want {
            return broken(
                rule,
                format!("{rev} {when}: its env is {have:?}, expected {want:?}"),
            );
        }
        Ok(())
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
