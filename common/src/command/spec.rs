//! What a revision runs: [`Spec`] and its parts (the driver it is for, the activation
//! [`Strategy`], the systemd and kube drivers' own settings, mounts and ports).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
