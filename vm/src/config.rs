//! The VM driver's settings (`[vm]` in the agent config).

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where specs' kernels, initrds and disk images are found unless told.
pub const DEFAULT_IMAGES_DIR: &str = "/var/lib/capstan/vm-images";

/// VM driver settings (`[vm]` in the agent config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// The QEMU system emulator to run (a path, or a name looked up in `PATH`).
    #[serde(default = "default_qemu")]
    pub qemu: PathBuf,
    /// `qemu-img`, which makes each revision's disk overlay.
    #[serde(default = "default_qemu_img")]
    pub qemu_img: PathBuf,
    /// The directory a spec's `vm.kernel`, `vm.initrd` and `vm.disk` are relative to:
    /// a spec names files the operator put here, never any other path of the host.
    #[serde(default = "default_images_dir")]
    pub images_dir: PathBuf,
    /// Each revision's files (its spec, launch environment, disk overlay, console log,
    /// exit record); default `<data_dir>/vm`.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Each running VM's pidfile and QMP sockets; default `<data_dir>/vm-run` (inside
    /// the shipped unit's writable paths). Keep it short: a socket's path must fit in
    /// 108 bytes.
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    /// Seconds a guest gets to power off after the ACPI power button before QEMU is told
    /// to quit (then, 5 s later, killed).
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
    /// Remove VMs of this host that intent does not know (drift). Off by default: drift
    /// is only reported.
    #[serde(default)]
    pub reap_orphans: bool,
    /// On a host systemd runs (`/run/systemd/system` exists), start each QEMU in a
    /// transient scope of its own (`systemd-run --scope`), out of the agent's cgroup:
    /// the agent's unit stopping or crashing then leaves the VMs running.
    #[serde(default = "yes")]
    pub systemd_scope: bool,
}

fn yes() -> bool {
    true
}

fn default_qemu() -> PathBuf {
    "qemu-system-x86_64".into()
}

fn default_qemu_img() -> PathBuf {
    "qemu-img".into()
}

fn default_images_dir() -> PathBuf {
    DEFAULT_IMAGES_DIR.into()
}

fn default_stop_timeout() -> u32 {
    30
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            qemu: default_qemu(),
            qemu_img: default_qemu_img(),
            images_dir: default_images_dir(),
            state_dir: None,
            run_dir: None,
            stop_timeout_secs: default_stop_timeout(),
            reap_orphans: false,
            systemd_scope: true,
        }
    }
}

impl VmConfig {
    /// The state directory: `state_dir`, or `<data_dir>/vm`.
    pub fn state_dir(&self, data_dir: &Path) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("vm"))
    }

    /// The run directory: `run_dir`, or `<data_dir>/vm-run`.
    pub fn run_dir(&self, data_dir: &Path) -> PathBuf {
        self.run_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("vm-run"))
    }
}
