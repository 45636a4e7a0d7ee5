//! What the failure and exit watches make of our Deployments and pods: the failure a
//! revision shows, each failure reported once while it is shown, and container
//! restarts as exits.

use super::live::{pod_failure, revision_of, rollout, Rollout};
use super::{REVISION, WORKLOAD};
use capstan_common::ErrorCode;
use capstan_driver::Failure;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

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
