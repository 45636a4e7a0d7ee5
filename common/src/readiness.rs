//! A revision's readiness check (`spec.readiness`): what tells the agent that a started
//! revision serves, so that an activation stops its predecessor only then
//! (`docs/protocol.md`, "Readiness").

use crate::{ErrorCode, Rejection};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How and how often a started revision is probed, and for how long at most.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    pub check: Check,
    /// Between the start of one probe and the next.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u32,
    /// One probe's bound: a probe still running then counts as failed.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u32,
    /// Consecutive passing probes that make the revision ready.
    #[serde(default = "one")]
    pub threshold: u32,
    /// From the driver's start: a revision not ready by then is stopped, its grants are
    /// revoked, and the command fails `not_ready`.
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u32,
}

/// One probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// Run `command` (argv, no shell) inside the workload; exit 0 passes.
    Exec { command: Vec<String> },
    /// `GET path` on the workload's `port`; a 2xx or 3xx status passes.
    Http {
        port: u16,
        #[serde(default = "root")]
        path: String,
    },
    /// A TCP connect to the workload's `port` passes.
    Tcp { port: u16 },
}

fn default_interval_ms() -> u32 {
    1_000
}
fn default_timeout_ms() -> u32 {
    1_000
}
fn one() -> u32 {
    1
}
fn default_deadline_ms() -> u32 {
    60_000
}
fn root() -> String {
    "/".into()
}

/// The bounds a readiness check must keep (`docs/protocol.md`).
pub const INTERVAL_MS: std::ops::RangeInclusive<u32> = 10..=600_000;
pub const TIMEOUT_MS: std::ops::RangeInclusive<u32> = 1..=600_000;
pub const THRESHOLD: std::ops::RangeInclusive<u32> = 1..=100;
pub const DEADLINE_MS: std::ops::RangeInclusive<u32> = 1..=3_600_000;
/// The longest `http.path`, in bytes.
pub const MAX_PATH: usize = 1024;

impl Readiness {
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.into())
    }
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.into())
    }
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.into())
    }
}

/// Checks `readiness`: bounds, an exec argv without NUL, an HTTP path that can go into
/// a request line as it is. Whether the spec's driver can carry the check out is its
/// own rule (the systemd driver probes ports only).
pub fn validate(readiness: &Readiness) -> Result<(), Rejection> {
    let invalid = |m: String| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    let bounded = [
        ("interval_ms", readiness.interval_ms, &INTERVAL_MS),
        ("timeout_ms", readiness.timeout_ms, &TIMEOUT_MS),
        ("threshold", readiness.threshold, &THRESHOLD),
        ("deadline_ms", readiness.deadline_ms, &DEADLINE_MS),
    ];
    for (field, value, range) in bounded {
        if !range.contains(&value) {
            return invalid(format!(
                "`readiness.{field}` must be {}-{} (is {value})",
                range.start(),
                range.end()
            ));
        }
    }
    match &readiness.check {
        Check::Exec { command } => {
            if command.is_empty() || command.iter().any(|a| a.contains('\0')) {
                return invalid("`readiness.check.exec.command` needs a program, and no argument may contain NUL".into());
            }
        }
        Check::Http { port, path } => {
            if *port == 0 {
                return invalid("`readiness.check.http.port` must be 1-65535".into());
            }
            if !is_request_path(path) {
                return invalid(format!(
                    "`readiness.check.http.path` must start with `/` and be at most {MAX_PATH} bytes of printable ASCII without spaces"
                ));
            }
        }
        Check::Tcp { port } => {
            if *port == 0 {
                return invalid("`readiness.check.tcp.port` must be 1-65535".into());
            }
        }
    }
    Ok(())
}

/// An HTTP request target written into a request line as it is: `/`, then printable
/// ASCII (no space, no control character), at most [`MAX_PATH`] bytes.
pub fn is_request_path(path: &str) -> bool {
    path.len() <= MAX_PATH && path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests;
