//! The VM driver's test guest and a place for its VMs ([`VmHost`]): `.ci/vmguest.sh`
//! builds the guest (Debian's cloud kernel and a busybox initramfs with the reference
//! init of `vm/guest/`) into `$CAPSTAN_VM_GUEST_DIR`; each test gets its own images,
//! state and run directories, and every QEMU left in them is killed when it ends.
//! Guests run under TCG: this kind of machine has no usable KVM (`docs/vm.md`).

use capstan_vm::VmConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The dir holding `vmlinuz` and `initramfs.cpio.gz`: `$CAPSTAN_VM_GUEST_DIR`
/// (`scripts/test.sh` sets it from `.ci/vmguest.sh`).
pub fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("CAPSTAN_VM_GUEST_DIR").unwrap_or_else(|| {
        panic!(
            "CAPSTAN_VM_GUEST_DIR is not set: run `export CAPSTAN_VM_GUEST_DIR=$(.ci/vmguest.sh)` first \
             (it installs QEMU and builds the test guest once, cached)"
        )
    });
    PathBuf::from(dir)
}

/// One test's VM directories, under a temp dir; its QEMUs are killed on drop.
pub struct VmHost {
    pub dir: tempfile::TempDir,
    pub config: VmConfig,
}

impl VmHost {
    /// Images dir with the test guest's kernel and initramfs, empty state and run
    /// dirs, and a stop timeout of `stop_timeout_secs`.
    pub fn new(stop_timeout_secs: u32) -> VmHost {
        VmHost::at(tempfile::tempdir().expect("temp dir"), stop_timeout_secs)
    }

    /// [`VmHost::new`] with its dirs under `parent` (e.g. a
    /// [`crate::systemd::SystemdHost::dir`], so that its paths are valid inside).
    pub fn new_in(parent: &Path, stop_timeout_secs: u32) -> VmHost {
        VmHost::at(
            tempfile::tempdir_in(parent).expect("temp dir"),
            stop_timeout_secs,
        )
    }

    fn at(dir: tempfile::TempDir, stop_timeout_secs: u32) -> VmHost {
        let images = dir.path().join("images");
        std::fs::create_dir_all(&images).expect("images dir");
        for file in ["vmlinuz", "initramfs.cpio.gz"] {
            std::os::unix::fs::symlink(guest_dir().join(file), images.join(file))
                .expect("link the guest");
        }
        let config = VmConfig {
            images_dir: images,
            state_dir: Some(dir.path().join("state")),
            run_dir: Some(dir.path().join("run")),
            stop_timeout_secs,
            ..VmConfig::default()
        };
        VmHost { dir, config }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn run_dir(&self) -> PathBuf {
        self.config.run_dir(self.dir.path())
    }

    /// The pids of the QEMUs running from this host's run dir.
    pub fn qemus(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir(self.run_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("qemu.pid")).ok())
            .filter_map(|p| p.trim().parse().ok())
            .filter(|pid| self.runs(*pid))
            .collect()
    }

    /// Whether `pid` is a QEMU of capstan's started from this host's run dir (its
    /// `-pidfile` is there): never another test's.
    fn runs(&self, pid: i32) -> bool {
        let run = self.run_dir().display().to_string();
        is_capstan_qemu(pid)
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&run))
    }

    /// The console log of `ns/workload@rev`.
    pub fn console(&self, ns: &str, workload: &str, rev: &str) -> PathBuf {
        self.data_dir()
            .join("state")
            .join(ns)
            .join(workload)
            .join(rev)
            .join("console.log")
    }

    /// Waits for a console line of `ns/workload@rev` starting with `prefix`; the line.
    pub fn console_line(&self, ns: &str, workload: &str, rev: &str, prefix: &str) -> String {
        let path = self.console(ns, workload, rev);
        crate::wait_until(
            format_args!("{prefix:?} on {}", path.display()),
            crate::READY,
            || {
                std::fs::read_to_string(&path).ok().and_then(|text| {
                    text.lines()
                        .find(|l| l.starts_with(prefix))
                        .map(str::to_string)
                })
            },
        )
    }
}

/// Whether `pid` is a QEMU of capstan's (`process=capstan-vm` on its command line).
pub fn is_capstan_qemu(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .any(|a| a.ends_with(b",process=capstan-vm"))
        })
        .unwrap_or(false)
}

impl Drop for VmHost {
    fn drop(&mut self) {
        for pid in self.qemus() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            crate::wait_until(
                format_args!("QEMU {pid} gone"),
                Duration::from_secs(30),
                || !is_capstan_qemu(pid),
            );
        }
    }
}

/// A spec for the test guest: its kernel and initramfs, TCG, `env`.
pub fn spec(env: &[(&str, &str)]) -> capstan_common::Spec {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::from_value(serde_json::json!({
        "driver": "vm",
        "env": env,
        "vm": {
            "kernel": "vmlinuz",
            "initrd": "initramfs.cpio.gz",
            "append": "quiet",
            "accel": "tcg",
            "memory_mib": 256
        }
    }))
    .expect("a vm spec")
}
