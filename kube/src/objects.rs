//! The pure half of the kube driver: names, labels, the objects it applies and the
//! decisions it takes on what the cluster answers (ownership, rollout progress, pod
//! failures, error codes). No I/O here, so all of it is unit-tested without a cluster.

use capstan_common::{Check, ErrorCode, Protocol, Readiness, Spec, Strategy};
use capstan_driver::Probe;
use capstan_driver::{Failure, LaunchEnv, RevisionRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};
use std::collections::BTreeMap;

mod body;
pub use body::apply_body;

/// The server-side apply field manager of everything the driver writes.
pub const FIELD_MANAGER: &str = "capstan";
/// Every object capstan creates carries this label, set to `true`.
pub const MANAGED: &str = "io.capstan.managed";
/// The cluster agent's host name (the cluster's name): two agents on one cluster
/// never touch each other's objects.
pub const HOST: &str = "io.capstan.host";
pub const WORKLOAD: &str = "io.capstan.workload";
/// A label of the Deployment and its pod template, and an annotation of both.
pub const REVISION: &str = "io.capstan.revision";
/// An annotation: the replicas the workload runs with when it runs (`stop` scales to
/// 0 and keeps this, `start` scales back to it).
pub const REPLICAS: &str = "io.capstan.replicas";
/// An annotation of a staged revision's ConfigMap: the hash of its spec.
pub const SPEC_HASH: &str = "io.capstan.spec-hash";
/// The most replicas a spec may ask for.
pub const MAX_REPLICAS: u32 = 1000;
/// The one container of a workload's pods.
pub const CONTAINER: &str = "main";

/// The Deployment of a workload.
pub fn deployment_name(workload: &str) -> String {
    format!("capstan-{workload}")
}

/// The ConfigMap holding a staged revision.
pub fn staged_name(workload: &str, revision: &str) -> String {
    format!("capstan-{workload}-{revision}")
}

/// Whether `labels` say the object is this host's capstan's.
pub fn is_ours(labels: Option<&BTreeMap<String, String>>, host: &str) -> bool {
    labels.is_some_and(|l| {
        l.get(MANAGED).map(String::as_str) == Some("true")
            && l.get(HOST).map(String::as_str) == Some(host)
    })
}

/// What a live object is to this host's capstan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Absent,
    Ours,
    /// Someone else's (unlabelled, or another host's): never adopted, never deleted.
    NotOurs,
}

impl Owner {
    pub fn of(labels: Option<Option<&BTreeMap<String, String>>>, host: &str) -> Owner {
        match labels {
            None => Owner::Absent,
            Some(labels) if is_ours(labels, host) => Owner::Ours,
            Some(_) => Owner::NotOurs,
        }
    }
}

/// The tenant Namespace, labelled ours, for server-side apply.
pub fn namespace(host: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {MANAGED: "true", HOST: host}},
    })
}

/// What the pod template is made of: the spec's container, with spec env and the
/// accepted launch env merged (placeholders only), its readinessProbe; and how the
/// Deployment replaces the pods of another template (its `spec.strategy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub image: String,
    /// The container's args (the image's entrypoint stays; empty: the image's CMD).
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    /// Container ports and their protocols.
    pub ports: Vec<(u16, Protocol)>,
    /// The container's readinessProbe, from `spec.readiness`.
    pub readiness: Option<ReadinessProbe>,
    /// `Recreate` for stop-first; else a rolling update that keeps every old pod
    /// until a new one is ready.
    pub strategy: Strategy,
}

/// A container's readinessProbe as this driver writes it: the spec's check, its
/// interval and timeout rounded up to whole seconds (at least 1, the API's unit and
/// minimum), its threshold as `successThreshold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessProbe {
    pub check: Check,
    pub period_seconds: u32,
    pub timeout_seconds: u32,
    pub success_threshold: u32,
}

