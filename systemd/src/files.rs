//! The unit files on disk: written atomically (a temporary file, fsync, rename, fsync
//! of the directory) and only when their content changes, so an unchanged rollout
//! costs no reload and no restart.
//!
//! Their modes are the code's, whatever the agent's umask ([`capstan_common::files`]):
//! units and slices [`UNIT`] (`0644`, as systemd's own), env drop-ins [`ENV_DROPIN`]
//! (`0600`: a launch environment may hold a grant's credentials; systemd reads them
//! as root), the drop-in directories made for them `0755`.

use capstan_common::files;
use std::io::Write;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// The mode of unit files (services, slices).
pub const UNIT: u32 = files::PUBLIC_FILE;
/// The mode of env drop-ins.
pub const ENV_DROPIN: u32 = files::PRIVATE_FILE;

/// Writes `content` to `path`, mode `mode`, unless it already holds exactly that
/// (then only its mode is set, if it differs). True when it wrote.
pub fn write_if_changed(path: &Path, content: &str, mode: u32) -> std::io::Result<bool> {
    match std::fs::read(path) {
        Ok(existing) if existing == content.as_bytes() => {
            if std::fs::metadata(path)?.permissions().mode() & 0o7777 != mode {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            }
            return Ok(false);
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    files::create_dir_all(dir, files::PUBLIC_DIR)?;
    let mut tmp = tempfile_in(dir, path, mode)?;
    tmp.1.write_all(content.as_bytes())?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)?;
    sync_dir(dir)?;
    Ok(true)
}

/// Removes `path`; true when it was there.
pub fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            sync_dir(path.parent().unwrap_or(Path::new(".")))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes the directory `path` and what is in it; true when it was there.
pub fn remove_dir(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes the temporary files a writer killed between its write and its rename left
/// in `dir` (`.<name>.<pid>.<n>.tmp` of names beginning with `prefix`); returns how
/// many. Only while no write of this process is under way (at connect).
pub fn remove_temporaries(dir: &Path, prefix: &str) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        let ours = name
            .strip_prefix('.')
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".tmp"));
        if ours && remove(&dir.join(&*name))? {
            removed += 1;
        }
    }
    Ok(removed)
}

/// A new file beside `path` (same file system, so the rename is atomic). The name
/// starts with `.` so systemd never reads it as a unit.
fn tempfile_in(
    dir: &Path,
    path: &Path,
    mode: u32,
) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for attempt in 0u32.. {
        let tmp = dir.join(format!(".{base}.{}.{attempt}.tmp", std::process::id()));
        match files::create_new(&tmp, mode) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 64 => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_only_changes_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.service");
        assert!(write_if_changed(&path, "one", UNIT).unwrap());
        assert!(!write_if_changed(&path, "one", UNIT).unwrap());
        assert!(write_if_changed(&path, "two", UNIT).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.service"]);
        assert!(remove(&path).unwrap());
        assert!(!remove(&path).unwrap());
    }

    #[test]
    fn temporaries_left_by_a_killed_writer_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let keep = ["capstan-a.service", ".other.1.0.tmp", "capstan-b.tmp"];
        for name in keep
            .iter()
            .chain(&[".capstan-a.service.7.0.tmp", ".capstan-x.slice.9.3.tmp"])
        {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        assert_eq!(remove_temporaries(dir.path(), "capstan-").unwrap(), 2);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".other.1.0.tmp", "capstan-a.service", "capstan-b.tmp"]
        );
    }

    #[test]
    fn creates_the_directory_of_a_drop_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.service.d").join("50-env.conf");
        assert!(write_if_changed(&path, "[Service]\n", ENV_DROPIN).unwrap());
        assert!(remove_dir(&dir.path().join("x.service.d")).unwrap());
    }
}
