//! Commands: the unit of work the coordinator sends and an agent carries out.

use crate::validate;
use crate::{ErrorCode, Rejection};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The protocol version this build speaks (`"v"` in every command).
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest command accepted, in bytes of JSON.
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// One lifecycle command: `{"v":1,"id":…,"host":…,"issued_at":…,"op":…, …op fields}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub v: u32,
    /// The idempotency key: a command with an id already in the log is answered from
    /// the log and never carried out twice.
    pub id: String,
    pub host: String,
    pub issued_at: DateTime<Utc>,
    /// When the controller stops waiting for it: from then on the agent cuts what is
    /// in flight short as its own stop does (`cancelled`, retryable), and a command not
    /// yet begun is not begun. Absent (and left out of the JSON): no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub op: Op,
}

/// The operation and its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // few and short-lived: boxing the spec buys nothing
pub enum Op {
    EnsureNamespace {
        namespace: String,
    },
    DeleteNamespace {
        namespace: String,
    },
    PrepareRevision {
        namespace: String,
        workload: String,
        revision: String,
        spec: Spec,
    },
    ActivateRevision {
        namespace: String,
        workload: String,
        revision: String,
    },
    StopWorkload {
        namespace: String,
        workload: String,
    },
    StartWorkload {
        namespace: String,
        workload: String,
    },
    RetireRevision {
        namespace: String,
        workload: String,
        revision: String,
    },
    /// Cuts the command `target` (same host) short as the agent's stop does, or keeps
    /// it from beginning; a finished one is left as it is. Addresses no namespace.
    CancelCommand {
        target: String,
    },
}

/// The ops this version knows, in their wire spelling ([`Op::name`]).
pub const KNOWN_OPS: [&str; 8] = [
    "ensure_namespace",
    "delete_namespace",
    "prepare_revision",
    "activate_revision",
    "stop_workload",
    "start_workload",
    "retire_revision",
    "cancel_command",
];

/// A driver's identity: which driver a revision is meant for (`spec.driver`), which
/// one an agent runs (`driver` in its config), and what a driver says it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    #[default]
    Sim,
    Docker,
    Systemd,
    Kube,
}

impl DriverKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sim => "sim",
            Self::Docker => "docker",
            Self::Systemd => "systemd",
            Self::Kube => "kube",
        }
    }

    pub const ALL: [DriverKind; 4] = [Self::Sim, Self::Docker, Self::Systemd, Self::Kube];
}

impl std::fmt::Display for DriverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DriverKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown driver {s:?} (sim, docker, systemd or kube)"))
    }
}

/// What a revision runs. Drivers add their own optional fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub driver: DriverKind,
    // Every field is serialised, empty ones too (no `skip_serializing_if`): the JSON
    // of recorded commands and specs (`capstan-agent log --json`) keeps its shape. The
    // exceptions are fields added later (the drivers' sections, `readiness`,
    // `strategy`): each is left out while at its default, so specs written before it
    // keep their canonical JSON, and with it their hashes and the content their command
    // ids are bound to.
    // A field added later must be `#[serde(default)]`: the agent's log stores a spec
    // as its JSON, so records written before the field existed decode with the default.
    #[serde(default)]
    pub image: Option<String>,
    /// argv; empty means the image's default.
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory inside the workload (absolute); `None`: the image's.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Host paths or named volumes mounted into the workload.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Ports published on the host.
    #[serde(default)]
    pub ports: Vec<PortMapping>,
    /// Settings only the systemd driver reads. Absent when every setting has its
    /// default, so specs that do not use it keep their canonical JSON (and hashes).
    #[serde(default, skip_serializing_if = "SystemdSpec::is_default")]
    pub systemd: SystemdSpec,
    /// Settings only the kube driver reads; absent at its defaults, as `systemd`.
    #[serde(default, skip_serializing_if = "KubeSpec::is_default")]
    pub kube: KubeSpec,
    /// What tells that a started revision serves; `None`: it is ready once started.
    /// Absent when `None`, as `systemd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<crate::Readiness>,
    /// How an activation replaces the revision that runs; absent at its default.
    #[serde(default, skip_serializing_if = "Strategy::is_default")]
    pub strategy: Strategy,
}

