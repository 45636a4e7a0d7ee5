//! `coordinator.toml`. Unknown keys are errors that name the key.

use capstan_common::nats::NatsConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// HTTP listen address; default `127.0.0.1:7400`.
    /// Must be a loopback address unless `tokens_file` is set.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// API tokens (`ROLE SHA256 [NAME]` lines, see [`crate::auth`]). Without it every
    /// caller may do everything, which is allowed on a loopback `listen` only.
    #[serde(default)]
    pub tokens_file: Option<PathBuf>,
    /// The ed25519 secret key (hex seed) commands are signed with
    /// (`capstan-coordinator keygen`).
    pub signing_key_file: PathBuf,
    /// A host whose last beat is older than this is `stale`, in a fleet small enough
    /// to beat every 5 s (it grows with the pace).
    #[serde(default = "default_stale")]
    pub stale_after_secs: u64,
    /// A host silent this long is `gone` (its last beat forgotten), in a fleet small
    /// enough to beat every 5 s (it grows with the pace).
    #[serde(default = "default_hosts_max_age")]
    pub hosts_max_age_secs: u64,
    /// The most beats a second the whole fleet sends between rollouts: a host beats
    /// every `max(5, hosts / max_beats_per_sec)` seconds.
    #[serde(default = "default_max_beats_per_sec")]
    pub max_beats_per_sec: u32,
    /// Take what a host without a registered key publishes unchecked (development
    /// only; a host with a key is always checked).
    #[serde(default)]
    pub allow_unregistered_hosts: bool,
    /// How many `GET /v1/commands/{id}/wait` may be open at once (each holds a NATS
    /// subscription for up to 5 minutes); one more is answered 503 `busy`.
    #[serde(default = "default_max_waits")]
    pub max_waits: usize,
    /// How many requests that read `CAPSTAN_EVT` through a consumer of their own
    /// (`GET /v1/hosts/{host}/events`, `GET /v1/commands/{id}`) may run at once; one
    /// more is answered 503 `busy`.
    #[serde(default = "default_max_stream_reads")]
    pub max_stream_reads: usize,
    #[serde(default)]
    pub nats: NatsConfig,
}

/// The range of `max_waits`.
pub const MAX_WAITS: std::ops::RangeInclusive<usize> = 1..=65536;
/// The range of `max_stream_reads`.
pub const MAX_STREAM_READS: std::ops::RangeInclusive<usize> = 1..=1024;
/// The range of `max_beats_per_sec`.
pub const MAX_BEATS_PER_SEC: std::ops::RangeInclusive<usize> = 1..=100_000;

fn default_max_waits() -> usize {
    1024
}

fn default_max_stream_reads() -> usize {
    64
}

pub(crate) fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7400))
}

fn default_stale() -> u64 {
    15
}

fn default_hosts_max_age() -> u64 {
    60
}

fn default_max_beats_per_sec() -> u32 {
    crate::fleet::liveness::DEFAULT_MAX_BEATS_PER_SEC
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: {key} = {value} is out of range ({min} to {max})")]
    OutOfRange {
        path: PathBuf,
        key: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
    #[error("{path}: listen = \"{listen}\" is not a loopback address, and without `tokens_file` anyone who reaches it could have any command signed; set `tokens_file` (make tokens with `capstan-coordinator token`) or listen on 127.0.0.1")]
    OpenListen { path: PathBuf, listen: SocketAddr },
}

impl CoordinatorConfig {
    pub fn load(path: &Path) -> Result<CoordinatorConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: CoordinatorConfig =
            toml::from_str(&text).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        for (key, value, range) in [
            ("max_waits", config.max_waits, MAX_WAITS),
            (
                "max_stream_reads",
                config.max_stream_reads,
                MAX_STREAM_READS,
            ),
            (
                "max_beats_per_sec",
                config.max_beats_per_sec as usize,
                MAX_BEATS_PER_SEC,
            ),
        ] {
            if !range.contains(&value) {
                return Err(ConfigError::OutOfRange {
                    path: path.to_path_buf(),
                    key,
                    value,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
        }
        if config.tokens_file.is_none() && !config.listen.ip().is_loopback() {
            return Err(ConfigError::OpenListen {
                path: path.to_path_buf(),
                listen: config.listen,
            });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "signing_key_file = \"/k\"\n[nats]\nurl = \"nats://h:1\"\n",
        )
        .unwrap();
        let c = CoordinatorConfig::load(&path).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7400");
        assert_eq!(c.nats.url, "nats://h:1");
        assert_eq!((c.max_waits, c.max_stream_reads), (1024, 64));
        std::fs::write(&path, "signing_key_file = \"/k\"\nlisten_addr = \"x\"\n").unwrap();
        let err = CoordinatorConfig::load(&path).unwrap_err();
        let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(text.contains("listen_addr"), "{text}");
    }

    /// Given request limits in and out of their ranges, when loaded, then the ones out
    /// of range stop the coordinator naming the key and the range.
    #[test]
    fn request_limits_are_within_their_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "signing_key_file = \"/k\"\nmax_waits = 1\nmax_stream_reads = 1024\n",
        )
        .unwrap();
        let c = CoordinatorConfig::load(&path).unwrap();
        assert_eq!((c.max_waits, c.max_stream_reads), (1, 1024));
        for (line, key) in [
            (
                "max_waits = 0",
                "max_waits = 0 is out of range (1 to 65536)",
            ),
            ("max_waits = 65537", "max_waits = 65537"),
            (
                "max_stream_reads = 0",
                "max_stream_reads = 0 is out of range (1 to 1024)",
            ),
            ("max_stream_reads = 1025", "max_stream_reads = 1025"),
        ] {
            std::fs::write(&path, format!("signing_key_file = \"/k\"\n{line}\n")).unwrap();
            let err = CoordinatorConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
        std::fs::write(&path, "signing_key_file = \"/k\"\nmax_wait = 3\n").unwrap();
        let err = CoordinatorConfig::load(&path).unwrap_err();
        let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            text.contains("max_wait"),
            "unknown keys stay errors: {text}"
        );
    }

    #[test]
    fn a_non_loopback_listen_needs_a_tokens_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        for listen in ["0.0.0.0:7400", "10.0.0.5:7400", "[::]:7400"] {
            std::fs::write(
                &path,
                format!("signing_key_file = \"/k\"\nlisten = \"{listen}\"\n"),
            )
            .unwrap();
            let err = CoordinatorConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains("tokens_file") && err.contains(listen), "{err}");
            std::fs::write(
                &path,
                format!("signing_key_file = \"/k\"\nlisten = \"{listen}\"\ntokens_file = \"/t\"\n"),
            )
            .unwrap();
            let c = CoordinatorConfig::load(&path).unwrap();
            assert_eq!(c.tokens_file.as_deref(), Some(Path::new("/t")));
        }
        for listen in ["127.0.0.1:7400", "[::1]:7400"] {
            std::fs::write(
                &path,
                format!("signing_key_file = \"/k\"\nlisten = \"{listen}\"\n"),
            )
            .unwrap();
            let c = CoordinatorConfig::load(&path).unwrap();
            assert!(c.tokens_file.is_none());
        }
    }
}
