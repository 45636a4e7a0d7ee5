//! The [`Driver`] over systemd: what each operation writes, reloads, starts and stops.

use crate::bus::{self, Bus, BusError};
use crate::config::SystemdConfig;
use crate::unit::UnitSettings;
use crate::{files, naming, unit};
use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::{
    BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, RevisionRef,
};
use std::path::PathBuf;
use std::time::Duration;
use unit_files::{remove_unit_files, sweep};

mod exit_feed;
mod exits;
mod jobs;
mod unit_files;

/// The systemd driver.
pub struct SystemdDriver {
    bus: Bus,
    host: String,
    config: SystemdConfig,
}

fn backend(op: &'static str, target: impl ToString) -> impl FnOnce(BusError) -> DriverError {
    move |e| {
        // A job systemd ran and failed is a refusal with its results, not a broken bus.
        if let BusError::Job { unit_result, .. } = &e {
            let code = if unit_result == "start-limit-hit" {
                ErrorCode::BackendFailed
            } else {
                ErrorCode::DriverFailed
            };
            return DriverError::refused(op, target, code, e.to_string());
        }
        DriverError::Backend {
            op,
            target: target.to_string(),
            source: Box::new(e),
        }
    }
}

fn io(op: &'static str, target: impl ToString) -> impl FnOnce(std::io::Error) -> DriverError {
    move |e| DriverError::Backend {
        op,
        target: target.to_string(),
        source: Box::new(e),
    }
}

impl SystemdDriver {
    /// Connects to systemd's bus and checks the unit directory is there.
    pub async fn connect(host: &str, config: SystemdConfig) -> Result<SystemdDriver, DriverError> {
        let op = "connect";
        let timeout = Duration::from_secs(config.job_timeout_secs.max(1).into());
        let bus = Bus::connect(config.bus.as_deref(), timeout)
            .await
            .map_err(backend(op, config.bus.as_deref().unwrap_or("system bus")))?;
        if !config.unit_dir.is_dir() {
            return Err(DriverError::refused(
                op,
                config.unit_dir.display(),
                ErrorCode::DriverFailed,
                "the unit directory does not exist",
            ));
        }
        // Each namespace's directory is systemd's (`StateDirectory=`), so it must be
        // under /var/lib.
        unit::state_directory(&config.state_dir.join("ns")).map_err(|e| {
            DriverError::refused(
                op,
                config.state_dir.display(),
                ErrorCode::DriverFailed,
                e.to_string(),
            )
        })?;
        sweep(&config.unit_dir).map_err(io(op, config.unit_dir.display()))?;
        let version = bus.version().await.map_err(backend(op, "systemd"))?;
        tracing::info!(%version, unit_dir = %config.unit_dir.display(), "connected to systemd");
        Ok(SystemdDriver {
            bus,
            host: host.into(),
            config,
        })
    }

    /// The D-Bus connection (for tests and benchmarks: reload counts).
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    fn settings(&self, namespace: &str) -> UnitSettings {
        UnitSettings {
            state_dir: self.namespace_dir(namespace),
            stop_timeout_secs: self.config.stop_timeout_secs,
            start_limit_interval_secs: self.config.start_limit_interval_secs,
            start_limit_burst: self.config.start_limit_burst,
            restart_sec_ms: self.config.restart_sec_ms,
        }
    }

    fn namespace_dir(&self, namespace: &str) -> PathBuf {
        self.config.state_dir.join(namespace)
    }

    fn unit_path(&self, unit: &str) -> PathBuf {
        self.config.unit_dir.join(unit)
    }

    fn env_path(&self, unit: &str) -> PathBuf {
        self.config
            .unit_dir
            .join(naming::dropin_dir(unit))
            .join(naming::ENV_DROPIN)
    }
}