/// How `activate_revision` replaces the running revision of a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// The new revision starts (and, with `readiness`, becomes ready) while the old
    /// one runs; the old one is stopped after.
    #[default]
    StartFirst,
    /// The old revision is stopped before the new one starts, for workloads that
    /// cannot run twice (one port, one lock, one writer). A new revision that fails
    /// to start or to become ready is stopped and the old one started again.
    StopFirst,
}

impl Strategy {
    pub fn is_default(&self) -> bool {
        *self == Strategy::default()
    }
}

/// A systemd unit's own settings. Each one relaxes or bounds the hardened default the
/// systemd driver writes (`docs/systemd.md`).
// Fields added later are left out of the JSON while empty (`skip_serializing_if`), so
// the canonical JSON — and the hash and id binding — of a spec written before them
// stays what it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemdSpec {
    /// `User=`: a user name or a numeric uid; `None`: the namespace's own dynamic
    /// user (`DynamicUser=`), never root unless asked for.
    #[serde(default)]
    pub user: Option<String>,
    /// `Group=`: a group name or a numeric gid.
    #[serde(default)]
    pub group: Option<String>,
    /// Capabilities the unit holds (`CapabilityBoundingSet=` and
    /// `AmbientCapabilities=`), from [`crate::validate::SYSTEMD_CAPABILITIES`]; empty:
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// System calls allowed besides `@system-service` (`SystemCallFilter=`): `@group`
    /// names of systemd's sets or single syscall names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<String>,
    /// Absolute paths the workload may write besides its namespace's state directory
    /// (`ReadWritePaths=`; the rest of the file system is read-only).
    #[serde(default)]
    pub read_write_paths: Vec<String>,
    /// `MemoryMax=` in bytes.
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
    /// `CPUQuota=` in percent of one CPU (200 = two CPUs).
    #[serde(default)]
    pub cpu_quota_percent: Option<u32>,
}

impl SystemdSpec {
    pub fn is_default(&self) -> bool {
        *self == SystemdSpec::default()
    }
}

/// A Kubernetes workload's own settings (`docs/kube.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// The pods the Deployment runs when the workload runs (1 to 1000);
    /// `start_workload` scales back to this.
    #[serde(default = "one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

impl Default for KubeSpec {
    fn default() -> Self {
        KubeSpec { replicas: one() }
    }
}

impl KubeSpec {
    pub fn is_default(&self) -> bool {
        *self == KubeSpec::default()
    }
}

/// One mount: a host path (absolute `source`) or a named volume (`source` a volume
/// name) at the absolute `target` path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A port published on the host: `host_ip:host_port` → `container_port/protocol`.
/// `host_port` 0 lets the backend pick one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub container_port: u16,
    #[serde(default)]
    pub host_port: u16,
    /// The host address to bind; `None`: every address.
    #[serde(default)]
    pub host_ip: Option<String>,
    #[serde(default)]
    pub protocol: Protocol,
}

/// A transport protocol of a [`PortMapping`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// The key of a workload in per-host maps and indexes: `namespace/workload`.
pub fn workload_key(namespace: &str, workload: &str) -> String {
    format!("{namespace}/{workload}")
}

/// The `id` of a line that failed to parse, when it has a valid one, so that a
/// rejection can still name the command it rejects.
pub fn salvage_id(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let id = value.get("id")?.as_str()?;
    validate::command_id(id).ok()?;
    Some(id.to_string())
}

/// A workload's address on a host: `namespace/workload`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadRef {
    pub namespace: String,
    pub workload: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.workload)
    }
}

