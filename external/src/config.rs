//! `[external]` in the agent's config: where the driver listens and whom to trust.

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The external driver's section (`[external]` in `agent.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalConfig {
    /// The driver's Unix socket. Default `/run/capstan/driver.sock`.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Seconds the agent waits at start for the driver to accept and answer the
    /// hello (default 10; the agent's config loader accepts 0 < x ≤ 3600); a
    /// reconnect gets the same bound for its hello.
    pub connect_timeout: Option<f64>,
    /// The kind the driver must announce (`sim`, `docker`, …); unset: any.
    pub kind: Option<capstan_common::DriverKind>,
    /// Peer user ids trusted (SO_PEERCRED); default: 0 and the agent's own uid.
    pub allowed_uids: Option<Vec<u32>>,
    /// Peer group ids trusted besides `allowed_uids`; default: none.
    #[serde(default)]
    pub allowed_gids: Vec<u32>,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            socket: default_socket(),
            connect_timeout: None,
            kind: None,
            allowed_uids: None,
            allowed_gids: Vec::new(),
        }
    }
}

fn default_socket() -> PathBuf {
    PathBuf::from("/run/capstan/driver.sock")
}

/// The default `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `connect_timeout`, in seconds.
pub const MAX_CONNECT_TIMEOUT_SECS: f64 = 3600.0;

/// What is wrong with an `[external]` section.
#[derive(Debug, thiserror::Error)]
pub enum ExternalConfigError {
    #[error("`[external] connect_timeout` must be more than 0 and at most 3600 seconds")]
    ConnectTimeout,
}

impl ExternalConfig {
    /// A config for the driver at `socket`, everything else default.
    pub fn at(socket: impl Into<PathBuf>) -> ExternalConfig {
        ExternalConfig {
            socket: socket.into(),
            ..ExternalConfig::default()
        }
    }

    /// Checks the section as `agent.toml` gave it (the agent's loader calls this).
    pub fn validate(&self) -> Result<(), ExternalConfigError> {
        if self
            .connect_timeout
            .is_some_and(|t| !(t > 0.0 && t <= MAX_CONNECT_TIMEOUT_SECS))
        {
            return Err(ExternalConfigError::ConnectTimeout);
        }
        Ok(())
    }

    /// `connect_timeout`, or its default (a section [`ExternalConfig::validate`]
    /// refused is never used).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs_f64)
    }

    /// Whether a peer running as `uid`/`gid` may be our driver.
    pub fn trusts(&self, uid: u32, gid: u32) -> bool {
        let uids = match &self.allowed_uids {
            Some(uids) => uids.clone(),
            None => vec![0, own_uid()],
        };
        uids.contains(&uid) || self.allowed_gids.contains(&gid)
    }
}

/// This process's uid (the owner of `/proc/self`), without `unsafe`.
fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}
