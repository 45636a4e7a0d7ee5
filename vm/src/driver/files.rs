//! The driver's files: directories `0700` and files `0600` (no more, whatever the
//! umask), each written whole or not at all, removed idempotently.

use super::VmError;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

pub(super) fn file(path: &Path) -> impl FnOnce(std::io::Error) -> VmError + '_ {
    move |source| VmError::File {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn mkdir(path: &Path) -> Result<(), VmError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(file(path))
}

/// Writes `bytes` to `path` whole or not at all (a temporary file, synced, renamed).
pub(super) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), VmError> {
    write(path, bytes, true)
}

/// [`write_file`] without the sync: for a file its reader checks against what it must
/// hold (a power loss may leave it torn; a process crash never does).
pub(super) fn write_unsynced(path: &Path, bytes: &[u8]) -> Result<(), VmError> {
    write(path, bytes, false)
}

fn write(path: &Path, bytes: &[u8], sync: bool) -> Result<(), VmError> {
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
    if sync {
        f.sync_all().map_err(file(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(file(path))
}

/// Removes `path` and everything under it; already gone is done.
pub(super) fn remove_all(path: &Path) -> Result<(), VmError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(file(path)(e)),
        _ => Ok(()),
    }
}

/// The subdirectories of `dir` (none when it is missing), skipping hidden ones (a
/// revision being prepared).
pub(super) fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
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