impl ReadinessProbe {
    pub fn of(readiness: &Readiness) -> ReadinessProbe {
        let seconds = |ms: u32| ms.div_ceil(1000).max(1);
        ReadinessProbe {
            check: readiness.check.clone(),
            period_seconds: seconds(readiness.interval_ms),
            timeout_seconds: seconds(readiness.timeout_ms),
            success_threshold: readiness.threshold,
        }
    }

    /// Read back from a live container's probe; `None` for a handler this driver
    /// never writes (a named port, gRPC).
    fn from_live(probe: &k8s_openapi::api::core::v1::Probe) -> Option<ReadinessProbe> {
        let port = |p: &IntOrString| match p {
            IntOrString::Int(n) => u16::try_from(*n).ok(),
            IntOrString::String(_) => None,
        };
        let check = if let Some(exec) = &probe.exec {
            Check::Exec {
                command: exec.command.clone().unwrap_or_default(),
            }
        } else if let Some(http) = &probe.http_get {
            Check::Http {
                port: port(&http.port)?,
                path: http.path.clone().unwrap_or_else(|| "/".into()),
            }
        } else {
            Check::Tcp {
                port: port(&probe.tcp_socket.as_ref()?.port)?,
            }
        };
        let positive = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
        Some(ReadinessProbe {
            check,
            period_seconds: positive(probe.period_seconds),
            timeout_seconds: positive(probe.timeout_seconds),
            success_threshold: positive(probe.success_threshold),
        })
    }

    fn to_json(&self) -> Value {
        let mut probe = match &self.check {
            Check::Exec { command } => json!({"exec": {"command": command}}),
            Check::Http { port, path } => json!({"httpGet": {"port": port, "path": path}}),
            Check::Tcp { port } => json!({"tcpSocket": {"port": port}}),
        };
        probe["periodSeconds"] = json!(self.period_seconds);
        probe["timeoutSeconds"] = json!(self.timeout_seconds);
        probe["successThreshold"] = json!(self.success_threshold);
        probe
    }
}

/// A Deployment's `spec.strategy` for `strategy`. Start-first is an explicit rolling
/// update of one pod at a time that never takes an old pod away before a new one is
/// available (the default, 25 %/25 %, would at 4 replicas or more), so the old
/// revision serves until the new one is ready, whatever the replica count.
fn strategy(strategy: Strategy) -> Value {
    match strategy {
        Strategy::StopFirst => json!({"type": "Recreate"}),
        Strategy::StartFirst => json!({
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }),
    }
}

impl Template {
    /// From a spec and the accepted launch environment. A spec the kube driver cannot
    /// run (no image, host mounts) is `invalid_spec`.
    pub fn from_spec(spec: &Spec, launch_env: &LaunchEnv) -> Result<Template, String> {
        let image = spec.image.clone().ok_or("a kube workload needs an image")?;
        if !spec.mounts.is_empty() {
            return Err("the kube driver does not mount host paths".into());
        }
        if !(1..=MAX_REPLICAS).contains(&spec.kube.replicas) {
            return Err(format!("kube.replicas must be 1 to {MAX_REPLICAS}"));
        }
        Ok(Template {
            image,
            args: spec.command.clone(),
            env: capstan_driver::merged_env(spec, launch_env),
            working_dir: spec.working_dir.clone(),
            ports: spec
                .ports
                .iter()
                .map(|p| (p.container_port, p.protocol))
                .collect(),
            readiness: spec.readiness.as_ref().map(ReadinessProbe::of),
            strategy: spec.strategy,
        })
    }

    /// Read back from a Deployment this driver applied: its `main` container and its
    /// strategy.
    pub fn from_live(deployment: &Deployment) -> Option<Template> {
        let spec = deployment.spec.as_ref()?;
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let strategy = if recreate {
            Strategy::StopFirst
        } else {
            Strategy::StartFirst
        };
        Template::from_pod_template(&spec.template, strategy)
    }

