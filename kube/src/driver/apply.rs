//! Applying a revision's Deployment: from a spec (`activate`, `start`), or again from
//! the live one or its ReplicaSet, scaled to 0 or back (`stop`, `resume`), and waiting
//! for the rollout.

use super::api::{call, stale};
use super::{KubeDriver, ATTEMPTS};
use crate::objects::{self, OnRevision, Template};
use capstan_common::{ErrorCode, Spec};
use capstan_driver::{DriverError, LaunchEnv, RevisionRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::{ListParams, Patch};
use kube::Api;

impl KubeDriver {
    /// Applies `rev`'s Deployment with `replicas` (the workload runs with `runs_with`
    /// when started) and waits for the rollout.
    async fn apply(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        template: &Template,
        replicas: u32,
        runs_with: u32,
    ) -> Result<(), DriverError> {
        self.write(op, rev, template, (replicas, runs_with), None)
            .await?;
        self.wait_rollout(op, rev).await
    }

    /// Applies `rev`'s Deployment with `(replicas, runs_with)`; with `read`, only over
    /// that resourceVersion of it: `Ok(false)` when the Deployment changed since (the
    /// apiserver's 409 Conflict), and nothing was written.
    async fn write(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        template: &Template,
        (replicas, runs_with): (u32, u32),
        read: Option<&str>,
    ) -> Result<bool, DriverError> {
        let name = objects::deployment_name(rev.workload);
        let mut object = objects::deployment(
            &self.host,
            rev,
            template,
            replicas,
            runs_with,
            self.config.progress_deadline_secs,
        );
        if let Some(version) = read {
            object["metadata"]["resourceVersion"] = version.into();
        }
        let api = self.deployments(rev.namespace);
        let params = Self::apply_params();
        let patch = Patch::Apply(objects::apply_body(&object));
        let written = call(op, &rev, || async {
            match api.patch(&name, &params, &patch).await {
                Err(kube::Error::Api(status)) if read.is_some() && stale(&status) => Ok(false),
                done => done.map(|_| true),
            }
        });
        written.await
    }

    /// Applies `rev`'s Deployment again from the live one (its template, launch env
    /// included), scaled to 0 (`stop`) or to what it runs with (`resume`), then waits
    /// for the rollout. A `resume` of a revision the Deployment moved away from takes
    /// its template from its ReplicaSet ([`objects::replica_set_of`]). The apply
    /// carries the resourceVersion it was computed from: if the Deployment changed in
    /// between (a 409 Conflict), it is read and applied again, a few times. `Ok(())`
    /// for a stop when another revision runs.
    pub(super) async fn reapply(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<(), DriverError> {
        let stopping = op == "stop";
        let missing = || DriverError::Missing {
            op,
            target: rev.to_string(),
        };
        for attempt in 1..=ATTEMPTS {
            let Some(live) = self.deployment(op, rev).await? else {
                return Err(missing());
            };
            let template = match (OnRevision::of(Some(&live), rev.revision), stopping) {
                (OnRevision::This, _) => Template::from_live(&live),
                // Another revision runs: this one has nothing running.
                (_, true) => return Ok(()),
                // Resumed from its ReplicaSet: the only place its template (launch env
                // included) is left once the Deployment moved on.
                (_, false) => self.replica_set_template(op, rev, &live).await?,
            };
            let template = template.ok_or_else(missing)?;
            let runs_with = objects::runs_with(&live);
            let replicas = if stopping { 0 } else { runs_with };
            #[cfg(feature = "testing")]
            self.test_hooks.between_read_and_write().await;
            let read = live.metadata.resource_version.as_deref();
            if self
                .write(op, rev, &template, (replicas, runs_with), read)
                .await?
            {
                return self.wait_rollout(op, rev).await;
            }
            tracing::info!(target: "capstan::kube", %rev, attempt, "the Deployment changed since it was read (409); reading it again");
        }
        Err(DriverError::refused(
            op,
            rev,
            ErrorCode::DriverFailed,
            format!("the Deployment changed between each read and write ({ATTEMPTS} times)"),
        ))
    }

    /// `rev`'s pod template from the ReplicaSet the Deployment `live` keeps of it, under
    /// the Deployment's strategy; `None` when there is no such ReplicaSet.
    async fn replica_set_template(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        live: &Deployment,
    ) -> Result<Option<Template>, DriverError> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), rev.namespace);
        let of_rev = ListParams::default().labels(&self.pods_selector(rev));
        let listed = call(op, &rev, || api.list(&of_rev)).await?;
        let Some(rs) = objects::replica_set_of(&listed.items, live, rev.revision, &self.host)
        else {
            return Ok(None);
        };
        let strategy = Template::from_live(live).map(|t| t.strategy);
        let template = rs.spec.as_ref().and_then(|s| s.template.as_ref());
        tracing::info!(target: "capstan::kube", %rev, replica_set = rs.metadata.name.as_deref().unwrap_or_default(), "resuming the revision from its ReplicaSet");
        Ok(template.and_then(|t| Template::from_pod_template(t, strategy.unwrap_or_default())))
    }

    /// Starts `rev` from `spec` (its replicas) and the accepted launch environment.
    /// With `spec.readiness` it returns once the Deployment is written: the pods'
    /// readinessProbe gates the rollout, and the executor waits for it through
    /// [`Driver::probe`](capstan_driver::Driver::probe) (bounded by the deadline, cut
    /// short by a cancel), then activates, or rolls back by resuming the predecessor
    /// from its ReplicaSet.
    pub(super) async fn run(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let template = Template::from_spec(spec, launch_env)
            .map_err(|reason| DriverError::refused(op, rev, ErrorCode::InvalidSpec, reason))?;
        let replicas = crate::spec::check(spec)
            .map_err(|r| DriverError::refused(op, rev, r.code, r.message))?
            .replicas;
        self.our_namespace(op, rev.namespace).await?;
        // Refuses a Deployment under our name that is not ours.
        self.deployment(op, rev).await?;
        if spec.readiness.is_some() {
            self.write(op, rev, &template, (replicas, replicas), None)
                .await?;
            return Ok(());
        }
        self.apply(op, rev, &template, replicas, replicas).await
    }
}