#[async_trait::async_trait]
impl Driver for SystemdDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::SYSTEMD
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), capstan_common::Rejection> {
        crate::spec::check(spec).map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: self.config.manage_lifecycle,
            reports_exits: true,
            restarts_exits: false,
            reaps_orphans: self.config.reap_orphans,
            probes: true,
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "ensure_namespace";
        // Its state directory is made by systemd when a unit of it first starts, for
        // that unit's user (`StateDirectory=`). A cleanup unit a delete killed midway
        // left would remove it if started: it goes.
        let (cleanup, path, left) = self.cleanup_file(op, namespace)?;
        let removed = left && files::remove(&path).map_err(io(op, &cleanup))?;
        let slice = naming::slice_name(namespace);
        let changed = files::write_if_changed(
            &self.unit_path(&slice),
            &unit::slice(&self.host, namespace)
                .map_err(|e| DriverError::refused(op, namespace, e.code(), e.to_string()))?,
            files::UNIT,
        )
        .map_err(io(op, &slice))?;
        self.reload(op, changed || removed).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "delete_namespace";
        let left: Vec<String> = self
            .scan(op, Some(namespace))?
            .services
            .into_iter()
            .filter(|u| u.markers.namespace == namespace)
            .map(|u| u.name)
            .collect();
        if !left.is_empty() {
            return Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NamespaceNotEmpty,
                format!("units of it exist: {}", left.join(", ")),
            ));
        }
        let cleaned = self.remove_state(op, namespace).await?;
        let slice = naming::slice_name(namespace);
        let removed = files::remove(&self.unit_path(&slice)).map_err(io(op, &slice))?;
        self.reload(op, removed || cleaned).await
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        let op = "prepare";
        let mut changed = self.write_unit(op, rev, spec)?;
        // Its env drop-in too, with the spec's env, when it has none: activating it
        // then changes no file unless a launch env comes with it, so revisions
        // prepared one after another share the reload of the first activation instead
        // of one each (a namespace's commands run in order). An existing drop-in may
        // hold the launch env of a running revision: left as it is.
        if !self.env_path(&naming::unit_name(rev)).exists() {
            changed |= self.write_env(op, rev, spec, &LaunchEnv::new())?;
        }
        if changed {
            // systemd reads them at the next reload, which every start waits for.
            self.bus.files_changed();
        }
        Ok(())
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        _previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let op = "activate";
        let unit = naming::unit_name(rev);
        let changed =
            self.write_unit(op, rev, spec)? | self.write_env(op, rev, spec, launch_env)?;
        self.reload(op, changed).await?;
        self.bring_up(op, &unit, changed).await?;
        self.at_boot(op, &unit, true).await?;
        self.stop_others(op, rev).await
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let op = "start";
        let unit = self.existing(op, rev)?;
        let changed = self.write_env(op, rev, spec, launch_env)?;
        self.reload(op, changed).await?;
        self.bring_up(op, &unit, changed).await?;
        self.at_boot(op, &unit, true).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "resume";
        let unit = self.existing(op, rev)?;
        self.reload(op, false).await?;
        self.bring_up(op, &unit, false).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "stop";
        let unit = naming::unit_name(rev);
        if self.ours(op, &unit)?.is_none() {
            // Nothing of it: stopped is what was asked.
            return Ok(());
        }
        self.halt(op, &unit).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "retire";
        let unit = naming::unit_name(rev);
        if self.ours(op, &unit)?.is_none() {
            // Already gone: retire converges.
            return Ok(());
        }
        self.halt(op, &unit).await?;
        let removed = remove_unit_files(&self.config.unit_dir, &unit).map_err(io(op, &unit))?;
        self.reload(op, removed).await?;
        self.bus
            .reset_failed(&unit)
            .await
            .map_err(backend(op, &unit))
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let op = "observe";
        let mut observed = Observed::default();
        let loaded = self.bus.list_ours().await.map_err(backend(op, "units"))?;
        let scanned = self.scan(op, None)?;
        observed.namespaces = scanned.namespaces;
        for u in scanned.services {
            let state = match loaded.get(&u.name) {
                Some((active, _)) if active == "failed" => {
                    Self::backend_state(&self.status(op, &u.name).await?)
                }
                Some((active, _)) if bus::is_running(active) => BackendState::Running,
                _ => BackendState::Stopped,
            };
            let m = u.markers;
            observed
                .workloads
                .entry(capstan_common::workload_key(&m.namespace, &m.workload))
                .or_default()
                .insert(m.revision, state);
        }
        Ok(observed)
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        let op = "state";
        let unit = naming::unit_name(rev);
        if self.ours(op, &unit)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Self::backend_state(&self.status(op, &unit).await?)))
    }

    /// `tcp` and `http` on loopback (the unit shares the host's network); not ready
    /// while the unit is not active. `exec` is refused at validation.
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &capstan_common::Check,
        timeout: std::time::Duration,
    ) -> Result<capstan_driver::Probe, DriverError> {
        let op = "probe";
        let unit = naming::unit_name(rev);
        if self.ours(op, &unit)?.is_none() {
            return Err(DriverError::Missing {
                op,
                target: rev.to_string(),
            });
        }
        if !Self::backend_state(&self.status(op, &unit).await?).is_running() {
            let why = format!("{unit} is not active");
            return Ok(capstan_driver::Probe::NotReady(why));
        }
        let loopback = std::net::Ipv4Addr::LOCALHOST.into();
        match capstan_driver::probe::network(loopback, check, timeout).await {
            Some(probe) => Ok(probe),
            None => Err(DriverError::refused(
                op,
                rev,
                ErrorCode::InvalidSpec,
                "the systemd driver probes `http` and `tcp` readiness only",
            )),
        }
    }

    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        self.forward_exits(exits).await
    }
}