    /// Read back from a pod template this driver wrote (a Deployment's, or a
    /// ReplicaSet's copy of it): its `main` container; `strategy` is the Deployment's,
    /// which a pod template does not carry.
    pub fn from_pod_template(template: &PodTemplateSpec, strategy: Strategy) -> Option<Template> {
        let pod = template.spec.as_ref()?;
        let c = pod.containers.iter().find(|c| c.name == CONTAINER)?;
        Some(Template {
            image: c.image.clone()?,
            args: c.args.clone().unwrap_or_default(),
            // The apiserver leaves an empty `value` out; this driver never writes
            // `valueFrom`.
            env: c
                .env
                .iter()
                .flatten()
                .filter(|e| e.value_from.is_none())
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect(),
            working_dir: c.working_dir.clone(),
            ports: c
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let protocol = match p.protocol.as_deref() {
                        Some("UDP") => Protocol::Udp,
                        _ => Protocol::Tcp,
                    };
                    (p.container_port as u16, protocol)
                })
                .collect(),
            readiness: c
                .readiness_probe
                .as_ref()
                .and_then(ReadinessProbe::from_live),
            strategy,
        })
    }

    fn container(&self) -> Value {
        let mut c = json!({"name": CONTAINER, "image": self.image});
        if !self.args.is_empty() {
            c["args"] = json!(self.args);
        }
        if !self.env.is_empty() {
            c["env"] = self
                .env
                .iter()
                .map(|(name, value)| json!({"name": name, "value": value}))
                .collect();
        }
        if let Some(dir) = &self.working_dir {
            c["workingDir"] = json!(dir);
        }
        if !self.ports.is_empty() {
            c["ports"] = self
                .ports
                .iter()
                .map(|(port, protocol)| {
                    let protocol = match protocol {
                        Protocol::Udp => "UDP",
                        _ => "TCP",
                    };
                    json!({"containerPort": port, "protocol": protocol})
                })
                .collect();
        }
        if let Some(probe) = &self.readiness {
            c["readinessProbe"] = probe.to_json();
        }
        c
    }
}

/// A workload's Deployment at `rev`, for server-side apply: the revision in its
/// labels and annotations and its pod template's, `replicas` running (0: stopped),
/// `runs_with` the replicas it runs with when started.
pub fn deployment(
    host: &str,
    rev: RevisionRef<'_>,
    template: &Template,
    replicas: u32,
    runs_with: u32,
    progress_deadline_secs: u32,
) -> Value {
    let labels = json!({
        MANAGED: "true",
        HOST: host,
        WORKLOAD: rev.workload,
        REVISION: rev.revision,
    });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(rev.workload),
            "namespace": rev.namespace,
            "labels": labels,
            "annotations": {REVISION: rev.revision, REPLICAS: runs_with.to_string()},
        },
        "spec": {
            "replicas": replicas,
            "progressDeadlineSeconds": progress_deadline_secs,
            "strategy": strategy(template.strategy),
            // Immutable once created: never the revision.
            "selector": {"matchLabels": {MANAGED: "true", HOST: host, WORKLOAD: rev.workload}},
            "template": {
                "metadata": {"labels": labels, "annotations": {REVISION: rev.revision}},
                "spec": {"containers": [template.container()]},
            },
        },
    })
}

/// A staged revision: a ConfigMap holding the spec (without any launch environment,
/// which only exists once the revision is activated) and its hash.
pub fn staged(host: &str, rev: RevisionRef<'_>, spec: &Spec) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": staged_name(rev.workload, rev.revision),
            "namespace": rev.namespace,
            "labels": {MANAGED: "true", HOST: host, WORKLOAD: rev.workload, REVISION: rev.revision},
            "annotations": {SPEC_HASH: capstan_driver::spec_hash(spec)},
        },
        "data": {"spec.json": serde_json::to_string(spec).expect("a Spec always serialises")},
    })
}

