//! The SSH side of `capstan install` (russh): host key verification against an
//! OpenSSH known_hosts file, ed25519 public key authentication, and commands run over
//! exec channels with their stdin streamed.
//!
//! Host keys: what the known_hosts file says of `host` (or `[host]:port`) is read by
//! [`super::known_hosts`]. A key `@revoked` for the host is refused, whatever else
//! the file says; the presented key is trusted when one of the host's recorded keys
//! is equal; when the host has recorded keys and none is equal, the connection is
//! refused naming both fingerprints; a host known only through a `@cert-authority`
//! line is refused (no host certificates here); an unknown host is refused too unless
//! `accept_new` (trust on first use), which appends its key.

use super::known_hosts::{self, KnownHostsError, Verdict};
use russh::client;
use russh::keys::{HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot read the identity {path}")]
    Identity {
        path: PathBuf,
        #[source]
        source: russh::keys::Error,
    },
    #[error("the identity {path} is a {algorithm} key: only ed25519 keys are supported")]
    NotEd25519 { path: PathBuf, algorithm: String },
    #[error("cannot read the known_hosts file {path}")]
    KnownHosts {
        path: PathBuf,
        #[source]
        source: russh::keys::Error,
    },
    #[error("the known_hosts file {path}")]
    KnownHostsFile {
        path: PathBuf,
        #[source]
        source: KnownHostsError,
    },
    #[error("HOST KEY REVOKED for {host}: it presented {presented}, marked @revoked in the known_hosts file {path} (line {line})")]
    Revoked {
        host: String,
        presented: String,
        path: PathBuf,
        line: usize,
    },
    #[error("{host} is known only by a @cert-authority line of the known_hosts file {path} (line {line}): capstan install uses no host certificates; record the host's own key (its key is {presented})")]
    OnlyAuthority {
        host: String,
        presented: String,
        path: PathBuf,
        line: usize,
    },
    #[error("HOST KEY MISMATCH for {host}: it presented {presented}, the known_hosts file {path} holds {recorded}")]
    Mismatch {
        host: String,
        presented: String,
        recorded: String,
        path: PathBuf,
    },
    #[error("{host} is not in the known_hosts file {path} (its key is {presented}): add it, or pass --accept-new")]
    Unknown {
        host: String,
        presented: String,
        path: PathBuf,
    },
    #[error(
        "{host} presented a certificate, not a plain host key: host certificates are not supported"
    )]
    Certificate { host: String },
    #[error("cannot connect to {host} within {timeout:?}")]
    ConnectTimeout { host: String, timeout: Duration },
    #[error("the SSH connection to {host} failed")]
    Connect {
        host: String,
        #[source]
        source: russh::Error,
    },
    #[error("{user}@{host} did not accept the key {path}")]
    Denied {
        user: String,
        host: String,
        path: PathBuf,
    },
    #[error("running a command on {host} failed")]
    Channel {
        host: String,
        #[source]
        source: russh::Error,
    },
    #[error("the command on {host} ended without an exit status")]
    NoExitStatus { host: String },
}

/// `SHA256:<base64 without padding>`, as `ssh-keygen -l` and OpenSSH's prompts print.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// How to check host keys.
#[derive(Clone, Debug)]
pub struct HostKeys {
    pub known_hosts: PathBuf,
    /// Trust an unknown host's key on first use, and record it.
    pub accept_new: bool,
}

/// Loads an OpenSSH ed25519 private key (no passphrase).
pub fn load_identity(path: &Path) -> Result<Arc<PrivateKey>, SshError> {
    let key = russh::keys::load_secret_key(path, None).map_err(|source| SshError::Identity {
        path: path.to_path_buf(),
        source,
    })?;
    if key.algorithm() != russh::keys::Algorithm::Ed25519 {
        return Err(SshError::NotEd25519 {
            path: path.to_path_buf(),
            algorithm: key.algorithm().to_string(),
        });
    }
    Ok(Arc::new(key))
}

