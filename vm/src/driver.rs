//! The [`VmDriver`]: the [`Driver`] over QEMU. A revision is a directory of files
//! (`launch.rs`) made by `prepare` and a daemonized QEMU process started by
//! `activate`/`start`/`resume`, found again by its pidfile and command line
//! (`process.rs`), stopped by the ACPI power button, then `quit`, then SIGKILL.

use crate::launch::{self, Vm};
use crate::process;
use crate::qmp::{Qmp, QmpError};
use crate::spec::{self, VmSpec};
use crate::VmConfig;
use capstan_common::{DriverKind, ErrorCode, Rejection, Spec};
use capstan_driver::{
    merged_env, spec_hash, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv,
    Observed, RevisionRef,
};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a QMP step may take (a monitor serves one client at a time).
const QMP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long QEMU gets to exit after `quit`, and after SIGKILL.
const QUIT_WAIT: Duration = Duration::from_secs(5);

/// Why an operation on a VM failed (the `source` of [`DriverError::Backend`]).
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} exited with {status}: {stderr}")]
    Exited {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP")]
    Qmp(#[source] QmpError),
    #[error("QEMU daemonized but its pidfile names no QEMU of this revision")]
    NoProcess,
    #[error("the guest is {0}, not running, just after its start")]
    NotRunning(String),
    #[error("QEMU (pid {0}) is still there after SIGKILL")]
    Unkillable(i32),
}

/// `identity.json`: whose revision a directory is.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Identity {
    host: String,
    namespace: String,
    workload: String,
    revision: String,
    spec_hash: String,
}

/// `namespace.json`: whose namespace a directory is.
#[derive(Debug, Serialize, Deserialize)]
struct NamespaceFile {
    host: String,
}

/// A VM this driver started: what the exit watch is told.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    namespace: String,
    workload: String,
    revision: String,
    pid: i32,
}

pub struct VmDriver {
    host: String,
    config: VmConfig,
    state_dir: PathBuf,
    run_dir: PathBuf,
    started: tokio::sync::broadcast::Sender<Started>,
}

fn backend(op: &'static str, target: impl ToString) -> impl FnOnce(VmError) -> DriverError {
    move |e| DriverError::Backend {
        op,
        target: target.to_string(),
        source: Box::new(e),
    }
}

fn file(path: &Path) -> impl FnOnce(std::io::Error) -> VmError + '_ {
    move |source| VmError::File {
        path: path.to_path_buf(),
        source,
    }
}

fn refused(op: &'static str, rev: RevisionRef<'_>) -> impl FnOnce(Rejection) -> DriverError {
    let target = rev.to_string();
    move |r| DriverError::refused(op, target, r.code, r.message)
}

fn mkdir(path: &Path) -> Result<(), VmError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(file(path))
}

/// Writes `bytes` to `path` whole or not at all (a temporary file, synced, renamed).
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), VmError> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(file(&tmp))?;
    f.write_all(bytes).map_err(file(&tmp))?;
    f.sync_all().map_err(file(&tmp))?;
    std::fs::rename(&tmp, path).map_err(file(path))
}

/// Removes `path` and everything under it; already gone is done.
fn remove_all(path: &Path) -> Result<(), VmError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(file(path)(e)),
        _ => Ok(()),
    }
}

/// The subdirectories of `dir` (none when it is missing), skipping hidden ones (a
/// revision being prepared).
fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .filter(|(name, _)| !name.starts_with('.'))
        .collect();
    dirs.sort();
    dirs
}

