//! Files and directories made with the mode the code chose, whatever the process's
//! umask. `open(2)` and `mkdir(2)` take the umask's bits away from the mode asked
//! for, so a mode given to `OpenOptions`/`DirBuilder` is only an upper bound: under
//! `umask 077` a unit file asked `0644` would be `0600`, and the umask cannot be set
//! for one call (it is the whole multi-threaded process's). So each file or directory
//! made here is created with its mode (never more open than that, not even for an
//! instant) and then given exactly that mode (`fchmod` of the open file, `chmod` of
//! the directory it made).

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Secrets, the log and what is exported of it: the owner alone.
pub const PRIVATE_FILE: u32 = 0o600;
/// Directories of secrets and of the log: the owner alone.
pub const PRIVATE_DIR: u32 = 0o700;
/// Files other users (systemd's tools, an operator) read: `0644`.
pub const PUBLIC_FILE: u32 = 0o644;
/// Directories of files other users read: `0755`.
pub const PUBLIC_DIR: u32 = 0o755;

/// A new file at `path` (`create_new`: fails when there is one) for writing, with
/// exactly `mode`.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok(file)
}

/// The file at `path` for writing, emptied, or new; with exactly `mode` either way.
pub fn create(path: &Path, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok(file)
}

/// `path` and the directories above it that are missing, each one made here with
/// exactly `mode`; those already there are left as they are.
pub fn create_dir_all(path: &Path, mode: u32) -> io::Result<()> {
    if path.as_os_str().is_empty() || path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        create_dir_all(parent, mode)?;
    }
    match DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, Permissions::from_mode(mode)),
        // Made meanwhile by someone else: theirs, as it is.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A directory of the owner's alone at `path`: made as [`create_dir_all`] makes it
/// (`0700`), or, when it is there already, made `0700` (so one an earlier build or
/// another umask left more open is closed).
pub fn private_dir(path: &Path) -> io::Result<()> {
    create_dir_all(path, PRIVATE_DIR)?;
    std::fs::set_permissions(path, Permissions::from_mode(PRIVATE_DIR))
}