impl Op {
    /// The wire spelling of this op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::EnsureNamespace { .. } => "ensure_namespace",
            Op::DeleteNamespace { .. } => "delete_namespace",
            Op::PrepareRevision { .. } => "prepare_revision",
            Op::ActivateRevision { .. } => "activate_revision",
            Op::StopWorkload { .. } => "stop_workload",
            Op::StartWorkload { .. } => "start_workload",
            Op::RetireRevision { .. } => "retire_revision",
            Op::CancelCommand { .. } => "cancel_command",
        }
    }

    /// The namespace the op addresses: every op's but a cancel's.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Op::EnsureNamespace { namespace }
            | Op::DeleteNamespace { namespace }
            | Op::PrepareRevision { namespace, .. }
            | Op::ActivateRevision { namespace, .. }
            | Op::StopWorkload { namespace, .. }
            | Op::StartWorkload { namespace, .. }
            | Op::RetireRevision { namespace, .. } => Some(namespace),
            Op::CancelCommand { .. } => None,
        }
    }

    /// The command a cancel is for.
    pub fn cancels(&self) -> Option<&str> {
        match self {
            Op::CancelCommand { target } => Some(target),
            _ => None,
        }
    }

    /// The workload, for ops that address one.
    pub fn workload(&self) -> Option<WorkloadRef> {
        match self {
            Op::EnsureNamespace { .. } | Op::DeleteNamespace { .. } | Op::CancelCommand { .. } => {
                None
            }
            Op::PrepareRevision {
                namespace,
                workload,
                ..
            }
            | Op::ActivateRevision {
                namespace,
                workload,
                ..
            }
            | Op::StopWorkload {
                namespace,
                workload,
            }
            | Op::StartWorkload {
                namespace,
                workload,
            }
            | Op::RetireRevision {
                namespace,
                workload,
                ..
            } => Some(WorkloadRef {
                namespace: namespace.clone(),
                workload: workload.clone(),
            }),
        }
    }

    /// The revision, for ops that address one.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Op::PrepareRevision { revision, .. }
            | Op::ActivateRevision { revision, .. }
            | Op::RetireRevision { revision, .. } => Some(revision),
            _ => None,
        }
    }
}

impl Command {
    /// Parses and validates one command from its JSON text.
    ///
    /// Checks run from the outside in, so that the code names the first thing wrong:
    /// size, JSON, version, op, field shapes, then every value's grammar.
    pub fn parse(text: &str) -> Result<Command, Rejection> {
        if text.len() > MAX_COMMAND_BYTES {
            return Err(Rejection::new(
                ErrorCode::TooLarge,
                format!(
                    "command is {} bytes; the limit is {MAX_COMMAND_BYTES}",
                    text.len()
                ),
            ));
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Rejection::new(ErrorCode::InvalidJson, format!("not JSON: {e}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| Rejection::new(ErrorCode::InvalidJson, "a command is a JSON object"))?;
        match object.get("v").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
            Some(v) => {
                return Err(Rejection::new(
                    ErrorCode::UnsupportedVersion,
                    format!(
                    "protocol version {v} is not supported; this agent speaks {PROTOCOL_VERSION}"
                ),
                ))
            }
            None => {
                return Err(Rejection::new(
                    ErrorCode::UnsupportedVersion,
                    "missing numeric field `v`",
                ))
            }
        }
        match object.get("op").and_then(serde_json::Value::as_str) {
            Some(op) if KNOWN_OPS.contains(&op) => {}
            Some(op) => {
                let shown: String = op.chars().take(64).collect();
                return Err(Rejection::new(
                    ErrorCode::UnknownOp,
                    format!("unknown op {shown:?}"),
                ));
            }
            None => {
                return Err(Rejection::new(
                    ErrorCode::UnknownOp,
                    "missing string field `op`",
                ))
            }
        }
        for field in ["issued_at", "deadline"] {
            if let Some(stamp) = object.get(field).and_then(serde_json::Value::as_str) {
                if DateTime::parse_from_rfc3339(stamp).is_err() {
                    return Err(Rejection::new(
                        ErrorCode::InvalidTimestamp,
                        format!("`{field}` is not an RFC 3339 timestamp"),
                    ));
                }
            }
        }
        let command: Command = serde_json::from_value(value)
            .map_err(|e| Rejection::new(ErrorCode::InvalidCommand, e.to_string()))?;
        command.validate()?;
        Ok(command)
    }

    /// Checks every value's grammar. [`Command::parse`] calls this; call it again on
    /// commands built in code before sending them.
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.v != PROTOCOL_VERSION {
            return Err(Rejection::new(
                ErrorCode::UnsupportedVersion,
                format!("protocol version {}", self.v),
            ));
        }
        validate::command_id(&self.id)?;
        validate::name("host", &self.host)?;
        if let Some(namespace) = self.op.namespace() {
            validate::name("namespace", namespace)?;
        }
        if let Some(target) = self.op.cancels() {
            validate::command_id(target)
                .map_err(|e| Rejection::new(e.code, format!("`target`: {}", e.message)))?;
            if target == self.id {
                return Err(Rejection::new(
                    ErrorCode::InvalidCommand,
                    "a cancel cannot be for itself (`target` is its own `id`)",
                ));
            }
        }
        if let Some(w) = self.op.workload() {
            validate::name("workload", &w.workload)?;
        }
        if let Some(r) = self.op.revision() {
            validate::name("revision", r)?;
        }
        if let Op::PrepareRevision { spec, .. } = &self.op {
            validate::spec(spec)?;
        }
        Ok(())
    }

    /// The canonical JSON text of this command (field order fixed by the types).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a Command always serialises")
    }

