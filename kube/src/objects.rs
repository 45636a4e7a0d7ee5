//! The pure half of the kube driver: names, labels, the objects it applies and the
//! decisions it takes on what the cluster answers (ownership, rollout progress, pod
//! failures, error codes). No I/O here, so all of it is unit-tested without a cluster.

use capstan_common::Spec;
use capstan_driver::RevisionRef;
use serde_json::{json, Value};
use std::collections::BTreeMap;
// What the unit tests (`tests.rs`, `use super::*`) name from the modules' imports.
#[cfg(test)]
use capstan_common::{Check, ErrorCode, Protocol, Strategy};
#[cfg(test)]
use capstan_driver::{LaunchEnv, Probe};
#[cfg(test)]
use k8s_openapi::api::core::v1::Pod;

mod api_error;
mod body;
mod deployment;
mod live;
mod watched;

pub use api_error::{api_failure, ApiFailure};
pub use body::apply_body;
pub use deployment::{deployment, ReadinessProbe, Template};
pub use live::{
    pod_failure, probe, replica_set_of, replicas_changed, revision_of, rollout, runs_with,
    OnRevision, Rollout,
};
pub use watched::{exits_of, Reported, Watched};

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
pub use crate::spec::MAX_REPLICAS;
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

#[cfg(test)]
mod tests;
