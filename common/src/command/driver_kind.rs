//! A driver's identity: the kind it names itself by. Open: a built-in driver has a
//! constant here, an external driver announces any kind in its `hello`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest kind name, in bytes.
pub const MAX_KIND_LEN: usize = 32;

/// Which driver a revision is meant for (`spec.driver`), which one an agent runs
/// (`driver` in its config), and what a driver says it is: a name of 1–32 characters,
/// `^[a-z]([a-z0-9-]*[a-z0-9])?$`. Held inline, so it is `Copy` and compares as bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DriverKind {
    len: u8,
    bytes: [u8; MAX_KIND_LEN],
}

/// A name that is not a driver kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("driver kind {0:?} must be 1-32 characters of [a-z0-9-], starting with a letter and not ending with `-`")]
pub struct BadKind(pub String);

impl DriverKind {
    /// The simulated driver (`capstan_driver::sim`).
    pub const SIM: DriverKind = DriverKind::known("sim");
    /// Containers through the Docker Engine API (`capstan-docker`).
    pub const DOCKER: DriverKind = DriverKind::known("docker");
    /// systemd units over D-Bus (`capstan-systemd`).
    pub const SYSTEMD: DriverKind = DriverKind::known("systemd");
    /// Deployments in a Kubernetes cluster (`capstan-kube`).
    pub const KUBE: DriverKind = DriverKind::known("kube");
    /// Virtual machines under QEMU, controlled over QMP (`capstan-vm`).
    pub const VM: DriverKind = DriverKind::known("vm");
    /// The drivers built into `capstan-agent` (when compiled in: `capstan-agent drivers`).
    pub const BUILT_IN: [DriverKind; 5] =
        [Self::SIM, Self::DOCKER, Self::SYSTEMD, Self::KUBE, Self::VM];

    /// `name` as a kind, if it follows the grammar.
    pub fn new(name: &str) -> Result<DriverKind, BadKind> {
        if !is_kind_name(name) {
            return Err(BadKind(name.chars().take(64).collect()));
        }
        let mut bytes = [0; MAX_KIND_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(DriverKind {
            len: name.len() as u8,
            bytes,
        })
    }

    /// A constant kind; a name outside the grammar fails the build.
    const fn known(name: &str) -> DriverKind {
        let b = name.as_bytes();
        assert!(!b.is_empty() && b.len() <= MAX_KIND_LEN);
        let mut bytes = [0; MAX_KIND_LEN];
        let mut i = 0;
        while i < b.len() {
            assert!(b[i].is_ascii_lowercase() || (i > 0 && b[i].is_ascii_digit()));
            bytes[i] = b[i];
            i += 1;
        }
        DriverKind {
            len: b.len() as u8,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).expect("a driver kind is ASCII")
    }

    /// True for a kind built into `capstan-agent`.
    pub fn is_built_in(&self) -> bool {
        Self::BUILT_IN.contains(self)
    }
}

/// `^[a-z]([a-z0-9-]*[a-z0-9])?$`, at most [`MAX_KIND_LEN`] bytes.
pub fn is_kind_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_KIND_LEN
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

impl Default for DriverKind {
    fn default() -> Self {
        Self::SIM
    }
}

impl std::fmt::Display for DriverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for DriverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DriverKind({})", self.as_str())
    }
}

impl std::str::FromStr for DriverKind {
    type Err = BadKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DriverKind::new(s)
    }
}

impl Serialize for DriverKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DriverKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        DriverKind::new(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_kinds_keep_their_spelling() {
        let names: Vec<&str> = DriverKind::BUILT_IN.iter().map(|k| k.as_str()).collect();
        assert_eq!(names, ["sim", "docker", "systemd", "kube", "vm"]);
        for kind in DriverKind::BUILT_IN {
            assert_eq!(kind.as_str().parse::<DriverKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(serde_json::from_str::<DriverKind>(&json).unwrap(), kind);
        }
        assert_eq!(DriverKind::default(), DriverKind::SIM);
    }

    #[test]
    fn any_kind_in_the_grammar_is_a_kind_and_nothing_else_is() {
        for good in ["acme", "firecracker", "wasm-2", "a", &"x".repeat(32)] {
            let kind: DriverKind = good.parse().unwrap();
            assert_eq!(kind.as_str(), good);
            assert!(!kind.is_built_in());
        }
        for bad in [
            "",
            "Docker",
            "2x",
            "-x",
            "x-",
            "a b",
            "ü",
            "a\0",
            "a_b",
            &"x".repeat(33),
        ] {
            assert!(bad.parse::<DriverKind>().is_err(), "{bad:?}");
            assert!(serde_json::from_str::<DriverKind>(&format!("{bad:?}")).is_err());
        }
    }

    #[test]
    fn kinds_match_as_constants() {
        let kind: DriverKind = "docker".parse().unwrap();
        let which = match kind {
            DriverKind::SIM => 0,
            DriverKind::DOCKER => 1,
            _ => 2,
        };
        assert_eq!(which, 1);
    }
}