/// The revision a live Deployment is on (its label), if it is labelled.
pub fn revision_of(deployment: &Deployment) -> Option<&str> {
    deployment
        .metadata
        .labels
        .as_ref()?
        .get(REVISION)
        .map(String::as_str)
}

/// The replicas a workload runs with when started (its annotation; else 1).
pub fn runs_with(deployment: &Deployment) -> u32 {
    deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLICAS))
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
}

/// What changed a Deployment's replicas outside capstan, if something did: another
/// field manager (`kubectl scale`, an autoscaler, a forced apply) owns
/// `spec.replicas`, which capstan's apply no longer does.
pub fn replicas_changed(deployment: &Deployment) -> Option<String> {
    let owns_replicas = |fields: Option<&serde_json::Value>| {
        fields.is_some_and(|f| f.get("f:spec").and_then(|s| s.get("f:replicas")).is_some())
    };
    let entries = deployment
        .metadata
        .managed_fields
        .as_deref()
        .unwrap_or_default();
    let ours = entries.iter().any(|e| {
        e.manager.as_deref() == Some(FIELD_MANAGER)
            && e.operation.as_deref() == Some("Apply")
            && owns_replicas(e.fields_v1.as_ref().map(|f| &f.0))
    });
    if ours {
        return None;
    }
    let other = entries.iter().find(|e| {
        e.manager.as_deref() != Some(FIELD_MANAGER)
            && owns_replicas(e.fields_v1.as_ref().map(|f| &f.0))
    })?;
    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    Some(format!(
        "replicas set to {replicas} by {}",
        other.manager.as_deref().unwrap_or("another field manager")
    ))
}

/// What a live Deployment is to an operation on one revision of its workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRevision {
    /// There is no Deployment.
    Absent,
    /// It is on this revision.
    This,
    /// It is on another revision (a newer one, for a retire): left alone.
    Other,
}

impl OnRevision {
    pub fn of(deployment: Option<&Deployment>, revision: &str) -> OnRevision {
        match deployment {
            None => OnRevision::Absent,
            Some(d) if revision_of(d) == Some(revision) => OnRevision::This,
            Some(_) => OnRevision::Other,
        }
    }
}

/// Where a rollout of one revision stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Every wanted replica is updated and available, and no old one is left.
    Complete,
    /// Still going: the numbers `kubectl rollout status` shows.
    Progressing {
        updated: i32,
        available: i32,
        wanted: i32,
    },
    /// The cluster gave up (`ProgressDeadlineExceeded`).
    Failed { reason: String },
    /// The Deployment moved to another revision meanwhile.
    Superseded,
}

impl std::fmt::Display for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rollout::Complete => f.write_str("complete"),
            Rollout::Progressing {
                updated,
                available,
                wanted,
            } => write!(
                f,
                "{updated} of {wanted} pods on the revision, {available} available of any revision"
            ),
            Rollout::Failed { reason } => write!(f, "failed: {reason}"),
            Rollout::Superseded => f.write_str("the Deployment moved to another revision"),
        }
    }
}

/// One readiness probe of `revision` on the live Deployment (`None`: there is none):
/// ready once the Deployment is on it and its rollout is complete, which the
/// cluster decides from the pods' readinessProbe; `Err` with a code and the reason
/// when the cluster gave the rollout up.
pub fn probe(live: Option<&Deployment>, revision: &str) -> Result<Probe, (ErrorCode, String)> {
    let Some(live) = live else {
        return Ok(Probe::NotReady("the Deployment does not exist".into()));
    };
    Ok(match rollout(live, revision) {
        Rollout::Complete => Probe::Ready,
        Rollout::Failed { reason } => {
            return Err((
                ErrorCode::BackendFailed,
                format!("the rollout failed: {reason}"),
            ))
        }
        Rollout::Superseded => Probe::NotReady(format!(
            "the Deployment is on revision {}",
            revision_of(live).unwrap_or("(none)")
        )),
        state => Probe::NotReady(format!("the rollout is not complete: {state}")),
    })
}

