//! What the driver has systemd do to our units over the bus: reloads, starts and
//! restarts, stops, enabling at boot, running a namespace's cleanup unit, and a
//! unit's status as a backend state.

use super::{backend, io, SystemdDriver};
use crate::bus::UnitStatus;
use crate::{files, unit};
use capstan_common::ErrorCode;
use capstan_driver::{BackendState, DriverError, RevisionRef};

impl SystemdDriver {
    /// Makes systemd read what changed since its last reload (shared with concurrent
    /// operations).
    pub(super) async fn reload(&self, op: &'static str, changed: bool) -> Result<(), DriverError> {
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

    pub(super) async fn status(
        &self,
        op: &'static str,
        unit: &str,
    ) -> Result<UnitStatus, DriverError> {
        self.bus.status(unit).await.map_err(backend(op, unit))
    }

    /// Brings `unit` up with what is on disk now: a restart when it runs and its files
    /// changed, a start when it does not run, nothing when it runs unchanged.
    pub(super) async fn bring_up(
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
    pub(super) async fn halt(&self, op: &'static str, unit: &str) -> Result<(), DriverError> {
        self.bus.stop(unit).await.map_err(backend(op, unit))?;
        self.at_boot(op, unit, false).await
    }

    /// Whether systemd starts `unit` at boot: enabled while intent wants it running,
    /// so that a host reboot brings back what ran, without the agent. When the agent
    /// manages the lifecycle, its startup does that instead and nothing is enabled.
    pub(super) async fn at_boot(
        &self,
        op: &'static str,
        unit: &str,
        wanted: bool,
    ) -> Result<(), DriverError> {
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
    pub(super) async fn stop_others(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<(), DriverError> {
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
    pub(super) async fn remove_state(
        &self,
        op: &'static str,
        namespace: &str,
    ) -> Result<bool, DriverError> {
        let (unit, path, _) = self.cleanup_file(op, namespace)?;
        let text = unit::cleanup(&self.host, namespace, &self.namespace_dir(namespace))
            .map_err(|e| DriverError::refused(op, namespace, e.code(), e.to_string()))?;
        let changed = files::write_if_changed(&path, &text, files::UNIT).map_err(io(op, &unit))?;
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
    /// The state of one unit as a [`BackendState`].
    pub(super) fn backend_state(status: &UnitStatus) -> BackendState {
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
}