struct Checker {
    host: String,
    port: u16,
    keys: HostKeys,
    /// Why the key was refused, read after the handshake failed.
    refused: Arc<Mutex<Option<SshError>>>,
}

impl Checker {
    fn check(&self, presented: &PublicKey) -> Result<(), SshError> {
        let path = &self.keys.known_hosts;
        let known = known_hosts::read(path, &self.host, self.port).map_err(|source| {
            SshError::KnownHostsFile {
                path: path.clone(),
                source,
            }
        })?;
        match known_hosts::verdict(&known, presented) {
            Verdict::Trusted => Ok(()),
            Verdict::Revoked(line) => Err(SshError::Revoked {
                host: self.host.clone(),
                presented: fingerprint(presented),
                path: path.clone(),
                line,
            }),
            Verdict::OnlyAuthority(line) => Err(SshError::OnlyAuthority {
                host: self.host.clone(),
                presented: fingerprint(presented),
                path: path.clone(),
                line,
            }),
            Verdict::Mismatch(recorded) => Err(SshError::Mismatch {
                host: self.host.clone(),
                presented: fingerprint(presented),
                recorded: recorded.join(", "),
                path: path.clone(),
            }),
            Verdict::Unknown if self.keys.accept_new => {
                russh::keys::known_hosts::learn_known_hosts_path(
                    &self.host, self.port, presented, path,
                )
                .map_err(|source| SshError::KnownHosts {
                    path: path.clone(),
                    source,
                })
            }
            Verdict::Unknown => Err(SshError::Unknown {
                host: self.host.clone(),
                presented: fingerprint(presented),
                path: path.clone(),
            }),
        }
    }
}

impl client::Handler for Checker {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let result = match key {
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } => self.check(key),
            russh::keys::PublicKeyOrCertificate::Certificate(_) => Err(SshError::Certificate {
                host: self.host.clone(),
            }),
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) => {
                *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                Ok(false)
            }
        }
    }
}

/// What a command printed and how it exited.
#[derive(Debug)]
pub struct Output {
    pub status: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).trim().to_string()
    }
}

/// An authenticated SSH connection to one host.
pub struct Session {
    host: String,
    handle: client::Handle<Checker>,
}