/// The ReplicaSet that holds `revision`'s pod template for `deployment`: ours, owned
/// by that Deployment (its uid), labelled with the revision (the pod template's labels,
/// which the ReplicaSet carries); the newest by the deployment controller's
/// `deployment.kubernetes.io/revision` if there are several.
pub fn replica_set_of<'a>(
    replica_sets: &'a [ReplicaSet],
    deployment: &Deployment,
    revision: &str,
    host: &str,
) -> Option<&'a ReplicaSet> {
    let uid = deployment.metadata.uid.as_deref()?;
    let owned = |rs: &ReplicaSet| {
        rs.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Deployment" && o.uid == uid)
    };
    let labelled = |rs: &ReplicaSet| {
        let labels = rs.metadata.labels.as_ref();
        is_ours(labels, host)
            && labels.and_then(|l| l.get(REVISION)).map(String::as_str) == Some(revision)
    };
    let generation = |rs: &ReplicaSet| -> u64 {
        rs.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("deployment.kubernetes.io/revision"))
            .and_then(|r| r.parse().ok())
            .unwrap_or(0)
    };
    replica_sets
        .iter()
        .filter(|rs| {
            owned(rs) && labelled(rs) && rs.spec.as_ref().is_some_and(|s| s.template.is_some())
        })
        .max_by_key(|rs| generation(rs))
}

/// Where the rollout of `revision` stands on `deployment` (as `kubectl rollout
/// status` decides it).
pub fn rollout(deployment: &Deployment, revision: &str) -> Rollout {
    if revision_of(deployment) != Some(revision) {
        return Rollout::Superseded;
    }
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let Some(status) = deployment.status.as_ref() else {
        return Rollout::Progressing {
            updated: 0,
            available: 0,
            wanted,
        };
    };
    let generation = deployment.metadata.generation.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0) >= generation;
    if let Some(failed) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    }) {
        if observed {
            return Rollout::Failed {
                reason: failed
                    .reason
                    .clone()
                    .unwrap_or_else(|| "ProgressDeadlineExceeded".into()),
            };
        }
    }
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    if observed && updated >= wanted && total == wanted && available >= wanted {
        Rollout::Complete
    } else {
        Rollout::Progressing {
            updated,
            available,
            wanted,
        }
    }
}

/// The first failure the pods of a rollout show that the cluster will not get past by
/// itself: an image that cannot be pulled (`image_not_found`) or a crash loop
/// (`backend_failed`), with the pod and the kubelet's reason.
pub fn pod_failure<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<(ErrorCode, String)> {
    for pod in pods {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        for c in statuses.into_iter().flatten() {
            let reason = c
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref());
            let code = match reason {
                Some("ErrImagePull" | "ImagePullBackOff" | "InvalidImageName") => {
                    ErrorCode::ImageNotFound
                }
                Some(
                    "CrashLoopBackOff" | "CreateContainerConfigError" | "CreateContainerError",
                ) => ErrorCode::BackendFailed,
                _ => continue,
            };
            let pod_name = pod.metadata.name.as_deref().unwrap_or("?");
            return Some((
                code,
                format!(
                    "pod {pod_name} container {}: {}",
                    c.name,
                    reason.unwrap_or_default()
                ),
            ));
        }
    }
    None
}

/// Our workload's namespace, name and revision from an object's labels (a pod, a
/// Deployment); none for an object without them.
fn revision_labels(meta: &ObjectMeta) -> Option<(&str, &str, &str)> {
    let labels = meta.labels.as_ref()?;
    Some((
        meta.namespace.as_deref()?,
        labels.get(WORKLOAD)?,
        labels.get(REVISION)?,
    ))
}

