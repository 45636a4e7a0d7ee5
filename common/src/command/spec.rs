//! What a revision runs: [`Spec`] and its parts (the driver it is for, the activation
//! [`Strategy`], mounts and ports; the drivers' own settings are [`Sections`]).

use super::{DriverKind, Section, Sections};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// What a revision runs. A driver adds its own settings as its section. The default is
/// an empty `sim` spec (every field at its default), to build others from. Read by
/// hand (below): each member straight into its field, any other into the sections.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Spec {
    pub driver: DriverKind,
    // Every field is serialised, empty ones too (no `skip_serializing_if`): the JSON
    // of recorded commands and specs (`capstan-agent log --json`) keeps its shape. The
    // exceptions are fields added later (the drivers' sections, `readiness`,
    // `strategy`): each is left out while at its default, so specs written before it
    // keep their canonical JSON, and with it their hashes and the content their command
    // ids are bound to.
    // A field added later is read with the others (`SpecVisitor`), its default when
    // absent: the agent's log stores a spec as its JSON, so records written before the
    // field existed decode with the default.
    pub image: Option<String>,
    /// argv; empty means the image's default.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The working directory inside the workload (absolute); `None`: the image's.
    pub working_dir: Option<String>,
    /// Host paths or named volumes mounted into the workload.
    pub mounts: Vec<Mount>,
    /// Ports published on the host.
    pub ports: Vec<PortMapping>,
    /// Drivers' own settings, each under its driver's kind (`"systemd": {…}`); only
    /// the spec's own driver's may be present, and that driver checks it. Left out
    /// when empty, so specs without one keep their canonical JSON (and hashes).
    #[serde(flatten)]
    pub sections: Sections,
    /// What tells that a started revision serves; `None`: it is ready once started.
    /// Absent when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness: Option<crate::Readiness>,
    /// How an activation replaces the revision that runs; absent at its default.
    #[serde(skip_serializing_if = "Strategy::is_default")]
    pub strategy: Strategy,
}

impl Spec {
    /// The section of the spec's own driver, if it carries one.
    pub fn section(&self) -> Option<&Section> {
        self.sections.get(self.driver)
    }
}

// What `#[derive(Deserialize)]` with a flattened map would do — every field at its
// default when absent, `driver` required, a field twice refused — without first
// buffering the whole spec to find the members no field takes (which cost a spec read
// from the log about 1.8 times the time).
impl<'de> Deserialize<'de> for Spec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = Spec;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a spec (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spec, A::Error> {
        let mut spec = Spec::default();
        let mut driver = None;
        // One bit a field, set when read.
        let mut seen = 0u16;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let (bit, field) = match key.as_ref() {
                "driver" => (0, "driver"),
                "image" => (1, "image"),
                "command" => (2, "command"),
                "env" => (3, "env"),
                "working_dir" => (4, "working_dir"),
                "mounts" => (5, "mounts"),
                "ports" => (6, "ports"),
                "readiness" => (7, "readiness"),
                "strategy" => (8, "strategy"),
                _ => {
                    let section: Section = map.next_value()?;
                    if spec
                        .sections
                        .insert_named(key.into_owned(), section)
                        .is_some()
                    {
                        return Err(de::Error::custom("a spec member appears twice"));
                    }
                    continue;
                }
            };
            if seen & (1 << bit) != 0 {
                return Err(de::Error::duplicate_field(field));
            }
            seen |= 1 << bit;
            match bit {
                0 => driver = Some(map.next_value()?),
                1 => spec.image = map.next_value()?,
                2 => spec.command = map.next_value()?,
                3 => spec.env = map.next_value()?,
                4 => spec.working_dir = map.next_value()?,
                5 => spec.mounts = map.next_value()?,
                6 => spec.ports = map.next_value()?,
                7 => spec.readiness = map.next_value()?,
                _ => spec.strategy = map.next_value()?,
            }
        }
        spec.driver = driver.ok_or_else(|| de::Error::missing_field("driver"))?;
        Ok(spec)
    }
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
