//! The kube driver's operations: the decisions of [`crate::objects`] carried out on
//! the cluster through kube-rs, every write a server-side apply by field manager
//! `capstan` (never forced: a field another manager owns fails `field_conflict`).

use crate::objects::{self, ApiFailure, OnRevision, Owner, Rollout, Template};
use crate::KubeConfig;
use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::{
    BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, RevisionRef,
};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Config};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a rollout's progress is read while waiting for it.
const POLL: Duration = Duration::from_millis(250);
/// How many times a request the apiserver asks to retry (409 from a raced update,
/// 429, 5xx) is sent before the operation fails.
const ATTEMPTS: u32 = 5;

/// Workloads as Deployments in one Kubernetes cluster, for the cluster agent whose
/// host name is the cluster's name.
pub struct KubeDriver {
    host: String,
    client: Client,
    config: KubeConfig,
}

impl KubeDriver {
    /// Connects with `config.kubeconfig` (else kube-rs's inference: `$KUBECONFIG`,
    /// `~/.kube/config`, the in-cluster ServiceAccount) and checks the apiserver
    /// answers.
    pub async fn connect(host: &str, config: KubeConfig) -> Result<KubeDriver, DriverError> {
        let unavailable =
            |source: Box<dyn std::error::Error + Send + Sync>| DriverError::Unavailable {
                op: "connect",
                target: "the cluster".into(),
                source,
            };
        let kube_config = match &config.kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path).map_err(|e| unavailable(e.into()))?;
                let options = KubeConfigOptions {
                    context: config.context.clone(),
                    ..KubeConfigOptions::default()
                };
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| unavailable(e.into()))?
            }
            None => Config::infer().await.map_err(|e| unavailable(e.into()))?,
        };
        let client = Client::try_from(kube_config).map_err(|e| unavailable(e.into()))?;
        client
            .apiserver_version()
            .await
            .map_err(|e| unavailable(e.into()))?;
        Ok(KubeDriver {
            host: host.to_string(),
            client,
            config,
        })
    }

    fn apply_params() -> PatchParams {
        PatchParams::apply(objects::FIELD_MANAGER)
    }

    fn selector(&self) -> String {
        format!("{}=true,{}={}", objects::MANAGED, objects::HOST, self.host)
    }

    /// The pods of one revision.
    fn pods_of(&self, rev: RevisionRef<'_>) -> ListParams {
        ListParams::default().labels(&format!(
            "{},{}={},{}={}",
            self.selector(),
            objects::WORKLOAD,
            rev.workload,
            objects::REVISION,
            rev.revision
        ))
    }

    fn deployments(&self, namespace: &str) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn deployment(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<Option<Deployment>, DriverError> {
        let name = objects::deployment_name(rev.workload);
        let api = self.deployments(rev.namespace);
        let found = call(op, &rev, || api.get_opt(&name)).await?;
        match found {
            Some(d) if !objects::is_ours(d.metadata.labels.as_ref(), &self.host) => {
                Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::NotOwned,
                    format!("Deployment {name} exists and is not this host's capstan's"),
                ))
            }
            found => Ok(found),
        }
    }

    /// The tenant Namespace must exist and be ours.
    async fn our_namespace(&self, op: &'static str, namespace: &str) -> Result<(), DriverError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = call(op, &namespace, || api.get_opt(namespace)).await?;
        match Owner::of(
            found.as_ref().map(|n| n.metadata.labels.as_ref()),
            &self.host,
        ) {
            Owner::Ours => Ok(()),
            Owner::Absent => Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NamespaceNotFound,
                "the Namespace does not exist",
            )),
            Owner::NotOurs => Err(not_ours(op, namespace)),
        }
    }

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
        let name = objects::deployment_name(rev.workload);
        let object = objects::deployment(
            &self.host,
            rev,
            template,
            replicas,
            runs_with,
            self.config.progress_deadline_secs,
        );
        let api = self.deployments(rev.namespace);
        let params = Self::apply_params();
        let patch = Patch::Apply(&object);
        call(op, &rev, || api.patch(&name, &params, &patch)).await?;
        self.wait_rollout(op, rev).await
    }

    /// Waits (at most `rollout_timeout_secs`) for `rev`'s rollout to complete, failing
    /// on what the cluster will not get past by itself.
    async fn wait_rollout(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<(), DriverError> {
        let deadline =
            Instant::now() + Duration::from_secs(self.config.rollout_timeout_secs.into());
        let name = objects::deployment_name(rev.workload);
        let api = self.deployments(rev.namespace);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), rev.namespace);
        let pod_selector = self.pods_of(rev);
        let mut last = None;
        loop {
            let deployment = call(op, &rev, || api.get_opt(&name))
                .await?
                .ok_or_else(|| DriverError::Missing {
                    op,
                    target: rev.to_string(),
                })?;
            let state = objects::rollout(&deployment, rev.revision);
            match &state {
                Rollout::Complete => return Ok(()),
                Rollout::Failed { reason } => {
                    return Err(DriverError::refused(
                        op,
                        rev,
                        ErrorCode::BackendFailed,
                        format!("the rollout failed: {reason}"),
                    ))
                }
                Rollout::Superseded => {
                    return Err(DriverError::refused(
                        op,
                        rev,
                        ErrorCode::DriverFailed,
                        "the Deployment moved to another revision during the rollout",
                    ))
                }
                Rollout::Progressing { .. } => {}
            }
            let listed = call(op, &rev, || pods.list(&pod_selector)).await?;
            if let Some((code, reason)) = objects::pod_failure(&listed.items) {
                return Err(DriverError::refused(op, rev, code, reason));
            }
            if last.as_ref() != Some(&state) {
                tracing::info!(target: "capstan::kube", %rev, ?state, "rollout");
                last = Some(state);
            }
            if Instant::now() >= deadline {
                return Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::RolloutTimeout,
                    format!(
                        "the rollout did not complete in {} s ({:?})",
                        self.config.rollout_timeout_secs, last
                    ),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts `rev` from `spec` (its replicas) and the accepted launch environment.
    async fn run(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let template = Template::from_spec(spec, launch_env)
            .map_err(|reason| DriverError::refused(op, rev, ErrorCode::InvalidSpec, reason))?;
        self.our_namespace(op, rev.namespace).await?;
        // Refuses a Deployment under our name that is not ours.
        self.deployment(op, rev).await?;
        let replicas = spec.kube.replicas;
        self.apply(op, rev, &template, replicas, replicas).await
    }
}

/// A `not_owned` refusal of `target`.
fn not_ours(op: &'static str, target: &str) -> DriverError {
    DriverError::refused(
        op,
        target,
        ErrorCode::NotOwned,
        "it exists and is not this host's capstan's",
    )
}

/// Sends a request, again when the apiserver asks for it (a few times), and maps
/// what fails to a driver error with a stable code.
async fn call<T, F, Fut>(
    op: &'static str,
    target: &(dyn std::fmt::Display + Sync),
    mut request: F,
) -> Result<T, DriverError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let err = match request().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match &err {
            kube::Error::Api(status) => {
                let field_conflict = status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldManagerConflict"));
                match objects::api_failure(status.code, &status.reason, field_conflict) {
                    ApiFailure::Retry if attempt < ATTEMPTS => {
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                        continue;
                    }
                    ApiFailure::Retry => {
                        return Err(DriverError::Backend {
                            op,
                            target: target.to_string(),
                            source: err.into(),
                        })
                    }
                    ApiFailure::Code(code) => {
                        return Err(DriverError::refused(
                            op,
                            target,
                            code,
                            status.message.clone(),
                        ))
                    }
                }
            }
            // Not an answer from the apiserver (connection refused or cut, TLS, a
            // timeout): retryable, every operation is idempotent.
            _ => {
                return Err(DriverError::Unavailable {
                    op,
                    target: target.to_string(),
                    source: err.into(),
                })
            }
        }
    }
}

