//! The VM driver's own part of a spec: its section ([`VmSpec`], under `"vm"`) and its
//! rules. A VM boots a kernel (with an initrd) or a disk image the operator put under
//! the agent's `[vm] images_dir`; `command` and `env` reach the guest's init through
//! fw_cfg, byte for byte (`docs/vm.md`).

use capstan_common::validate::is_abs_path;
use capstan_common::{Check, DriverKind, ErrorCode, Rejection, Settings, Spec};
use serde::{Deserialize, Serialize};

/// The most memory a VM may be given, in MiB (1 TiB).
pub const MAX_MEMORY_MIB: u32 = 1 << 20;
/// The most virtual CPUs a VM may be given.
pub const MAX_VCPUS: u32 = 255;
/// The longest `vm.append`, in bytes (x86's whole command line is 2048).
pub const MAX_APPEND: usize = 1024;

/// A VM's settings, the spec's `"vm"` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// The kernel to boot (`-kernel`), relative to `images_dir`; `None`: boot `disk`.
    #[serde(default)]
    pub kernel: Option<String>,
    /// Its initrd (`-initrd`), relative to `images_dir`; only with `kernel`.
    #[serde(default)]
    pub initrd: Option<String>,
    /// A disk image, relative to `images_dir`, never written: each revision boots its
    /// own copy-on-write overlay of it (`qemu-img create -b`).
    #[serde(default)]
    pub disk: Option<String>,
    /// The disk image's format.
    #[serde(default)]
    pub disk_format: DiskFormat,
    /// Kernel command line words after the driver's own (`console=ttyS0 panic=-1`);
    /// only with `kernel`. Visible to every guest process and in the host's `ps`:
    /// switches, never values (those go in `env`).
    #[serde(default)]
    pub append: Option<String>,
    #[serde(default = "default_memory")]
    pub memory_mib: u32,
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    /// How QEMU runs the guest; never chosen for the spec by the driver.
    #[serde(default)]
    pub accel: Accel,
    #[serde(default)]
    pub network: Network,
}

fn default_memory() -> u32 {
    256
}

fn default_vcpus() -> u32 {
    1
}

impl Default for VmSpec {
    fn default() -> Self {
        VmSpec {
            kernel: None,
            initrd: None,
            disk: None,
            disk_format: DiskFormat::default(),
            append: None,
            memory_mib: default_memory(),
            vcpus: default_vcpus(),
            accel: Accel::default(),
            network: Network::default(),
        }
    }
}

impl Settings for VmSpec {
    const KIND: DriverKind = DriverKind::VM;
}

/// A disk image's format (`-F` of the overlay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFormat {
    #[default]
    Qcow2,
    Raw,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
    }
}

/// QEMU's accelerator: `kvm` (hardware virtualisation, what production wants) or
/// `tcg` (every guest instruction emulated: tests and tiny guests). No fallback from
/// one to the other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Accel {
    #[default]
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// The guest's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Network {
    /// No network device.
    #[default]
    None,
    /// QEMU's user-mode network (a virtio NIC behind NAT, outbound only; no host
    /// privileges).
    User,
}

