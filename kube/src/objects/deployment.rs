//! The Deployment the driver applies for a revision: its pod template (`Template`),
//! made from a spec and the accepted launch env or read back from the cluster, with the
//! container's readinessProbe and the Deployment's update strategy.

use super::{deployment_name, CONTAINER, HOST, MANAGED, REPLICAS, REVISION, WORKLOAD};
use capstan_common::{Check, Protocol, Readiness, Spec, Strategy};
use capstan_driver::{LaunchEnv, RevisionRef};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};
use std::collections::BTreeMap;

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
        crate::spec::check(spec).map_err(|r| r.message)?;
        Ok(Template {
            image: spec.image.clone().unwrap_or_default(),
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
