use super::*;
use capstan_common::{DriverKind, PortMapping, Readiness};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};

const HOST: &str = "c1";

fn rev(revision: &str) -> RevisionRef<'_> {
    RevisionRef {
        namespace: "team",
        workload: "web",
        revision,
    }
}

fn spec() -> Spec {
    Spec {
        driver: DriverKind::KUBE,
        image: Some("registry.example/web:1".into()),
        command: vec!["serve".into(), "--port=8080".into()],
        env: [("MODE".to_string(), "prod".to_string())].into(),
        working_dir: Some("/srv".into()),
        ports: vec![PortMapping {
            container_port: 8080,
            host_port: 0,
            host_ip: None,
            protocol: Protocol::Tcp,
        }],
        ..Default::default()
    }
}

fn launch() -> LaunchEnv {
    [("TOKEN_REF".to_string(), "opaque-abc".to_string())].into()
}

/// A live Deployment as the apiserver would answer it for what we applied.
fn live(applied: Value, status: Value) -> Deployment {
    let mut d = applied;
    d["metadata"]["generation"] = json!(2);
    d["status"] = status;
    serde_json::from_value(d).unwrap()
}

fn readiness(check: Check, interval_ms: u32, timeout_ms: u32, threshold: u32) -> Readiness {
    Readiness {
        check,
        interval_ms,
        timeout_ms,
        threshold,
        deadline_ms: 8_000,
    }
}

/// The objects' host label (`HOST` here is the host's name).
const HOST_LABEL: &str = super::HOST;

// The tests, a topic a file; each names the helpers above (`use super::*`).
mod deployment;
mod failures;
mod rollout;