/// Runs `command` (`program`, for messages) to its end with stdin closed: its output,
/// or why it failed (its stderr when it ran and exited non-zero).
async fn finish(
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

/// What the guest's init wrote on its second serial port: `{"exit_code":N}`.
fn exit_code(vm: &Vm) -> Option<i64> {
    let text = std::fs::read_to_string(vm.exit_record()).ok()?;
    let record: serde_json::Value = serde_json::from_str(text.lines().next()?).ok()?;
    record.get("exit_code")?.as_i64()
}

impl VmDriver {
    /// Checks that QEMU runs (`<qemu> -version`) and makes the driver's directories.
    pub async fn open(
        host: &str,
        config: VmConfig,
        data_dir: &Path,
    ) -> Result<VmDriver, DriverError> {
        let op = "open";
        let out = finish(
            tokio::process::Command::new(&config.qemu).arg("-version"),
            &config.qemu,
        )
        .await
        .map_err(backend(op, config.qemu.display()))?;
        let state_dir = config.state_dir(data_dir);
        let run_dir = config.run_dir(data_dir);
        mkdir(&state_dir).map_err(backend(op, state_dir.display()))?;
        mkdir(&run_dir).map_err(backend(op, run_dir.display()))?;
        tracing::info!(
            qemu = %String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("?"),
            state_dir = %state_dir.display(),
            "vm driver ready"
        );
        Ok(VmDriver {
            host: host.to_string(),
            config,
            state_dir,
            run_dir,
            started: tokio::sync::broadcast::channel(256).0,
        })
    }

    fn vm(&self, rev: RevisionRef<'_>) -> Vm {
        Vm::new(&self.host, rev, &self.state_dir, &self.run_dir)
    }

    fn namespace_dir(&self, namespace: &str) -> PathBuf {
        self.state_dir.join(namespace)
    }

    /// The revision's identity, when its directory is this host's.
    fn identity(&self, vm: &Vm) -> Option<Identity> {
        let text = std::fs::read(vm.identity()).ok()?;
        serde_json::from_slice::<Identity>(&text)
            .ok()
            .filter(|i| i.host == self.host)
    }

    /// The files a spec names must be under `images_dir`, and there.
    fn images_present(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        s: &VmSpec,
    ) -> Result<(), DriverError> {
        for name in [&s.kernel, &s.initrd, &s.disk].into_iter().flatten() {
            let path = self.config.images_dir.join(name);
            if !path.is_file() {
                return Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::ImageNotFound,
                    format!("{} is not on this host", path.display()),
                ));
            }
        }
        Ok(())
    }

    /// The revision's files, built in a hidden directory and renamed into place: a
    /// crash mid-way leaves no directory that looks prepared.
    async fn stage(
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
            let spec_json = serde_json::to_vec(spec).expect("a Spec always serialises");
            write_file(&tmp.join("spec.json"), &spec_json)?;
            write_file(&tmp.join("argv"), &launch::argv_block(&spec.command))?;
            write_file(
                &tmp.join("env"),
                &launch::env_block(&merged_env(spec, &LaunchEnv::new())),
            )?;
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
    async fn start_with(
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
        self.launch(op, rev, &vm).await
    }

    /// Boots `vm` as its files say, unless its QEMU already runs.
    async fn launch(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        vm: &Vm,
    ) -> Result<(), DriverError> {
        if process::running(vm).is_some() {
            return Ok(());
        }
        let fail = backend(op, rev);
        let spec: Spec = std::fs::read(vm.spec())
            .map_err(file(&vm.spec()))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| file(&vm.spec())(std::io::Error::other(e)))
            })
            .map_err(backend(op, rev))?;
        let settings = spec::check(&spec).map_err(refused(op, rev))?;
        self.images_present(op, rev, &settings)?;
        mkdir(&vm.run).map_err(backend(op, rev))?;
        // This boot's exit record, not an earlier one's.
        let _ = std::fs::remove_file(vm.exit_record());
        let started = finish(
            tokio::process::Command::new(&self.config.qemu)
                .args(launch::qemu_args(vm, &settings, &self.config.images_dir))
                .stdout(std::process::Stdio::null()),
            &self.config.qemu,
        )
        .await;
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
        let mut qmp = Qmp::connect(&vm.ops_socket(), QMP_TIMEOUT)
            .await
            .map_err(VmError::Qmp)
            .map_err(backend(op, rev))?;
        let status = qmp
            .execute("query-status")
            .await
            .map_err(VmError::Qmp)
            .map_err(backend(op, rev))?;
        let status = status["status"].as_str().unwrap_or("unknown").to_string();
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
    async fn stop_vm(
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

    /// The revisions of `namespace/workload` on this host.
    fn revisions(&self, namespace: &str, workload: &str) -> Vec<String> {
        subdirs(&self.namespace_dir(namespace).join(workload))
            .into_iter()
            .map(|(name, _)| name)
            .filter(|r| {
                let rev = RevisionRef {
                    namespace,
                    workload,
                    revision: r,
                };
                self.identity(&self.vm(rev)).is_some()
            })
            .collect()
    }

    /// Every revision of this host: `(namespace, workload, revision)`.
    fn all_revisions(&self) -> Vec<(String, String, String)> {
        let mut all = Vec::new();
        for (ns, ns_dir) in subdirs(&self.state_dir) {
            for (wl, _) in subdirs(&ns_dir) {
                for r in self.revisions(&ns, &wl) {
                    all.push((ns.clone(), wl.clone(), r));
                }
            }
        }
        all
    }
}

fn state_of(vm: &Vm) -> BackendState {
    match process::running(vm) {
        Some(_) => BackendState::Running,
        None => BackendState::Stopped,
    }
}

