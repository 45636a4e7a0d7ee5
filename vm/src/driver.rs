//! The [`VmDriver`]: the [`Driver`] over QEMU. A revision is a directory of files
//! (`launch.rs`) made by `prepare` and a daemonized QEMU process started by
//! `activate`/`start`/`resume`, found again by its pidfile and command line
//! (`process.rs`), stopped by the ACPI power button, then `quit`, then SIGKILL.

use crate::launch::{Forward, Vm};
use crate::process;
use crate::qmp::{Qmp, QmpError};
use crate::spec::{self, VmSpec};
use crate::VmConfig;
use capstan_common::{Check, DriverKind, ErrorCode, Rejection, Spec};
use capstan_driver::{
    spec_hash, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, Probe,
    RevisionRef,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod boot;
mod files;

use boot::finish;
use files::{mkdir, remove_all, subdirs, write_file};

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
    #[error("no free loopback port to forward")]
    Port(#[source] std::io::Error),
    #[error("QEMU daemonized but its pidfile names no QEMU of this revision")]
    NoProcess,
    #[error("the guest is {0}, not running, just after its start")]
    NotRunning(String),
    #[error("QEMU (pid {0}) is still there after SIGKILL")]
    Unkillable(i32),
}

/// `identity.json`: whose revision a directory is, and its spec (one file: a torn
/// write leaves no identity, and so a revision staged again, never one booted from a
/// torn spec).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Identity {
    host: String,
    namespace: String,
    workload: String,
    revision: String,
    spec_hash: String,
    spec: Spec,
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
    /// Each QEMU in a transient scope of its own (`[vm] systemd_scope` on a host
    /// systemd runs).
    scope: bool,
    started: tokio::sync::broadcast::Sender<Started>,
}

fn backend(op: &'static str, target: impl ToString) -> impl FnOnce(VmError) -> DriverError {
    move |e| DriverError::Backend {
        op,
        target: target.to_string(),
        source: Box::new(e),
    }
}

fn refused(op: &'static str, rev: RevisionRef<'_>) -> impl FnOnce(Rejection) -> DriverError {
    let target = rev.to_string();
    move |r| DriverError::refused(op, target, r.code, r.message)
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
        let scope = config.systemd_scope && Path::new("/run/systemd/system").exists();
        let state_dir = config.state_dir(data_dir);
        let run_dir = config.run_dir(data_dir);
        mkdir(&state_dir).map_err(backend(op, state_dir.display()))?;
        mkdir(&run_dir).map_err(backend(op, run_dir.display()))?;
        tracing::info!(
            qemu = %String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("?"),
            state_dir = %state_dir.display(),
            scopes = scope,
            "vm driver ready"
        );
        Ok(VmDriver {
            host: host.to_string(),
            config,
            state_dir,
            run_dir,
            scope,
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
            probes: true,
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
        let Some(identity) = self.identity(&vm) else {
            return Err(DriverError::Missing {
                op,
                target: rev.to_string(),
            });
        };
        // The env file holds what the last command-driven start projected.
        self.launch(op, rev, &vm, &identity.spec).await
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

    /// An `http` check (the only kind a VM spec may have): QEMU runs the guest (QMP
    /// `query-status` says `running`), then `GET path` through the loopback port QEMU
    /// forwards to the check's guest port.
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let vm = self.vm(rev);
        let Some(pid) = process::running(&vm) else {
            return Ok(Probe::NotReady("the VM is not running".into()));
        };
        match Qmp::status(&vm.ops_socket(), timeout).await {
            Ok(s) if s == "running" => {}
            Ok(s) => return Ok(Probe::NotReady(format!("the guest is {s:?}"))),
            Err(e) => return Ok(Probe::NotReady(capstan_common::report(&e))),
        }
        let Check::Http { path, .. } = check else {
            return Err(DriverError::refused(
                "probe",
                rev,
                ErrorCode::InvalidSpec,
                "the vm driver probes `http` readiness only",
            ));
        };
        let forward = std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|c| Forward::of_cmdline(&c));
        let Some(forward) = forward else {
            return Ok(Probe::NotReady(
                "QEMU forwards no port to the guest (started before its spec had a readiness check)".into(),
            ));
        };
        let check = Check::Http {
            port: forward.host,
            path: path.clone(),
        };
        let localhost = std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST);
        Ok(capstan_driver::probe::network(localhost, &check, timeout)
            .await
            .expect("http is a network check"))
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
