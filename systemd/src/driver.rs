//! The [`Driver`] over systemd: what each operation writes, reloads, starts and stops.

use crate::bus::{self, Bus, BusError, Change, UnitStatus};
use crate::config::SystemdConfig;
use crate::unit::{Markers, UnitSettings};
use crate::{files, naming, unit};
use exits::is_exit;

mod exits;
use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::{
    merged_env, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed,
    RevisionRef,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The systemd driver.
pub struct SystemdDriver {
    bus: Bus,
    host: String,
    config: SystemdConfig,
}

/// One unit file of ours on disk, with what its markers say.
struct OurUnit {
    name: String,
    markers: Markers,
}

/// This host's files in the unit directory.
#[derive(Default)]
struct Scanned {
    services: Vec<OurUnit>,
    /// The namespaces whose slices are there.
    namespaces: std::collections::BTreeSet<String>,
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

    /// The markers of `unit`'s file when it is this host's; `None` when there is no
    /// file; refused when the file is not ours.
    fn ours(&self, op: &'static str, unit: &str) -> Result<Option<Markers>, DriverError> {
        let path = self.unit_path(unit);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(op, unit)(e)),
        };
        match unit::markers(&text) {
            Some(m) if m.host == self.host => Ok(Some(m)),
            _ => Err(DriverError::refused(
                op,
                unit,
                ErrorCode::NotOwned,
                "the unit file exists but is not this host's capstan unit",
            )),
        }
    }

    /// The unit of `rev`, which must exist (and be ours): `backend_missing` otherwise.
    fn existing(&self, op: &'static str, rev: RevisionRef<'_>) -> Result<String, DriverError> {
        let unit = naming::unit_name(rev);
        match self.ours(op, &unit)? {
            Some(_) => Ok(unit),
            None => Err(DriverError::Missing {
                op,
                target: rev.to_string(),
            }),
        }
    }

    /// This host's files in the unit directory, in one pass: every service unit (of
    /// `namespace` only, when given: only those files are read) and every slice.
    fn scan(&self, op: &'static str, namespace: Option<&str>) -> Result<Scanned, DriverError> {
        let dir = &self.config.unit_dir;
        let prefix = namespace.map(naming::namespace_prefix);
        let mut out = Scanned::default();
        for entry in std::fs::read_dir(dir).map_err(io(op, dir.display()))? {
            let entry = entry.map_err(io(op, dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let wanted = match &prefix {
                Some(prefix) => name.starts_with(prefix.as_str()) && name.ends_with(".service"),
                None => true,
            };
            if !wanted || !naming::is_capstan_unit_file(&name) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            if let Some(markers) = unit::markers(&text) {
                if markers.host == self.host {
                    out.services.push(OurUnit { name, markers });
                }
            } else if let Some((host, namespace)) = unit::slice_markers(&text) {
                if host == self.host {
                    out.namespaces.insert(namespace);
                }
            }
        }
        Ok(out)
    }

    /// Writes the revision's unit (when it differs); true when it changed.
    fn write_unit(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
    ) -> Result<bool, DriverError> {
        let name = naming::unit_name(rev);
        let text = unit::service(&self.host, rev, spec, &self.settings(rev.namespace))
            .map_err(|e| DriverError::refused(op, rev, e.code(), e.to_string()))?;
        // The spec's env goes into the drop-in at activation; refuse it now, before
        // anything is written, if it cannot be.
        unit::env_dropin(&spec.env)
            .map_err(|e| DriverError::refused(op, rev, e.code(), e.to_string()))?;
        // Refuses a file that is not ours. One of ours with another spec is a leftover
        // of an earlier life of the host: the log is the truth, so it is rewritten.
        if let Some(existing) = self.ours(op, &name)? {
            let same = (&existing.namespace, &existing.workload, &existing.revision);
            if same
                != (
                    &rev.namespace.to_string(),
                    &rev.workload.to_string(),
                    &rev.revision.to_string(),
                )
            {
                return Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::NotOwned,
                    format!("unit {name} belongs to another revision"),
                ));
            }
        }
        files::write_if_changed(&self.unit_path(&name), &text).map_err(io(op, &name))
    }

    /// Writes the launch environment drop-in (when it differs); true when it changed.
    fn write_env(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<bool, DriverError> {
        let name = naming::unit_name(rev);
        let text = unit::env_dropin(&merged_env(spec, launch_env))
            .map_err(|e| DriverError::refused(op, rev, e.code(), e.to_string()))?;
        files::write_if_changed(&self.env_path(&name), &text).map_err(io(op, &name))
    }

    /// Makes systemd read what changed since its last reload (shared with concurrent
    /// operations).
    async fn reload(&self, op: &'static str, changed: bool) -> Result<(), DriverError> {
        let target = if changed {
            self.bus.files_changed()
        } else {
            return self
                .bus
                .reload_if_needed()
                .await
                .map_err(backend(op, "reload"));
        };
        self.bus
            .reload_covering(target)
            .await
            .map_err(backend(op, "reload"))
    }

    async fn status(&self, op: &'static str, unit: &str) -> Result<UnitStatus, DriverError> {
        self.bus.status(unit).await.map_err(backend(op, unit))
    }

    /// Brings `unit` up with what is on disk now: a restart when it runs and its files
    /// changed, a start when it does not run, nothing when it runs unchanged.
    async fn bring_up(
        &self,
        op: &'static str,
        unit: &str,
        changed: bool,
    ) -> Result<(), DriverError> {
        let status = self.status(op, unit).await?;
        if status.active_state == "active" && !changed {
            return Ok(());
        }
        if status.active_state == "failed" {
            self.bus
                .reset_failed(unit)
                .await
                .map_err(backend(op, unit))?;
        }
        let up = if status.is_running() {
            self.bus.restart(unit).await
        } else {
            self.bus.start(unit).await
        };
        if let Err(e) = up {
            // systemd retries a failed start on its own (`Restart=on-failure`), but the
            // command fails here: the revision must not come up later behind the
            // agent's back (next to the revision still running). A stop cancels that.
            if let Err(stop) = self.bus.stop(unit).await {
                tracing::warn!(%unit, error = %stop, "could not stop a unit whose start failed");
            }
            return Err(backend(op, unit)(e));
        }
        // The job is done; what systemd made of it is the unit's state now. `failed`
        // already means it gave up (its start limit): that is this command's failure.
        let after = self.status(op, unit).await?;
        if after.active_state == "failed" {
            return Err(DriverError::refused(
                op,
                unit,
                ErrorCode::BackendFailed,
                format!(
                    "the unit is failed right after its start (unit result `{}`)",
                    after.result
                ),
            ));
        }
        Ok(())
    }

    /// Stops `unit` (ours) and keeps it from starting at boot: what `stop` does, and
    /// how `retire` begins.
    async fn halt(&self, op: &'static str, unit: &str) -> Result<(), DriverError> {
        self.bus.stop(unit).await.map_err(backend(op, unit))?;
        self.at_boot(op, unit, false).await
    }

    /// Whether systemd starts `unit` at boot: enabled while intent wants it running,
    /// so that a host reboot brings back what ran, without the agent. When the agent
    /// manages the lifecycle, its startup does that instead and nothing is enabled.
    async fn at_boot(&self, op: &'static str, unit: &str, wanted: bool) -> Result<(), DriverError> {
        if self.config.manage_lifecycle {
            return Ok(());
        }
        let done = if wanted {
            self.bus.enable(unit).await
        } else {
            self.bus.disable(unit).await
        };
        done.map_err(backend(op, unit))
    }

    /// Stops (and no longer starts at boot) every revision of `rev`'s workload but `rev`.
    async fn stop_others(&self, op: &'static str, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        for other in self.scan(op, Some(rev.namespace))?.services {
            let m = &other.markers;
            if m.namespace == rev.namespace
                && m.workload == rev.workload
                && m.revision != rev.revision
            {
                self.bus
                    .stop(&other.name)
                    .await
                    .map_err(backend(op, &other.name))?;
                self.at_boot(op, &other.name, false).await?;
            }
        }
        Ok(())
    }

    /// Removes the namespace's state directory through its cleanup unit
    /// ([`unit::cleanup`]): written, started (a oneshot: the start job ends when the
    /// removal did) and removed again. systemd's own users own what is in the
    /// directory, and the agent (root without capabilities, the file system
    /// read-only but for its own dirs) could not. True when the unit file was removed
    /// (a reload is due).
    async fn remove_state(&self, op: &'static str, namespace: &str) -> Result<bool, DriverError> {
        let (unit, path, _) = self.cleanup_file(op, namespace)?;
        let text = unit::cleanup(&self.host, namespace, &self.namespace_dir(namespace))
            .map_err(|e| DriverError::refused(op, namespace, e.code(), e.to_string()))?;
        let changed = files::write_if_changed(&path, &text).map_err(io(op, &unit))?;
        self.reload(op, changed).await?;
        let ran = self.bus.start(&unit).await;
        let removed = files::remove(&path).map_err(io(op, &unit))?;
        if let Err(e) = ran {
            if let Err(reset) = self.bus.reset_failed(&unit).await {
                tracing::warn!(%unit, error = %reset, "could not reset a failed cleanup unit");
            }
            return Err(backend(op, &unit)(e));
        }
        Ok(removed)
    }

    /// The namespace's cleanup unit, its path, and whether its file is there;
    /// refused when a file of that name is not this host's cleanup unit.
    fn cleanup_file(
        &self,
        op: &'static str,
        namespace: &str,
    ) -> Result<(String, PathBuf, bool), DriverError> {
        let unit = naming::cleanup_unit(namespace);
        let path = self.unit_path(&unit);
        let exists = match std::fs::read_to_string(&path) {
            Ok(text) if unit::is_cleanup(&self.host, &text) => true,
            Ok(_) => {
                return Err(DriverError::refused(
                    op,
                    &unit,
                    ErrorCode::NotOwned,
                    "the unit file exists but is not this host's capstan cleanup unit",
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(op, &unit)(e)),
        };
        Ok((unit, path, exists))
    }

    /// The state of one unit as a [`BackendState`].
    fn backend_state(status: &UnitStatus) -> BackendState {
        if status.active_state == "failed" {
            let restarts = match status.n_restarts {
                0 => String::new(),
                n => format!(" after {n} restarts"),
            };
            BackendState::Failed {
                reason: format!("{}{restarts}", status.result),
            }
        } else if status.is_running() {
            BackendState::Running
        } else {
            BackendState::Stopped
        }
    }

    /// Sends an [`Exit`] for each of our units that stops running, until `exits` is
    /// dropped or the bus stream ends.
    async fn forward_exits(
        &self,
        exits: tokio::sync::mpsc::Sender<Exit>,
    ) -> Result<(), DriverError> {
        let op = "watch";
        let mut changes = Box::pin(self.bus.watch().await.map_err(backend(op, "units"))?);
        // The last state seen of each unit: an exit is leaving `active`/`deactivating`,
        // or arriving in `failed` (systemd gave up) from anything else.
        // Seeded after the stream is open, so a unit that runs now and exits next is
        // known to have been up; a unit loaded later starts out inactive.
        let mut last: HashMap<String, String> = self
            .bus
            .list_ours()
            .await
            .map_err(backend(op, "units"))?
            .into_iter()
            .map(|(unit, (active, _))| (unit, active))
            .collect();
        // The last `ExecMainStatus` each unit's signals carried.
        let mut statuses: HashMap<String, i32> = HashMap::new();
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                () = exits.closed() => return Ok(()),
            };
            let Some(change) = change else {
                return Err(DriverError::refused(
                    op,
                    "units",
                    ErrorCode::DriverFailed,
                    "the bus stream ended",
                ));
            };
            let change = match change {
                Change::MainStatus { unit, status } => {
                    statuses.insert(unit, status);
                    continue;
                }
                Change::State(change) => change,
            };
            let before = last.insert(change.unit.clone(), change.active_state.clone());
            if !is_exit(before.as_deref(), &change.active_state, &change.sub_state) {
                continue;
            }
            let Ok(Some(m)) = self.ours(op, &change.unit) else {
                continue;
            };
            // The status sent with this change, never one read later: by then systemd
            // may have started the next run (and reset it).
            let exit_code = statuses.get(&change.unit).copied().map(i64::from);
            let exit = Exit {
                namespace: m.namespace,
                workload: m.workload,
                revision: m.revision,
                exit_code,
            };
            if exits.send(exit).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Removes what a writer killed mid-write left (files.rs): temporaries of unit files
/// in `unit_dir` and of env drop-ins in our units' drop-in dirs.
fn sweep(unit_dir: &Path) -> std::io::Result<()> {
    let mut removed = files::remove_temporaries(unit_dir, naming::PREFIX)?;
    for entry in std::fs::read_dir(unit_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(naming::PREFIX) && name.ends_with(".d") && entry.file_type()?.is_dir() {
            removed += files::remove_temporaries(&entry.path(), naming::ENV_DROPIN)?;
        }
    }
    if removed > 0 {
        tracing::info!(removed, "removed temporary unit files a killed write left");
    }
    Ok(())
}

fn remove_unit_files(dir: &Path, unit: &str) -> std::io::Result<bool> {
    let dropins = files::remove_dir(&dir.join(naming::dropin_dir(unit)))?;
    Ok(files::remove(&dir.join(unit))? || dropins)
}

#[async_trait::async_trait]
impl Driver for SystemdDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Systemd
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: self.config.manage_lifecycle,
            reports_exits: true,
            restarts_exits: false,
            reaps_orphans: self.config.reap_orphans,
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