/// A Deployment or pod of ours as the failure watch sees it.
pub enum Watched<'a> {
    Deployment(&'a Deployment),
    Pod(&'a Pod),
}

impl Watched<'_> {
    /// The failure it shows, as one of its revision: a rollout the cluster gave up on
    /// (`backend_failed`), or what [`pod_failure`] finds in a pod.
    pub fn failure(&self) -> Option<Failure> {
        let (meta, (code, reason)) = match self {
            Watched::Deployment(d) => {
                let Rollout::Failed { reason } = rollout(d, revision_of(d)?) else {
                    return None;
                };
                let name = d.metadata.name.as_deref().unwrap_or_default();
                let reason = format!("Deployment {name}: {reason}");
                (&d.metadata, (ErrorCode::BackendFailed, reason))
            }
            Watched::Pod(p) => (&p.metadata, pod_failure([*p])?),
        };
        let (namespace, workload, revision) = revision_labels(meta)?;
        Some(Failure {
            namespace: namespace.into(),
            workload: workload.into(),
            revision: revision.into(),
            code,
            reason,
        })
    }
}

/// The failures the failure watch has reported, by object: each is sent once while
/// its object keeps showing it, and again only after it cleared.
#[derive(Debug, Default)]
pub struct Reported(BTreeMap<String, (ErrorCode, String)>);

impl Reported {
    /// What `object` (a kind and `namespace/name`) shows now: the failure to send, if
    /// it is one not sent yet.
    pub fn update(&mut self, object: String, now: Option<Failure>) -> Option<Failure> {
        let Some(failure) = now else {
            self.0.remove(&object);
            return None;
        };
        let shown = (failure.code, failure.reason.clone());
        (self.0.insert(object, shown.clone()) != Some(shown)).then_some(failure)
    }

    /// The object is gone.
    pub fn forget(&mut self, object: &str) {
        self.0.remove(object);
    }

    /// Everything is listed again (the watch restarted): every failure still shown is
    /// sent once more (the agent records each once).
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// The restarts a pod's containers went through that `seen` (container → restart
/// count, per pod) has not reported yet, as exits of the pod's revision: one per pod
/// and container whose restart count grew, with the last termination's exit code.
/// Updates `seen`. Pods without our workload and revision labels are none of ours.
pub fn exits_of(pod: &Pod, seen: &mut BTreeMap<String, i32>) -> Vec<capstan_driver::Exit> {
    let meta = &pod.metadata;
    let Some((namespace, workload, revision)) = revision_labels(meta) else {
        return vec![];
    };
    let pod_name = meta.name.as_deref().unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let mut exits = Vec::new();
    for c in statuses.into_iter().flatten() {
        let last = seen.entry(format!("{pod_name}/{}", c.name)).or_insert(0);
        if c.restart_count > *last {
            *last = c.restart_count;
            exits.push(capstan_driver::Exit {
                namespace: namespace.to_string(),
                workload: workload.to_string(),
                revision: revision.to_string(),
                exit_code: c
                    .last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| i64::from(t.exit_code)),
            });
        }
    }
    exits
}

/// How the driver treats an API error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFailure {
    /// The same request may succeed when sent again at once (a 409 from an update
    /// that raced another writer, a 429, a 5xx): retried a few times.
    Retry,
    /// Reported with this code.
    Code(ErrorCode),
}

/// What an API error (status `code`, `reason`, and whether its causes name a field
/// manager conflict) means for the driver.
pub fn api_failure(code: u16, reason: &str, field_manager_conflict: bool) -> ApiFailure {
    match (code, reason) {
        (403, _) => ApiFailure::Code(ErrorCode::Forbidden),
        (409, _) if field_manager_conflict => ApiFailure::Code(ErrorCode::FieldConflict),
        (409, _) | (429, _) | (500..=599, _) => ApiFailure::Retry,
        (404, _) => ApiFailure::Code(ErrorCode::BackendMissing),
        (422, _) | (400, _) => ApiFailure::Code(ErrorCode::InvalidSpec),
        _ => ApiFailure::Code(ErrorCode::DriverFailed),
    }
}

#[cfg(test)]
mod tests;