/// A path under `images_dir`: `/`-separated names of `[A-Za-z0-9._-]`, none of them
/// `.` or `..`, at most 255 bytes. (No `,`: QEMU's option syntax would need it
/// doubled.)
pub fn is_image_path(s: &str) -> bool {
    s.len() <= 255
        && s.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// The VM driver's rules for a spec of its own. Answers the settings.
pub fn check(spec: &Spec) -> Result<VmSpec, Rejection> {
    let invalid = |m: &str| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    let s = VmSpec::read(spec)
        .map_err(|e| Rejection::new(ErrorCode::InvalidSpec, format!("`vm`: {e}")))?;
    if spec.image.is_some() {
        return invalid("driver vm runs no container image: boot `vm.kernel` or `vm.disk`");
    }
    if !spec.mounts.is_empty() || !spec.ports.is_empty() {
        return invalid("driver vm has no `mounts` or `ports`");
    }
    if spec.working_dir.is_some() {
        return invalid("driver vm has no `working_dir`: the guest's init chooses it");
    }
    match spec.readiness.as_ref().map(|r| &r.check) {
        None => {}
        Some(Check::Http { .. }) if s.network == Network::User => {}
        Some(Check::Http { .. }) => {
            return invalid("an `http` readiness check of a VM needs `vm.network` `user` (the driver forwards a loopback port of the host to the guest's)");
        }
        Some(Check::Tcp { .. }) => {
            return invalid("the vm driver probes `http` readiness only: a TCP connect is answered by QEMU's own port forwarding whether or not the guest listens");
        }
        Some(Check::Exec { .. }) => {
            return invalid(
                "the vm driver probes `http` readiness only: there is no exec into a guest",
            );
        }
    }
    if let Some(program) = spec.command.first() {
        if !is_abs_path(program) {
            return invalid("driver vm needs `command`, when given, to start with an absolute path in the guest");
        }
    }
    if s.kernel.is_none() && s.disk.is_none() {
        return invalid("driver vm needs `vm.kernel` or `vm.disk`");
    }
    if s.kernel.is_none() && (s.initrd.is_some() || s.append.is_some()) {
        return invalid("`vm.initrd` and `vm.append` go with `vm.kernel`");
    }
    for (field, path) in [
        ("kernel", &s.kernel),
        ("initrd", &s.initrd),
        ("disk", &s.disk),
    ] {
        if let Some(p) = path {
            if !is_image_path(p) {
                return invalid(&format!(
                    "`vm.{field}` must be a path under the agent's images_dir: `/`-separated names of [A-Za-z0-9._-], no `.` or `..`, at most 255 bytes"
                ));
            }
        }
    }
    if let Some(a) = &s.append {
        if a.len() > MAX_APPEND || !a.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'"') {
            return invalid(&format!(
                "`vm.append` must be at most {MAX_APPEND} bytes of printable ASCII without `\"`"
            ));
        }
    }
    if !(16..=MAX_MEMORY_MIB).contains(&s.memory_mib) {
        return invalid(&format!("`vm.memory_mib` must be 16 to {MAX_MEMORY_MIB}"));
    }
    if !(1..=MAX_VCPUS).contains(&s.vcpus) {
        return invalid(&format!("`vm.vcpus` must be 1 to {MAX_VCPUS}"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    fn refused(json: &str) -> String {
        let e = check(&spec(json)).expect_err(json);
        assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
        e.message
    }

    /// Given a spec with a kernel, when checked, then its settings come back with
    /// their defaults, and written back they read the same.
    #[test]
    fn a_kernel_is_enough_and_the_rest_defaults() {
        let mut s = spec(r#"{"driver":"vm","vm":{"kernel":"k/vmlinuz","accel":"tcg"}}"#);
        let settings = check(&s).unwrap();
        assert_eq!(settings.memory_mib, 256);
        assert_eq!(settings.vcpus, 1);
        assert_eq!(settings.accel, Accel::Tcg);
        settings.write_into(&mut s);
        assert_eq!(check(&s).unwrap(), settings);
    }

    /// Given specs each breaking one rule, when checked, then each is refused naming it.
    #[test]
    fn each_rule_is_named() {
        assert!(refused(r#"{"driver":"vm"}"#).contains("`vm.kernel` or `vm.disk`"));
        assert!(
            refused(r#"{"driver":"vm","image":"x:1","vm":{"kernel":"k"}}"#)
                .contains("no container image")
        );
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"../etc/shadow"}}"#).contains("images_dir")
        );
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"/boot/vmlinuz"}}"#).contains("images_dir")
        );
        assert!(refused(r#"{"driver":"vm","vm":{"disk":"a,b"}}"#).contains("images_dir"));
        assert!(refused(r#"{"driver":"vm","vm":{"disk":"d","initrd":"i"}}"#)
            .contains("go with `vm.kernel`"));
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"k","append":"a=\"b\""}}"#)
                .contains("`vm.append`")
        );
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"k","append":"é"}}"#).contains("`vm.append`")
        );
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"k","memory_mib":8}}"#).contains("memory_mib")
        );
        assert!(refused(r#"{"driver":"vm","vm":{"kernel":"k","vcpus":0}}"#).contains("vcpus"));
        assert!(
            refused(r#"{"driver":"vm","vm":{"kernel":"k","accel":"hvf"}}"#)
                .starts_with("`vm`: unknown variant")
        );
        assert!(refused(r#"{"driver":"vm","vm":{"kernel":"k","cpus":2}}"#)
            .starts_with("`vm`: unknown field"));
        assert!(
            refused(r#"{"driver":"vm","command":["app"],"vm":{"kernel":"k"}}"#)
                .contains("absolute path")
        );
        assert!(
            refused(r#"{"driver":"vm","working_dir":"/srv","vm":{"kernel":"k"}}"#)
                .contains("working_dir")
        );
        let ready = |check: &str, network: &str| {
            format!(
                r#"{{"driver":"vm","vm":{{"kernel":"k","network":"{network}"}},"readiness":{{"check":{check}}}}}"#
            )
        };
        let http = r#"{"http":{"port":80}}"#;
        check(&spec(&ready(http, "user"))).unwrap();
        assert!(refused(&ready(http, "none")).contains("needs `vm.network` `user`"));
        assert!(refused(&ready(r#"{"tcp":{"port":80}}"#, "user")).contains("`http` readiness only"));
        assert!(
            refused(&ready(r#"{"exec":{"command":["/bin/true"]}}"#, "user")).contains("no exec")
        );
    }

    #[test]
    fn image_paths_stay_under_the_images_dir() {
        for good in ["vmlinuz", "debian/12/vmlinuz-6.1", "a_b-c.img"] {
            assert!(is_image_path(good), "{good}");
        }
        for bad in [
            "",
            "/abs",
            "a//b",
            "a/",
            "./a",
            "a/../b",
            "..",
            "a b",
            "a,b",
            "é",
            &"a".repeat(256),
        ] {
            assert!(!is_image_path(bad), "{bad}");
        }
    }
}
