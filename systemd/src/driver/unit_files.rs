//! This host's files in the unit directory: whose a unit file is (its markers), the
//! revision's unit and env drop-in written, the namespace's cleanup unit, and what a
//! killed write or a retire leaves to remove.

use super::{io, SystemdDriver};
use crate::unit::{self, Markers};
use crate::{files, naming};
use capstan_common::{ErrorCode, Spec};
use capstan_driver::{merged_env, DriverError, LaunchEnv, RevisionRef};
use std::path::{Path, PathBuf};

/// One unit file of ours on disk, with what its markers say.
pub(super) struct OurUnit {
    pub(super) name: String,
    pub(super) markers: Markers,
}

/// This host's files in the unit directory.
#[derive(Default)]
pub(super) struct Scanned {
    pub(super) services: Vec<OurUnit>,
    /// The namespaces whose slices are there.
    pub(super) namespaces: std::collections::BTreeSet<String>,
}

impl SystemdDriver {
    /// The markers of `unit`'s file when it is this host's; `None` when there is no
    /// file; refused when the file is not ours.
    pub(super) fn ours(
        &self,
        op: &'static str,
        unit: &str,
    ) -> Result<Option<Markers>, DriverError> {
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
    pub(super) fn existing(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<String, DriverError> {
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
    pub(super) fn scan(
        &self,
        op: &'static str,
        namespace: Option<&str>,
    ) -> Result<Scanned, DriverError> {
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
    pub(super) fn write_unit(
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
        files::write_if_changed(&self.unit_path(&name), &text, files::UNIT).map_err(io(op, &name))
    }

    /// Writes the launch environment drop-in (when it differs); true when it changed.
    pub(super) fn write_env(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<bool, DriverError> {
        let name = naming::unit_name(rev);
        let text = unit::env_dropin(&merged_env(spec, launch_env))
            .map_err(|e| DriverError::refused(op, rev, e.code(), e.to_string()))?;
        files::write_if_changed(&self.env_path(&name), &text, files::ENV_DROPIN)
            .map_err(io(op, &name))
    }

    /// refused when a file of that name is not this host's cleanup unit.
    pub(super) fn cleanup_file(
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
}

/// Removes what a writer killed mid-write left (files.rs): temporaries of unit files
/// in `unit_dir` and of env drop-ins in our units' drop-in dirs.
pub(super) fn sweep(unit_dir: &Path) -> std::io::Result<()> {
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

pub(super) fn remove_unit_files(dir: &Path, unit: &str) -> std::io::Result<bool> {
    let dropins = files::remove_dir(&dir.join(naming::dropin_dir(unit)))?;
    Ok(files::remove(&dir.join(unit))? || dropins)
}
