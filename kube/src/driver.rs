//! The kube driver's operations: the decisions of [`crate::objects`] carried out on
//! the cluster through kube-rs, every write a server-side apply by field manager
//! `capstan` (never forced: a field another manager owns fails `field_conflict`).

use crate::objects::{self, OnRevision, Owner, Rollout, Template};
use crate::KubeConfig;
use api::call;
use capstan_common::{Check, DriverKind, ErrorCode, Spec};
use capstan_driver::{
    BackendState, Capabilities, Driver, DriverError, Exit, Failure, LaunchEnv, Observed, Probe,
    RevisionRef,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};
use owned::not_ours;
use std::time::Duration;

/// How many times a request the apiserver asks to retry (409 from a raced update,
/// 429, 5xx) is sent before the operation fails.
const ATTEMPTS: u32 = 5;

/// Workloads as Deployments in one Kubernetes cluster, for the cluster agent whose
/// host name is the cluster's name.
pub struct KubeDriver {
    host: String,
    client: Client,
    config: KubeConfig,
    #[cfg(feature = "testing")]
    test_hooks: crate::test_hooks::TestHooks,
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
            #[cfg(feature = "testing")]
            test_hooks: Default::default(),
        })
    }

    /// The driver's test hooks (cargo feature `testing`, tests only).
    #[cfg(feature = "testing")]
    pub fn test_hooks(&self) -> &crate::test_hooks::TestHooks {
        &self.test_hooks
    }

    fn apply_params() -> PatchParams {
        PatchParams::apply(objects::FIELD_MANAGER)
    }

    fn selector(&self) -> String {
        format!("{}=true,{}={}", objects::MANAGED, objects::HOST, self.host)
    }

    /// The label selector of one revision's pods.
    fn pods_selector(&self, rev: RevisionRef<'_>) -> String {
        format!(
            "{},{}={},{}={}",
            self.selector(),
            objects::WORKLOAD,
            rev.workload,
            objects::REVISION,
            rev.revision
        )
    }

    fn deployments(&self, namespace: &str) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn config_maps(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

#[async_trait::async_trait]
impl Driver for KubeDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::KUBE
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), capstan_common::Rejection> {
        crate::spec::check(spec).map(drop)
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
            probes: true,
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
        let patch = Patch::Apply(objects::apply_body(&object));
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
        // Refuses a ConfigMap under our name that is not ours.
        self.staged(OP, rev).await?;
        let object = objects::staged(&self.host, rev, spec);
        let name = objects::staged_name(rev.workload, rev.revision);
        let api = self.config_maps(rev.namespace);
        let params = Self::apply_params();
        let patch = Patch::Apply(objects::apply_body(&object));
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
        self.reapply("resume", rev).await
    }

    /// An activation or start applied before the agent stopped is started once its
    /// rollout is complete, as `activate` and `start` return: the Deployment on `rev`,
    /// every replica updated and available, no old pods left (`rollout_timeout_secs`).
    async fn settle(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.wait_rollout("settle", rev).await
    }

    /// Ready once the Deployment is on `rev` and its rollout complete: the cluster
    /// probes the pods (`check` is their readinessProbe), so nothing is probed here.
    /// A rollout the cluster gave up on, or pods that cannot come up (an image that
    /// cannot be pulled, a crash loop), fail the probe with their code: waiting on
    /// would not change them.
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        _check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        const OP: &str = "probe";
        let looked = async {
            let live = self.deployment(OP, rev).await?;
            let probe = objects::probe(live.as_ref(), rev.revision)
                .map_err(|(code, reason)| DriverError::refused(OP, rev, code, reason))?;
            if probe.is_ready() {
                return Ok(probe);
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), rev.namespace);
            let of_rev = ListParams::default().labels(&self.pods_selector(rev));
            let listed = call(OP, &rev, || pods.list(&of_rev)).await?;
            match objects::pod_failure(&listed.items) {
                Some((code, reason)) => Err(DriverError::refused(OP, rev, code, reason)),
                None => Ok(probe),
            }
        };
        match tokio::time::timeout(timeout, looked).await {
            Ok(probe) => probe,
            Err(_) => Ok(Probe::NotReady(format!(
                "the apiserver did not answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.reapply("stop", rev).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        const OP: &str = "retire";
        // Both are checked before anything is deleted: a retire refused `not_owned`
        // leaves everything as it was.
        let staged = self.staged(OP, rev).await?;
        let live = self.deployment(OP, rev).await?;
        // A Deployment already on another (newer) revision is left alone.
        if OnRevision::of(live.as_ref(), rev.revision) == OnRevision::This {
            let name = objects::deployment_name(rev.workload);
            let api = self.deployments(rev.namespace);
            // Foreground: the Deployment goes only after its ReplicaSets and pods, so
            // once it is gone nothing of this revision runs.
            let dp = DeleteParams::foreground();
            gone(call(OP, &rev, || api.delete(&name, &dp)).await)?;
            let uid = live
                .as_ref()
                .and_then(|d| d.metadata.uid.clone())
                .unwrap_or_default();
            let seconds = self.config.rollout_timeout_secs;
            let deleted = await_condition(api, &name, conditions::is_deleted(&uid));
            match tokio::time::timeout(Duration::from_secs(seconds.into()), deleted).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Err(DriverError::Unavailable {
                        op: OP,
                        target: rev.to_string(),
                        source: e.into(),
                    })
                }
                Err(_) => {
                    return Err(DriverError::refused(
                        OP,
                        rev,
                        ErrorCode::RolloutTimeout,
                        format!("the Deployment was not gone {seconds} s after its deletion"),
                    ))
                }
            }
        }
        if staged.is_none() {
            return Ok(());
        }
        let name = objects::staged_name(rev.workload, rev.revision);
        let api = self.config_maps(rev.namespace);
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
        let of_rev = ListParams::default().labels(&self.pods_selector(rev));
        let listed = call(OP, &rev, || pods.list(&of_rev)).await?;
        Ok(Some(match objects::pod_failure(&listed.items) {
            Some((ErrorCode::BackendFailed, reason)) => BackendState::Failed { reason },
            _ => state,
        }))
    }

    /// Container restarts of our pods, from a watch (kube-runtime's watcher, resumed
    /// with backoff after a disconnect or an apiserver restart).
    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        self.exits(exits).await
    }

    /// Rollouts the cluster gave up on and pods that cannot come up, from a watch of
    /// our Deployments and pods: what fails after `activate` returned.
    async fn watch_failures(
        &self,
        failures: tokio::sync::mpsc::Sender<Failure>,
    ) -> Result<(), DriverError> {
        self.failures(failures).await
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

mod api;
mod apply;
mod owned;
#[cfg(test)]
mod tests;
mod watch;