#[async_trait::async_trait]
impl Driver for KubeDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Kube
    }

    /// The cluster owns its workloads: an agent stop or start never stops or starts
    /// anything, and the cluster (not the agent) restarts pods. Container restarts are
    /// reported as exits ([`Driver::watch_exits`]); the agent only records them, and a
    /// crash loop as `workload_failed`.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: false,
            reports_exits: true,
            restarts_exits: false,
            reaps_orphans: false,
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        const OP: &str = "ensure_namespace";
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = call(OP, &namespace, || api.get_opt(namespace)).await?;
        if Owner::of(
            found.as_ref().map(|n| n.metadata.labels.as_ref()),
            &self.host,
        ) == Owner::NotOurs
        {
            return Err(not_ours(OP, namespace));
        }
        let object = objects::namespace(&self.host, namespace);
        let params = Self::apply_params();
        let patch = Patch::Apply(&object);
        call(OP, &namespace, || api.patch(namespace, &params, &patch)).await?;
        Ok(())
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        const OP: &str = "delete_namespace";
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = call(OP, &namespace, || api.get_opt(namespace)).await?;
        match Owner::of(
            found.as_ref().map(|n| n.metadata.labels.as_ref()),
            &self.host,
        ) {
            Owner::Absent => return Ok(()),
            Owner::NotOurs => return Err(not_ours(OP, namespace)),
            Owner::Ours => {}
        }
        let ours = ListParams::default().labels(&self.selector());
        let deployments = self.deployments(namespace);
        let held = call(OP, &namespace, || deployments.list(&ours)).await?;
        if !held.items.is_empty() {
            return Err(DriverError::refused(
                OP,
                namespace,
                ErrorCode::NamespaceNotEmpty,
                format!("it holds {} Deployment(s) of ours", held.items.len()),
            ));
        }
        let dp = DeleteParams::default();
        match call(OP, &namespace, || api.delete(namespace, &dp)).await {
            Ok(_)
            | Err(DriverError::Refused {
                code: ErrorCode::BackendMissing,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        const OP: &str = "prepare";
        Template::from_spec(spec, &LaunchEnv::new())
            .map_err(|reason| DriverError::refused(OP, rev, ErrorCode::InvalidSpec, reason))?;
        self.our_namespace(OP, rev.namespace).await?;
        let object = objects::staged(&self.host, rev, spec);
        let name = objects::staged_name(rev.workload, rev.revision);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), rev.namespace);
        let params = Self::apply_params();
        let patch = Patch::Apply(&object);
        call(OP, &rev, || api.patch(&name, &params, &patch)).await?;
        Ok(())
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        _previous: Option<&str>,
    ) -> Result<(), DriverError> {
        // The previous revision is the same Deployment's older template: the rollout
        // replaces its pods, so there is nothing else to stop.
        self.run("activate", rev, spec, launch_env).await
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        self.run("start", rev, spec, launch_env).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        const OP: &str = "resume";
        let live = self.deployment(OP, rev).await?;
        let (OnRevision::This, Some(live)) = (OnRevision::of(live.as_ref(), rev.revision), live)
        else {
            return Err(DriverError::Missing {
                op: OP,
                target: rev.to_string(),
            });
        };
        let template = Template::from_live(&live).ok_or_else(|| DriverError::Missing {
            op: OP,
            target: rev.to_string(),
        })?;
        let runs_with = objects::runs_with(&live);
        self.apply(OP, rev, &template, runs_with, runs_with).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        const OP: &str = "stop";
        let live = self.deployment(OP, rev).await?;
        match (OnRevision::of(live.as_ref(), rev.revision), live) {
            (OnRevision::This, Some(live)) => {
                let template = Template::from_live(&live).ok_or_else(|| DriverError::Missing {
                    op: OP,
                    target: rev.to_string(),
                })?;
                let runs_with = objects::runs_with(&live);
                self.apply(OP, rev, &template, 0, runs_with).await
            }
            // Another revision runs: this one has nothing running.
            (OnRevision::Other, _) => Ok(()),
            _ => Err(DriverError::Missing {
                op: OP,
                target: rev.to_string(),
            }),
        }
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        const OP: &str = "retire";
        let live = self.deployment(OP, rev).await?;
        // A Deployment already on another (newer) revision is left alone.
        if OnRevision::of(live.as_ref(), rev.revision) == OnRevision::This {
            let name = objects::deployment_name(rev.workload);
            let api = self.deployments(rev.namespace);
            // Foreground: the Deployment goes only after its ReplicaSets and pods, so
            // once it is gone nothing of this revision runs.
            let dp = DeleteParams::foreground();
            gone(call(OP, &rev, || api.delete(&name, &dp)).await)?;
            let deadline =
                Instant::now() + Duration::from_secs(self.config.rollout_timeout_secs.into());
            while call(OP, &rev, || api.get_opt(&name)).await?.is_some() {
                if Instant::now() >= deadline {
                    return Err(DriverError::refused(
                        OP,
                        rev,
                        ErrorCode::RolloutTimeout,
                        format!(
                            "the Deployment was not gone {} s after its deletion",
                            self.config.rollout_timeout_secs
                        ),
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        }
        let name = objects::staged_name(rev.workload, rev.revision);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), rev.namespace);
        let dp = DeleteParams::default();
        gone(call(OP, &rev, || api.delete(&name, &dp)).await)
    }

    /// The Namespaces and Deployments of ours, and which of those had their replicas
    /// changed outside capstan (`kubectl scale`). Staged revisions (ConfigMaps) are not
    /// backends: a running-intent workload whose Deployment was deleted by hand shows
    /// as missing (`backend_missing`), not as a stopped revision the cluster agent
    /// would leave alone.
    async fn observe(&self) -> Result<Observed, DriverError> {
        const OP: &str = "observe";
        let ours = ListParams::default().labels(&self.selector());
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let deployments: Api<Deployment> = Api::all(self.client.clone());
        let target = &"the cluster";
        let mut observed = Observed::default();
        for n in call(OP, target, || namespaces.list(&ours)).await? {
            observed.namespaces.extend(n.metadata.name);
        }
        let key = |meta: &kube::api::ObjectMeta| {
            let workload = meta.labels.as_ref()?.get(objects::WORKLOAD)?;
            let revision = meta.labels.as_ref()?.get(objects::REVISION)?;
            Some((
                capstan_common::workload_key(meta.namespace.as_deref()?, workload),
                revision.clone(),
            ))
        };
        for d in call(OP, target, || deployments.list(&ours)).await? {
            if let Some((workload, revision)) = key(&d.metadata) {
                if let Some(what) = objects::replicas_changed(&d) {
                    observed
                        .changed
                        .entry(workload.clone())
                        .or_default()
                        .insert(revision.clone(), what);
                }
                observed
                    .workloads
                    .entry(workload)
                    .or_default()
                    .insert(revision, state_of(&d));
            }
        }
        Ok(observed)
    }

    /// As `observe` (only a Deployment on this revision is its backend), and failed
    /// when its pods crash-loop: the cluster restarts them, but they do not come up.
    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        const OP: &str = "state";
        let live = self.deployment(OP, rev).await?;
        let (OnRevision::This, Some(live)) = (OnRevision::of(live.as_ref(), rev.revision), &live)
        else {
            return Ok(None);
        };
        let state = state_of(live);
        if state != BackendState::Running {
            return Ok(Some(state));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), rev.namespace);
        let of_rev = self.pods_of(rev);
        let listed = call(OP, &rev, || pods.list(&of_rev)).await?;
        Ok(Some(match objects::pod_failure(&listed.items) {
            Some((ErrorCode::BackendFailed, reason)) => BackendState::Failed { reason },
            _ => state,
        }))
    }

    /// Container restarts of our pods, from a watch (kube-runtime's watcher, resumed
    /// with backoff after a disconnect or an apiserver restart).
    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(&self.selector());
        let events = watcher(pods, config).default_backoff().applied_objects();
        futures::pin_mut!(events);
        let mut seen = BTreeMap::new();
        loop {
            let pod = tokio::select! {
                // Cancel-safe: a closed receiver ends the watch; nothing is lost.
                () = exits.closed() => return Ok(()),
                pod = events.next() => pod,
            };
            let pod = match pod {
                Some(Ok(pod)) => pod,
                Some(Err(e)) => {
                    tracing::warn!(target: "capstan::kube", error = %e, "pod watch interrupted; resuming");
                    continue;
                }
                None => return Ok(()),
            };
            for exit in objects::exits_of(&pod, &mut seen) {
                if exits.send(exit).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// A Deployment's revision as a backend state: scaled to 0 is stopped, a rollout the
/// cluster gave up on is failed, anything else runs (the cluster keeps it running).
fn state_of(deployment: &Deployment) -> BackendState {
    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    if replicas == 0 {
        return BackendState::Stopped;
    }
    match objects::rollout(
        deployment,
        objects::revision_of(deployment).unwrap_or_default(),
    ) {
        Rollout::Failed { reason } => BackendState::Failed { reason },
        _ => BackendState::Running,
    }
}

/// A delete of something already gone is done.
fn gone<T>(result: Result<T, DriverError>) -> Result<(), DriverError> {
    match result {
        Ok(_)
        | Err(DriverError::Refused {
            code: ErrorCode::BackendMissing,
            ..
        }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
