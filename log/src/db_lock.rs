//! Letting go of the database deterministically.
//!
//! sled holds an exclusive `flock` on `<dir>/db` for as long as any of its handles
//! lives, and not only ours: a write that sled's IO thread pool carried out keeps a
//! handle until its closure returns, which may be *after* the flush that waited for the
//! write has returned. So dropping the last `sled::Db` does not mean the lock is free,
//! and opening the same log again at once (a test; `apply` then `run` in one process)
//! could fail with "could not acquire lock". [`Released`], the last field of
//! [`super::Log`], makes dropping a log wait until sled has closed the file.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Dropped after every sled handle of a [`super::Log`]: waits until the lock is free.
pub struct Released {
    db_file: PathBuf,
}

impl Released {
    /// For the sled database in `dir`.
    pub fn new(dir: &Path) -> Released {
        Released {
            db_file: dir.join("db"),
        }
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        wait_until_released(&self.db_file);
    }
}

/// Takes and at once releases an exclusive lock on `db_file` through a descriptor of
/// our own. `flock` grants it exactly when every descriptor sled holds is closed, so
/// this waits no longer than sled's last IO task (no polling, no timeout). Another
/// process that opens the log in that instant is waited for too, as any opener would.
pub fn wait_until_released(db_file: &Path) {
    let Ok(file) = File::open(db_file) else {
        return;
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive) {
        Ok(lock) => drop(lock),
        Err((_, errno)) => {
            tracing::warn!(%errno, file = %db_file.display(), "cannot wait for the log's lock to be released");
        }
    }
}
