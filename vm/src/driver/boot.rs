//! Staging a revision's files and booting, finding and stopping its QEMU.

use super::files::{file, mkdir, remove_all, write_file, write_unsynced};
use super::{backend, refused, Identity, Started, VmDriver, VmError};
use crate::launch::{self, Forward, Vm};
use crate::process;
use crate::qmp::Qmp;
use crate::spec::{self, VmSpec};
use capstan_common::{Check, Spec};
use capstan_driver::{merged_env, spec_hash, Driver as _, DriverError, LaunchEnv, RevisionRef};
use std::path::Path;
use std::time::Duration;

/// How long a QMP step may take (a monitor serves one client at a time).
pub(super) const QMP_TIMEOUT: Duration = Duration::from_secs(5);
/// What starts a VM in a scope of its own on a host systemd runs.
const SYSTEMD_RUN: &str = "systemd-run";

/// A number that makes each boot's scope name new (a stopped VM's scope may still be
/// going away when the revision boots again): the boot's time, in milliseconds.
fn scope_serial() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// How long QEMU gets to exit after `quit`, and after SIGKILL.
const QUIT_WAIT: Duration = Duration::from_secs(5);

/// Runs `command` (`program`, for messages) to its end with stdin closed: its output,
/// or why it failed (its stderr when it ran and exited non-zero).
pub(super) async fn finish(
    command: &mut tokio::process::Command,
    program: &Path,
) -> Result<std::process::Output, VmError> {
    let program = program.display().to_string();
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| VmError::Spawn {
            program: program.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(VmError::Exited {
            program,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// A free loopback port for QEMU to forward (taken by QEMU a moment later; a port
/// taken meanwhile fails the start, which the command reports).
fn free_port() -> Result<u16, VmError> {
    let any = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
    std::net::TcpListener::bind(any)
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(VmError::Port)
}

impl VmDriver {
    /// The revision's files, built in a hidden directory and renamed into place: a
    /// crash mid-way leaves no directory that looks prepared.
    pub(super) async fn stage(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        s: &VmSpec,
    ) -> Result<(), DriverError> {
        let vm = self.vm(rev);
        let fail = backend(op, rev);
        let parent = vm.state.parent().expect("a revision dir has a parent");
        let tmp = parent.join(format!(".{}.staging", rev.revision));
        let result = async {
            remove_all(&tmp)?;
            mkdir(&tmp)?;
            // The env file is written by each start, just before its boot; the argv
            // file is checked against the spec then (one sync fewer a revision).
            write_unsynced(&tmp.join("argv"), &launch::argv_block(&spec.command))?;
            if let Some(disk) = &s.disk {
                self.overlay(
                    &self.config.images_dir.join(disk),
                    s,
                    &tmp.join("disk.qcow2"),
                )
                .await?;
            }
            let identity = Identity {
                host: self.host.clone(),
                namespace: rev.namespace.into(),
                workload: rev.workload.into(),
                revision: rev.revision.into(),
                spec_hash: spec_hash(spec),
                spec: spec.clone(),
            };
            write_file(
                &tmp.join("identity.json"),
                &serde_json::to_vec(&identity).expect("an identity serialises"),
            )?;
            std::fs::rename(&tmp, &vm.state).map_err(file(&vm.state))
        }
        .await;
        if result.is_err() {
            let _ = remove_all(&tmp);
        }
        result.map_err(fail)
    }

    /// `qemu-img create`: a copy-on-write overlay of `base` at `path`.
    async fn overlay(&self, base: &Path, s: &VmSpec, path: &Path) -> Result<(), VmError> {
        finish(
            tokio::process::Command::new(&self.config.qemu_img)
                .args([
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    "-F",
                    s.disk_format.as_str(),
                    "-b",
                ])
                .arg(base)
                .arg(path),
            &self.config.qemu_img,
        )
        .await
        .map(drop)
    }

    /// Starts `rev` with `launch_env`: restaged if its files are missing or of another
    /// spec; left as it is when it runs with exactly this environment; stopped first
    /// when it runs with another (fw_cfg is fixed for a QEMU's life).
    pub(super) async fn start_with(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let vm = self.vm(rev);
        if self.identity(&vm).map(|i| i.spec_hash) != Some(spec_hash(spec)) {
            self.prepare(rev, spec).await?;
        }
        let env = launch::env_block(&merged_env(spec, launch_env));
        if process::running(&vm).is_some() {
            if std::fs::read(vm.env()).ok().as_deref() == Some(env.as_slice()) {
                return Ok(());
            }
            tracing::info!(revision = %rev, "restarting the VM: its launch environment changed");
            self.stop_vm(op, rev, &vm).await?;
        }
        write_file(&vm.env(), &env).map_err(backend(op, rev))?;
        self.launch(op, rev, &vm, spec).await
    }

    /// Boots `vm`, staged from `spec`, with the env file it holds, unless its QEMU
    /// already runs.
    pub(super) async fn launch(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        vm: &Vm,
        spec: &Spec,
    ) -> Result<(), DriverError> {
        if process::running(vm).is_some() {
            return Ok(());
        }
        let fail = backend(op, rev);
        // The argv the spec says, whatever a power loss left of the file.
        let argv = launch::argv_block(&spec.command);
        if std::fs::read(vm.argv()).ok().as_deref() != Some(argv.as_slice()) {
            write_file(&vm.argv(), &argv).map_err(backend(op, rev))?;
        }
        // A revision resumed before any start: its spec's env alone.
        if !vm.env().exists() {
            let env = launch::env_block(&merged_env(spec, &LaunchEnv::new()));
            write_file(&vm.env(), &env).map_err(backend(op, rev))?;
        }
        let settings = spec::check(spec).map_err(refused(op, rev))?;
        self.images_present(op, rev, &settings)?;
        let forward = match spec.readiness.as_ref().map(|r| &r.check) {
            Some(Check::Http { port, .. }) => Some(Forward {
                host: free_port().map_err(backend(op, rev))?,
                guest: *port,
            }),
            _ => None,
        };
        mkdir(&vm.run).map_err(backend(op, rev))?;
        // This boot's exit record, not an earlier one's.
        let _ = std::fs::remove_file(vm.exit_record());
        // On a host systemd runs, in a transient scope of its own: out of the agent's
        // cgroup, so neither the agent's unit stopping (`KillMode=mixed`) nor its
        // crash takes the VM along.
        let program: &Path = match self.scope {
            true => SYSTEMD_RUN.as_ref(),
            false => &self.config.qemu,
        };
        let mut command = tokio::process::Command::new(program);
        if self.scope {
            command
                .args(launch::scope_args(vm, scope_serial()))
                .arg(&self.config.qemu);
        }
        command
            .args(launch::qemu_args(
                vm,
                &settings,
                &self.config.images_dir,
                forward,
            ))
            .stdout(std::process::Stdio::null());
        let started = finish(&mut command, program).await;
        match started {
            // A start of the same revision at the same time holds the pidfile's lock.
            Err(VmError::Exited { .. }) if process::running(vm).is_some() => return Ok(()),
            Err(e) => return Err(fail(e)),
            Ok(_) => {}
        }
        // Daemonized: the pidfile is written and the monitors listen.
        let pid = process::running(vm)
            .ok_or(VmError::NoProcess)
            .map_err(backend(op, rev))?;
        let status = Qmp::status(&vm.ops_socket(), QMP_TIMEOUT)
            .await
            .map_err(VmError::Qmp)
            .map_err(backend(op, rev))?;
        if status != "running" {
            return Err(backend(op, rev)(VmError::NotRunning(status)));
        }
        let _ = self.started.send(Started {
            namespace: rev.namespace.into(),
            workload: rev.workload.into(),
            revision: rev.revision.into(),
            pid,
        });
        tracing::info!(revision = %rev, pid, "VM started");
        Ok(())
    }

    /// Stops `vm`'s QEMU, if one runs: the ACPI power button, pressed again each second
    /// (a press before the guest's listener runs, during boot, is lost) until the stop
    /// timeout; then `quit`; then SIGKILL. The revision's files stay.
    pub(super) async fn stop_vm(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        vm: &Vm,
    ) -> Result<(), DriverError> {
        let Some(pid) = process::running(vm) else {
            return Ok(());
        };
        let timeout = Duration::from_secs(self.config.stop_timeout_secs.into());
        let deadline = tokio::time::Instant::now() + timeout;
        let mut qmp = Qmp::connect(&vm.ops_socket(), QMP_TIMEOUT).await.ok();
        let mut gone = false;
        while !gone && tokio::time::Instant::now() < deadline {
            if let Some(q) = qmp.as_mut() {
                if q.execute("system_powerdown").await.is_err() {
                    qmp = None;
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            gone = process::gone(pid, &vm.name, left.min(Duration::from_secs(1))).await;
        }
        if !gone {
            tracing::warn!(revision = %rev, pid, "the guest did not power off in time: quit");
            if let Some(q) = qmp.as_mut() {
                let _ = q.execute("quit").await;
            }
            gone = process::gone(pid, &vm.name, QUIT_WAIT).await;
        }
        if !gone {
            tracing::warn!(revision = %rev, pid, "QEMU did not quit: SIGKILL");
            process::kill(pid, &vm.name);
            if !process::gone(pid, &vm.name, QUIT_WAIT).await {
                return Err(backend(op, rev)(VmError::Unkillable(pid)));
            }
        }
        // A killed QEMU leaves its pidfile and sockets behind.
        remove_all(&vm.run).map_err(backend(op, rev))?;
        tracing::info!(revision = %rev, "VM stopped");
        Ok(())
    }
}