#[async_trait::async_trait]
impl Driver for VmDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::VM
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), Rejection> {
        spec::check(spec).map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: true,
            reports_exits: true,
            restarts_exits: true,
            reaps_orphans: self.config.reap_orphans,
            probes: false,
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "ensure_namespace";
        let dir = self.namespace_dir(namespace);
        mkdir(&dir).map_err(backend(op, namespace))?;
        let marker = dir.join("namespace.json");
        if !marker.exists() {
            let text = serde_json::to_vec(&NamespaceFile {
                host: self.host.clone(),
            })
            .expect("serialises");
            write_file(&marker, &text).map_err(backend(op, namespace))?;
        }
        Ok(())
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "delete_namespace";
        let dir = self.namespace_dir(namespace);
        let left: usize = subdirs(&dir)
            .iter()
            .map(|(wl, _)| self.revisions(namespace, wl).len())
            .sum();
        if left > 0 {
            return Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NamespaceNotEmpty,
                format!("{left} VM revision(s) of ours are still in it"),
            ));
        }
        remove_all(&dir).map_err(backend(op, namespace))
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        let op = "prepare";
        let settings = spec::check(spec).map_err(refused(op, rev))?;
        self.images_present(op, rev, &settings)?;
        let vm = self.vm(rev);
        if let Some(existing) = self.identity(&vm) {
            if existing.spec_hash == spec_hash(spec) {
                return Ok(());
            }
            // A leftover from an earlier life of this host with another spec: the log
            // is the truth, so replace it.
            tracing::warn!(revision = %rev, "replacing a VM revision made from another spec");
            self.stop_vm(op, rev, &vm).await?;
        }
        remove_all(&vm.state).map_err(backend(op, rev))?;
        self.stage(op, rev, spec, &settings).await
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        _previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let op = "activate";
        self.start_with(op, rev, spec, launch_env).await?;
        // Every other revision of the workload, not only `previous`: after a crash
        // mid-activation more than one may run.
        for other in self.revisions(rev.namespace, rev.workload) {
            if other != rev.revision {
                let other = RevisionRef {
                    revision: &other,
                    ..rev
                };
                self.stop_vm(op, other, &self.vm(other)).await?;
            }
        }
        Ok(())
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        self.start_with("start", rev, spec, launch_env).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "start";
        let vm = self.vm(rev);
        if self.identity(&vm).is_none() {
            return Err(DriverError::Missing {
                op,
                target: rev.to_string(),
            });
        }
        // The env file holds what the last command-driven start projected.
        self.launch(op, rev, &vm).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.stop_vm("stop", rev, &self.vm(rev)).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "retire";
        let vm = self.vm(rev);
        self.stop_vm(op, rev, &vm).await?;
        remove_all(&vm.state).map_err(backend(op, rev))?;
        remove_all(&vm.run).map_err(backend(op, rev))?;
        // The workload's directory goes with its last revision.
        if let Some(parent) = vm.state.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let mut observed = Observed::default();
        for (ns, dir) in subdirs(&self.state_dir) {
            let ours = std::fs::read(dir.join("namespace.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<NamespaceFile>(&b).ok())
                .is_some_and(|n| n.host == self.host);
            if ours {
                observed.namespaces.insert(ns);
            }
        }
        for (ns, wl, r) in self.all_revisions() {
            let rev = RevisionRef {
                namespace: &ns,
                workload: &wl,
                revision: &r,
            };
            observed
                .workloads
                .entry(capstan_common::workload_key(&ns, &wl))
                .or_default()
                .insert(r.clone(), state_of(&self.vm(rev)));
        }
        Ok(observed)
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        let vm = self.vm(rev);
        Ok(self.identity(&vm).map(|_| state_of(&vm)))
    }

    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        crate::exits::watch(self, exits).await
    }
}

impl VmDriver {
    /// The VMs running now: `(revision, pid)`.
    pub(crate) fn running(&self) -> Vec<(Vm, Exit, i32)> {
        self.all_revisions()
            .into_iter()
            .filter_map(|(ns, wl, r)| {
                let rev = RevisionRef {
                    namespace: &ns,
                    workload: &wl,
                    revision: &r,
                };
                let vm = self.vm(rev);
                let pid = process::running(&vm)?;
                Some((vm, exit(&ns, &wl, &r), pid))
            })
            .collect()
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Started> {
        self.started.subscribe()
    }

    pub(crate) fn started_vm(&self, s: &Started) -> (Vm, Exit, i32) {
        let rev = RevisionRef {
            namespace: &s.namespace,
            workload: &s.workload,
            revision: &s.revision,
        };
        (
            self.vm(rev),
            exit(&s.namespace, &s.workload, &s.revision),
            s.pid,
        )
    }
}

fn exit(namespace: &str, workload: &str, revision: &str) -> Exit {
    Exit {
        namespace: namespace.into(),
        workload: workload.into(),
        revision: revision.into(),
        exit_code: None,
    }
}

/// The exit code a stopped VM's guest recorded.
pub(crate) fn recorded_exit(vm: &Vm) -> Option<i64> {
    exit_code(vm)
}
