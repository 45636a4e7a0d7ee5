//! What a live Deployment says to the driver: the revision it is on, the replicas it
//! runs with and who set them, where the rollout of a revision stands (and so a
//! readiness probe of it), the ReplicaSet that keeps a revision's pod template, and
//! the failures a revision's pods show that the cluster will not get past.

use super::{is_ours, FIELD_MANAGER, REPLICAS, REVISION};
use capstan_common::ErrorCode;
use capstan_driver::Probe;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;

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
