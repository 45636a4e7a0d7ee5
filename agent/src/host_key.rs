//! The host's own ed25519 key: it signs everything the agent publishes on NATS (each
//! record, heartbeat, result and RPC answer, [`capstan_common::published`]), so the
//! coordinator can refuse what this host did not write. Kept in `host_key_file`
//! (default `<data_dir>/host.key`): the 32-byte seed as 64 hex digits, mode 0600
//! (and the directories made for it 0700) whatever the umask, made on first use (`capstan-agent host-key` prints its public half, for
//! `capstan register`). Never sent anywhere.

use capstan_common::files;
use capstan_common::signing::{KeyError, Signer};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The key file's name in the data dir when `host_key_file` is not set.
pub const FILE: &str = "host.key";

#[derive(Debug, thiserror::Error)]
pub enum HostKeyError {
    #[error("cannot read the host key {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the host key {} is not a key", path.display())]
    Malformed {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
    #[error("cannot write a new host key to {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make a new host key")]
    Generate(#[source] KeyError),
}

/// The key at `path`, made there first (0600, in one `create_new` so two agents
/// starting at once cannot both write one) when there is none.
pub fn load_or_create(path: &Path) -> Result<Signer, HostKeyError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Signer::from_hex(&text).map_err(|source| HostKeyError::Malformed {
            path: path.to_path_buf(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path),
        Err(source) => Err(HostKeyError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn create(path: &Path) -> Result<Signer, HostKeyError> {
    let key = Signer::generate().map_err(HostKeyError::Generate)?;
    let write = |source| HostKeyError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        files::create_dir_all(dir, files::PRIVATE_DIR).map_err(write)?;
    }
    // Written whole to a temporary file (0600 from the start), synced, then linked
    // into place: a crash leaves either no key or a whole one, and of two agents
    // racing only one link wins (the other reads the winner's key).
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let result = (|| {
        let mut file = files::create_new(&tmp, files::PRIVATE_FILE)?;
        writeln!(file, "{}", key.secret_hex())?;
        file.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match result {
        Ok(()) => {
            tracing::info!(path = %path.display(), public_key = %key.public_hex(), "made a new host key; register it with `capstan register`");
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_or_create(path),
        Err(e) => Err(write(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_key_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(FILE);
        let first = load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = load_or_create(&path).unwrap();
        assert_eq!(again.public_hex(), first.public_hex());
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [FILE]);
    }

    #[test]
    fn a_file_that_is_not_a_key_is_an_error_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::fs::write(&path, "not a key\n").unwrap();
        let e = load_or_create(&path).err().expect("refused");
        assert!(matches!(e, HostKeyError::Malformed { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a key\n");
    }
}