impl Session {
    /// Connects to `host:port` within `timeout`, verifies its host key (nothing is
    /// sent before it is trusted), and authenticates as `user` with `identity`.
    pub async fn connect(
        user: &str,
        host: &str,
        port: u16,
        identity: Arc<PrivateKey>,
        identity_path: &Path,
        keys: HostKeys,
        timeout: Duration,
    ) -> Result<Session, SshError> {
        let refused = Arc::new(Mutex::new(None));
        let checker = Checker {
            host: host.to_string(),
            port,
            keys,
            refused: refused.clone(),
        };
        // Keepalives, so a host that goes away mid-command fails the run instead of
        // hanging it (a quiet `dpkg -i` is not idle: the server answers them).
        let config = Arc::new(client::Config {
            inactivity_timeout: None,
            keepalive_interval: Some(Duration::from_secs(15)),
            keepalive_max: 3,
            ..client::Config::default()
        });
        let connect = client::connect(config, (host, port), checker);
        let connected =
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| SshError::ConnectTimeout {
                    host: host.to_string(),
                    timeout,
                })?;
        let mut handle = match connected {
            Ok(handle) => handle,
            Err(source) => {
                if let Some(why) = refused.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    return Err(why);
                }
                return Err(SshError::Connect {
                    host: host.to_string(),
                    source,
                });
            }
        };
        let auth = handle
            .authenticate_publickey(user, PrivateKeyWithHashAlg::new(identity, None))
            .await
            .map_err(|source| SshError::Connect {
                host: host.to_string(),
                source,
            })?;
        if !auth.success() {
            return Err(SshError::Denied {
                user: user.to_string(),
                host: host.to_string(),
                path: identity_path.to_path_buf(),
            });
        }
        Ok(Session {
            host: host.to_string(),
            handle,
        })
    }

    /// Runs `command` (by the user's shell), streaming `stdin` to it, and collects
    /// its output and exit status.
    pub async fn run(&self, command: &str, stdin: &[u8]) -> Result<Output, SshError> {
        let channel_error = |source| SshError::Channel {
            host: self.host.clone(),
            source,
        };
        let mut channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(channel_error)?;
        channel.exec(true, command).await.map_err(channel_error)?;
        if !stdin.is_empty() {
            channel.data(stdin).await.map_err(channel_error)?;
        }
        channel.eof().await.map_err(channel_error)?;
        let mut out = Output {
            status: u32::MAX,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        let mut status = None;
        while let Some(msg) = channel.wait().await {
            match msg {
                russh::ChannelMsg::Data { data } => out.stdout.extend_from_slice(&data),
                russh::ChannelMsg::ExtendedData { data, .. } => {
                    out.stderr.extend_from_slice(&data);
                }
                russh::ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
                russh::ChannelMsg::Close => break,
                _ => {}
            }
        }
        out.status = status.ok_or_else(|| SshError::NoExitStatus {
            host: self.host.clone(),
        })?;
        Ok(out)
    }

    pub async fn close(self) {
        // Best effort: the work is done, a lost goodbye changes nothing.
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two ed25519 public keys (from `ssh-keygen -t ed25519`) and their fingerprints
    // as `ssh-keygen -l -f` printed them.
    const A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIZMnIEaX5ioed+G128JMKEIp4LBwsvjxFGcdz5ImAqF a";
    const B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO/UcyI3mQmmcHp3DjpRMurzrRFLMCRbPw3fcuUszP7+ b";

    fn fps(keys: Vec<PublicKey>) -> Vec<String> {
        keys.iter().map(fingerprint).collect()
    }

    fn key(text: &str) -> PublicKey {
        PublicKey::from_openssh(text).expect("a public key")
    }

    /// The plain keys `path` records for `host` on `port`.
    fn recorded_keys(
        path: &Path,
        host: &str,
        port: u16,
    ) -> Result<Vec<PublicKey>, KnownHostsError> {
        Ok(known_hosts::read(path, host, port)?
            .keys
            .into_iter()
            .map(|(_, k)| k)
            .collect())
    }

    #[test]
    fn fingerprints_are_sha256_base64_without_padding() {
        let f = fingerprint(&key(A));
        assert_eq!(f, "SHA256:qs1dfqH0XRRyCeSVwKtlyNyGR8RxbDolrODZaqJqZu4");
        assert_eq!(f.len(), "SHA256:".len() + 43, "{f}");
        assert!(!f.ends_with('='), "{f}");
        assert_ne!(f, fingerprint(&key(B)));
    }

    #[test]
    fn the_verdict_trusts_an_equal_key_and_names_every_other() {
        let recorded = |keys: &[&str]| known_hosts::ForHost {
            keys: keys.iter().map(|k| (1, key(k))).collect(),
            ..Default::default()
        };
        let verdict = known_hosts::verdict;
        assert_eq!(verdict(&recorded(&[B, A]), &key(A)), Verdict::Trusted);
        assert_eq!(verdict(&recorded(&[]), &key(A)), Verdict::Unknown);
        assert_eq!(
            verdict(&recorded(&[B]), &key(A)),
            Verdict::Mismatch(vec![fingerprint(&key(B))])
        );
    }

    #[test]
    fn known_hosts_entries_plain_with_port_and_in_lists_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        let a = A.rsplit_once(' ').unwrap().0;
        let b = B.rsplit_once(' ').unwrap().0;
        std::fs::write(
            &path,
            format!("# comment\nweb-1 {a}\n[web-1]:2222 {b}\nother,10.0.0.3 {b}\n"),
        )
        .unwrap();
        assert_eq!(
            fps(recorded_keys(&path, "web-1", 22).unwrap()),
            vec![fingerprint(&key(A))]
        );
        assert_eq!(
            fps(recorded_keys(&path, "web-1", 2222).unwrap()),
            vec![fingerprint(&key(B))]
        );
        assert_eq!(
            fps(recorded_keys(&path, "10.0.0.3", 22).unwrap()),
            vec![fingerprint(&key(B))]
        );
        assert!(recorded_keys(&path, "web-2", 22).unwrap().is_empty());
        assert!(recorded_keys(&dir.path().join("none"), "web-1", 22)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn hashed_known_hosts_entries_are_found() {
        // `ssh-keygen -H` hashes "web-1" with a salt: HMAC-SHA1(salt, host).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        let a = A.rsplit_once(' ').unwrap().0;
        std::fs::write(&path, format!("web-1 {a}\n")).unwrap();
        let hashed = std::process::Command::new("ssh-keygen")
            .arg("-H")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("run ssh-keygen -H");
        assert!(hashed.status.success(), "{hashed:?}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("|1|"), "{text}");
        assert_eq!(
            fps(recorded_keys(&path, "web-1", 22).unwrap()),
            vec![fingerprint(&key(A))]
        );
        assert!(recorded_keys(&path, "web-2", 22).unwrap().is_empty());
    }

    #[test]
    fn accept_new_records_an_unknown_host_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_hosts");
        let checker = Checker {
            host: "web-1".into(),
            port: 2222,
            keys: HostKeys {
                known_hosts: path.clone(),
                accept_new: true,
            },
            refused: Arc::default(),
        };
        checker.check(&key(A)).unwrap();
        assert_eq!(
            fps(recorded_keys(&path, "web-1", 2222).unwrap()),
            vec![fingerprint(&key(A))]
        );
        checker.check(&key(A)).unwrap();
        assert_eq!(recorded_keys(&path, "web-1", 2222).unwrap().len(), 1);
        let err = checker.check(&key(B)).unwrap_err().to_string();
        assert!(err.contains(&fingerprint(&key(A))), "{err}");
        assert!(err.contains(&fingerprint(&key(B))), "{err}");
        let strict = Checker {
            host: "web-2".into(),
            port: 22,
            keys: HostKeys {
                known_hosts: path,
                accept_new: false,
            },
            refused: Arc::default(),
        };
        let err = strict.check(&key(A)).unwrap_err();
        assert!(matches!(err, SshError::Unknown { .. }), "{err}");
    }

    #[test]
    fn given_accept_new_a_revoked_key_or_a_host_known_by_its_ca_is_refused_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        let a = A.rsplit_once(' ').unwrap().0;
        let b = B.rsplit_once(' ').unwrap().0;
        let text = format!("@revoked * {a}\n@cert-authority *.example.com {b}\n");
        std::fs::write(&path, &text).unwrap();
        let checker = |host: &str| Checker {
            host: host.into(),
            port: 22,
            keys: HostKeys {
                known_hosts: path.clone(),
                accept_new: true,
            },
            refused: Arc::default(),
        };
        let err = checker("web-1").check(&key(A)).unwrap_err();
        assert!(matches!(err, SshError::Revoked { line: 1, .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "HOST KEY REVOKED for web-1: it presented {}, marked @revoked in the \
                 known_hosts file {} (line 1)",
                fingerprint(&key(A)),
                path.display()
            )
        );
        let err = checker("db.example.com").check(&key(B)).unwrap_err();
        assert!(
            matches!(err, SshError::OnlyAuthority { line: 2, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("uses no host certificates"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "nothing was recorded"
        );
        // Another key on first use is recorded as before.
        checker("web-1").check(&key(B)).unwrap();
        assert_eq!(recorded_keys(&path, "web-1", 22).unwrap().len(), 1);
    }
}
