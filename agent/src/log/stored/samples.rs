//! Test samples: one event of every kind, as the domain has it and as format 1 stored
//! it.

use super::v1;
use crate::event::{Cause, Event};
use capstan_common::{ErrorCode, Outcome, Phase, Spec};

pub fn spec() -> Spec {
    serde_json::from_str(
        r#"{"driver":"docker","image":"shop/web:1","command":["serve","-v"],
            "env":{"A":"b"},"working_dir":"/srv",
            "mounts":[{"source":"/var/x","target":"/x","read_only":true}],
            "ports":[{"container_port":80,"host_port":8080,"host_ip":"127.0.0.1","protocol":"udp"}]}"#,
    )
    .unwrap()
}

pub fn v1_spec() -> v1::Spec {
    v1::Spec {
        driver: v1::DriverKind::Docker,
        image: Some("shop/web:1".into()),
        command: vec!["serve".into(), "-v".into()],
        env: [("A".to_string(), "b".to_string())].into(),
        working_dir: Some("/srv".into()),
        mounts: vec![v1::Mount {
            source: "/var/x".into(),
            target: "/x".into(),
            read_only: true,
        }],
        ports: vec![v1::PortMapping {
            container_port: 80,
            host_port: 8080,
            host_ip: Some("127.0.0.1".into()),
            protocol: v1::Protocol::Udp,
        }],
    }
}

fn s(v: &str) -> String {
    v.to_string()
}

/// One event of every kind, as the domain has it and as format 1 stored it.
pub fn every_event() -> Vec<(Event, v1::Event)> {
    let (ns, wl, rev, id) = (s("ns"), s("web"), s("r1"), s("c1"));
    vec![
        (
            Event::CommandReceived {
                command_id: id.clone(),
                op: s("stop_workload"),
                namespace: ns.clone(),
                workload: Some(wl.clone()),
                revision: None,
                command: s("{}"),
            },
            v1::Event::CommandReceived {
                command_id: id.clone(),
                op: s("stop_workload"),
                namespace: ns.clone(),
                workload: Some(wl.clone()),
                revision: None,
                command: s("{}"),
            },
        ),
        (
            Event::CommandRejected {
                command_id: None,
                code: ErrorCode::BadSignature,
                message: s("m"),
            },
            v1::Event::CommandRejected {
                command_id: None,
                code: v1::ErrorCode::BadSignature,
                message: s("m"),
            },
        ),
        (
            Event::CommandCompleted {
                command_id: id.clone(),
                outcome: Outcome::Failed,
                code: Some(ErrorCode::ImageNotFound),
                message: Some(s("m")),
            },
            v1::Event::CommandCompleted {
                command_id: id.clone(),
                outcome: v1::Outcome::Failed,
                code: Some(v1::ErrorCode::ImageNotFound),
                message: Some(s("m")),
            },
        ),
        (
            Event::NamespaceReady {
                command_id: id.clone(),
                namespace: ns.clone(),
            },
            v1::Event::NamespaceReady {
                command_id: id.clone(),
                namespace: ns.clone(),
            },
        ),
        (
            Event::NamespaceDeleted {
                command_id: id.clone(),
                namespace: ns.clone(),
            },
            v1::Event::NamespaceDeleted {
                command_id: id.clone(),
                namespace: ns.clone(),
            },
        ),
        (
            Event::RevisionPrepared {
                command_id: id.clone(),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                spec: spec(),
            },
            v1::Event::RevisionPrepared {
                command_id: id.clone(),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                spec: v1_spec(),
            },
        ),
        (
            Event::WorkloadStarted {
                cause: Cause::Command(id.clone()),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                previous: Some(s("r0")),
            },
            v1::Event::WorkloadStarted {
                cause: v1::Cause::Command(id.clone()),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                previous: Some(s("r0")),
            },
        ),
        (
            Event::WorkloadStopped {
                cause: Cause::AgentShutdown,
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: None,
            },
            v1::Event::WorkloadStopped {
                cause: v1::Cause::AgentShutdown,
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: None,
            },
        ),
        (
            Event::RevisionRetired {
                command_id: id.clone(),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
            },
            v1::Event::RevisionRetired {
                command_id: id.clone(),
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
            },
        ),
        (
            Event::WorkloadFailed {
                cause: Cause::Supervisor,
                namespace: ns.clone(),
                workload: wl.clone(),
                code: ErrorCode::BackendMissing,
                message: s("gone"),
            },
            v1::Event::WorkloadFailed {
                cause: v1::Cause::Supervisor,
                namespace: ns.clone(),
                workload: wl.clone(),
                code: v1::ErrorCode::BackendMissing,
                message: s("gone"),
            },
        ),
        (
            Event::WorkloadExited {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                exit_code: Some(-9),
            },
            v1::Event::WorkloadExited {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                exit_code: Some(-9),
            },
        ),
        (
            Event::DriftDetected {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                reaped: true,
            },
            v1::Event::DriftDetected {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: rev.clone(),
                reaped: true,
            },
        ),
        (
            Event::HookStarted {
                command_id: id.clone(),
                phase: Phase::AfterNamespacePrepared,
                owner: s("iam"),
                revision: None,
            },
            v1::Event::HookStarted {
                command_id: id.clone(),
                phase: v1::Phase::AfterNamespacePrepared,
                owner: s("iam"),
            },
        ),
        (
            Event::HookSucceeded {
                command_id: id.clone(),
                phase: Phase::BeforeWorkloadStop,
                owner: s("iam"),
            },
            v1::Event::HookSucceeded {
                command_id: id.clone(),
                phase: v1::Phase::BeforeWorkloadStop,
                owner: s("iam"),
            },
        ),
        (
            Event::HookFailed {
                command_id: id.clone(),
                phase: Phase::BeforeNamespaceDelete,
                owner: s("net"),
                code: ErrorCode::IssuedInFuture,
            },
            v1::Event::HookFailed {
                command_id: id,
                phase: v1::Phase::BeforeNamespaceDelete,
                owner: s("net"),
                code: v1::ErrorCode::IssuedInFuture,
            },
        ),
    ]
}
