//! `capstan install`: the capstan-agent package and its config onto hosts over SSH,
//! the agent enabled and started, until the coordinator's registry says the host is
//! `alive` (docs/install.md, "capstan install").
//!
//! Per host: connect and verify its host key ([`ssh`]), read what is there (the
//! installed version, the config's digest and mode, the unit's state), upload the
//! package (streamed into a `/tmp` file, its sha256 checked there), decide the steps
//! ([`plan`], pure), carry them out, and wait for `alive`. Many hosts run at once,
//! `concurrency` at a time; each one's result is its own.

pub mod known_hosts;
pub mod name;
mod on_host;
pub mod plan;
mod probe;
pub mod ssh;
pub mod target;
pub mod version;

use crate::client::{Client, ClientError};
use futures::StreamExt as _;
use plan::Outcome;
pub use probe::Probe;
use sha2::{Digest as _, Sha256};
use ssh::{HostKeys, SshError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::Target;

/// The agent package's control field naming the log layouts its build reads
/// (`packaging/deb/build.sh` writes it from `capstan-agent --version`).
pub const LAYOUTS_FIELD: &str = "X-Capstan-Log-Layouts";
/// Where the config goes on a host.
pub const CONFIG_PATH: &str = "/etc/capstan/agent.toml";
/// Where the host's NATS nkey seed goes (`--nats-credentials`); the config's
/// `[nats] nkey_seed_file` must name it.
pub const NKEY_PATH: &str = "/etc/capstan/nats.nk";
const UNIT: &str = "capstan-agent";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(
        "{user}@{host} is not root (uid {uid}): dpkg and systemctl need root; connect as root"
    )]
    NotRoot {
        user: String,
        host: String,
        uid: String,
    },
    #[error("`{step}` failed on {host} (exit {status}): {stderr}")]
    Remote {
        host: String,
        step: &'static str,
        status: u32,
        stderr: String,
    },
    #[error("the upload to {host} arrived corrupted (sha256 {got}, sent {sent})")]
    Corrupted {
        host: String,
        got: String,
        sent: String,
    },
    #[error("{path} is not a capstan-agent package (dpkg-deb says Package: {package:?})")]
    NotTheAgent { path: PathBuf, package: String },
    #[error("{host} answered the state probe with something unreadable: {output:?}")]
    Probe { host: String, output: String },
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Name(#[from] name::NameError),
    #[error("the config is not TOML")]
    Config(#[source] toml::de::Error),
    #[error(
        "{name} was not alive in the coordinator's registry within {timeout:?} (last seen: {last})"
    )]
    NotAlive {
        name: String,
        timeout: Duration,
        last: String,
    },
    #[error("no randomness for the upload's file name")]
    Random(#[source] getrandom::Error),
    #[error("asking the coordinator for its hosts")]
    Coordinator(#[source] ClientError),
    #[error("cannot read the NATS credentials of {name} ({})", path.display())]
    Credentials {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("with --nats-credentials the config of {name} must say `nkey_seed_file = \"{NKEY_PATH}\"` and `host_accounts = true` in [nats]")]
    CredentialsUnused { name: String },
    #[error("registering the host key of {name} with the coordinator")]
    Register {
        name: String,
        #[source]
        source: ClientError,
    },
}

/// What every host gets.
pub struct Install {
    pub identity: Arc<russh::keys::PrivateKey>,
    pub identity_path: PathBuf,
    pub host_keys: HostKeys,
    pub package: PathBuf,
    pub package_bytes: Arc<Vec<u8>>,
    pub upgrade: bool,
    /// `capstan-coordinator nats-config`'s output directory: each host's nkey seed
    /// (`credentials/<name>.nk`) goes to [`NKEY_PATH`].
    pub nats_credentials: Option<PathBuf>,
    pub allow_downgrade: bool,
    pub connect_timeout: Duration,
    /// How long to wait for `alive` once the agent is started.
    pub timeout: Duration,
}

/// One host, the config it gets and its name ([`name`]).
#[derive(Debug)]
pub struct Job {
    pub target: Target,
    pub config: Vec<u8>,
    pub name: name::Name,
}

impl Job {
    /// The job of `target` with `config`: the config must be TOML, and the name it
    /// gives the host a good one.
    pub fn new(target: Target, config: Vec<u8>) -> Result<Job, InstallError> {
        let table: toml::Table =
            toml::from_str(&String::from_utf8_lossy(&config)).map_err(InstallError::Config)?;
        let name = name::of(&table, &target.host)?;
        Ok(Job {
            target,
            config,
            name,
        })
    }
}

/// Checks that no two jobs name their hosts alike.
pub fn check_names(jobs: &[Job]) -> Result<(), name::NameError> {
    name::distinct(
        jobs.iter()
            .map(|j| (j.target.host.as_str(), j.name.name.as_str())),
    )
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    capstan_common::signing::to_hex(&Sha256::digest(bytes))
}

/// Progress lines on stderr, prefixed by the host.
fn progress(host: &str, line: &str) {
    eprintln!("{host}: {line}");
}

/// Installs on every job, `concurrency` at a time; each host's outcome, in the jobs'
/// order.
pub async fn install_all(
    install: &Install,
    client: &Client,
    jobs: Vec<Job>,
    concurrency: usize,
) -> Vec<(String, Result<Outcome, InstallError>)> {
    let mut results: Vec<(usize, String, Result<Outcome, InstallError>)> =
        futures::stream::iter(jobs.into_iter().enumerate())
            .map(|(i, job)| async move {
                let label = job.target.host.clone();
                let result = on_host::install_one(install, client, &job).await;
                if let Err(e) = &result {
                    progress(&label, &format!("failed: {e}"));
                }
                (i, label, result)
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    results.sort_by_key(|(i, _, _)| *i);
    results.into_iter().map(|(_, l, r)| (l, r)).collect()
}

/// Polls `GET /v1/hosts` until `name` is `alive`, within `timeout`.
pub async fn wait_alive(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<(), InstallError> {
    let deadline = Instant::now() + timeout;
    let mut last = "not registered".to_string();
    loop {
        match client.get("/v1/hosts").await {
            Ok(hosts) => {
                let entry = hosts["hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|h| h["host"] == name);
                if let Some(entry) = entry {
                    if entry["status"] == "alive" {
                        return Ok(());
                    }
                    last = entry["status"].as_str().unwrap_or("?").to_string();
                }
            }
            // The coordinator may answer 503 while its NATS connection comes up: keep
            // asking; anything else (a refused token) will not get better.
            Err(ClientError::Api {
                status: 503,
                message,
                ..
            }) => last = message,
            Err(e) => return Err(InstallError::Coordinator(e)),
        }
        if Instant::now() >= deadline {
            return Err(InstallError::NotAlive {
                name: name.to_string(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str) -> Target {
        format!("root@{host}").parse().unwrap()
    }

    #[test]
    fn a_job_names_its_host_from_the_config_else_the_target_never_the_host() {
        let job = Job::new(target("10.0.0.5"), b"host = \"web-1\"\n".to_vec()).unwrap();
        assert_eq!(job.name.name, "web-1");
        let job = Job::new(target("web-2"), b"driver = \"sim\"\n".to_vec()).unwrap();
        assert_eq!(job.name.name, "web-2");
        assert!(matches!(
            Job::new(target("web-2"), b"host = ".to_vec()),
            Err(InstallError::Config(_))
        ));
        for (host, config) in [("coordinator", ""), ("10.0.0.5", "host = \"coordinator\"")] {
            let err = Job::new(target(host), config.as_bytes().to_vec()).unwrap_err();
            assert!(
                matches!(err, InstallError::Name(name::NameError::Reserved { .. })),
                "{err}"
            );
        }
        let err = Job::new(target("10.0.0.5"), Vec::new()).unwrap_err();
        assert!(
            matches!(err, InstallError::Name(name::NameError::NotALabel { .. })),
            "{err}"
        );
        let shared = b"host = \"web\"\n".to_vec();
        let jobs = [
            Job::new(target("10.0.0.4"), shared.clone()).unwrap(),
            Job::new(target("10.0.0.5"), shared).unwrap(),
        ];
        assert!(matches!(
            check_names(&jobs),
            Err(name::NameError::Shared { .. })
        ));
        assert_eq!(check_names(&jobs[..1]), Ok(()));
    }

    #[test]
    fn sha256_hex_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