    /// What an id is bound to: the canonical JSON without `issued_at` (and, like
    /// [`Command::to_json`], without `sig`). A re-send of the same command may carry a
    /// new `issued_at` and signature; any other difference is another command, and
    /// reusing the id for it is `id_conflict`.
    pub fn content(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a Command always serialises");
        if let Some(object) = value.as_object_mut() {
            object.remove("issued_at");
        }
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_deadline_is_an_rfc3339_timestamp_kept_in_the_canonical_json_and_the_content() {
        let text = |deadline: &str| {
            format!(
                r#"{{"v":1,"id":"c1","host":"h1","issued_at":"2026-01-01T00:00:00Z"{deadline},"op":"ensure_namespace","namespace":"ns"}}"#
            )
        };
        let plain = super::Command::parse(&text("")).unwrap();
        assert_eq!(plain.deadline, None);
        assert!(!plain.to_json().contains("deadline"), "{}", plain.to_json());
        let bounded =
            super::Command::parse(&text(r#","deadline":"2026-01-01T00:00:30+01:00""#)).unwrap();
        assert_eq!(
            bounded.deadline.unwrap().to_rfc3339(),
            "2025-12-31T23:00:30+00:00"
        );
        assert!(bounded
            .to_json()
            .contains(r#""deadline":"2025-12-31T23:00:30Z""#));
        assert_ne!(
            bounded.content(),
            plain.content(),
            "another deadline, another command"
        );
        // A string that is not RFC 3339 is `invalid_timestamp` (docs/protocol.md); a
        // value of the wrong type is `invalid_command`, as for any field.
        for (bad, code) in [
            (
                r#","deadline":"in 30 s""#,
                crate::ErrorCode::InvalidTimestamp,
            ),
            (r#","deadline":30"#, crate::ErrorCode::InvalidCommand),
        ] {
            let e = super::Command::parse(&text(bad)).unwrap_err();
            assert_eq!(e.code, code, "{bad}: {e:?}");
        }
        let e = super::Command::parse(&text(r#","deadline":"tomorrow""#)).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidTimestamp);
    }

    #[test]
    fn content_ignores_issued_at_only() {
        let a = super::Command::parse(
            r#"{"v":1,"id":"c1","host":"h1","issued_at":"2026-01-01T00:00:00Z","op":"ensure_namespace","namespace":"ns"}"#,
        )
        .unwrap();
        let mut b = a.clone();
        b.issued_at = chrono::Utc::now();
        assert_eq!(a.content(), b.content());
        assert!(!a.content().contains("issued_at"), "{}", a.content());
        b.host = "h2".into();
        assert_ne!(a.content(), b.content());
    }

    use super::*;

    fn line(op_fields: &str) -> String {
        format!(
            r#"{{"v":1,"id":"c-1","host":"h1","issued_at":"2026-11-29T10:00:00Z",{op_fields}}}"#
        )
    }

    fn code(text: &str) -> ErrorCode {
        Command::parse(text).expect_err("should be rejected").code
    }

    #[test]
    fn parses_every_op() {
        let spec = r#""spec":{"driver":"sim","image":"busybox:1","command":["sleep","1"],"env":{"A":"b"}}"#;
        for fields in [
            r#""op":"ensure_namespace","namespace":"ns""#.to_string(),
            r#""op":"delete_namespace","namespace":"ns""#.to_string(),
            format!(
                r#""op":"prepare_revision","namespace":"ns","workload":"w","revision":"r1",{spec}"#
            ),
            r#""op":"activate_revision","namespace":"ns","workload":"w","revision":"r1""#
                .to_string(),
            r#""op":"stop_workload","namespace":"ns","workload":"w""#.to_string(),
            r#""op":"start_workload","namespace":"ns","workload":"w""#.to_string(),
            r#""op":"retire_revision","namespace":"ns","workload":"w","revision":"r1""#.to_string(),
        ] {
            let c = Command::parse(&line(&fields)).unwrap_or_else(|e| panic!("{fields}: {e}"));
            // Round trip through the canonical form.
            assert_eq!(Command::parse(&c.to_json()).unwrap(), c);
        }
    }

    #[test]
    fn rejects_with_stable_codes() {
        assert_eq!(code("{not json"), ErrorCode::InvalidJson);
        assert_eq!(code("[1,2]"), ErrorCode::InvalidJson);
        assert_eq!(
            code(r#"{"v":2,"op":"ensure_namespace"}"#),
            ErrorCode::UnsupportedVersion
        );
        assert_eq!(code(&line(r#""op":"reboot_host""#)), ErrorCode::UnknownOp);
        assert_eq!(
            code(&line(r#""op":"ensure_namespace""#)),
            ErrorCode::InvalidCommand
        );
        assert_eq!(
            code(&line(r#""op":"ensure_namespace","namespace":"Bad_NS""#)),
            ErrorCode::InvalidName
        );
        assert_eq!(
            code(&line(r#""op":"ensure_namespace","namespace":"-x""#)),
            ErrorCode::InvalidName
        );
        let long = "a".repeat(64);
        assert_eq!(
            code(&line(&format!(
                r#""op":"ensure_namespace","namespace":"{long}""#
            ))),
            ErrorCode::InvalidName
        );
        assert_eq!(
            code(
                r#"{"v":1,"id":"bad id","host":"h1","issued_at":"2026-11-29T10:00:00Z","op":"ensure_namespace","namespace":"n"}"#
            ),
            ErrorCode::InvalidId
        );
        assert_eq!(
            code(
                r#"{"v":1,"id":"a","host":"h1","issued_at":"yesterday","op":"ensure_namespace","namespace":"n"}"#
            ),
            ErrorCode::InvalidTimestamp
        );
        let big = format!(
            r#""op":"ensure_namespace","namespace":"n","pad":"{}""#,
            "x".repeat(MAX_COMMAND_BYTES)
        );
        assert_eq!(code(&line(&big)), ErrorCode::TooLarge);
    }

    #[test]
    fn rejects_bad_env_and_spec() {
        let prep = |spec: &str| {
            line(&format!(
                r#""op":"prepare_revision","namespace":"n","workload":"w","revision":"r",{spec}"#
            ))
        };
        assert_eq!(
            code(&prep(r#""spec":{"driver":"sim","env":{"A=B":"x"}}"#)),
            ErrorCode::InvalidEnv
        );
        assert_eq!(
            code(&prep(r#""spec":{"driver":"sim","env":{"1A":"x"}}"#)),
            ErrorCode::InvalidEnv
        );
        assert_eq!(
            code(&prep(r#""spec":{"driver":"sim","env":{"A":"x\u0000y"}}"#)),
            ErrorCode::InvalidEnv
        );
        assert_eq!(
            code(&prep(r#""spec":{"driver":"sim","command":["a\u0000"]}"#)),
            ErrorCode::InvalidSpec
        );
        assert_eq!(
            code(&prep(
                r#""spec":{"driver":"docker","image":"Not An Image"}"#
            )),
            ErrorCode::InvalidSpec
        );
        assert_eq!(
            code(&prep(r#""spec":{"driver":"docker"}"#)),
            ErrorCode::InvalidSpec
        );
        assert_eq!(
            code(&prep(r#""spec":{"driver":"warp"}"#)),
            ErrorCode::InvalidCommand
        );
    }
}
