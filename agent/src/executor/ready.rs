//! Waiting for a started revision to pass its readiness check (`spec.readiness`): the
//! gate between starting a revision and stopping the one it replaces.

use super::Executor;
use capstan_common::{ErrorCode, Readiness};
use capstan_driver::{DriverError, Probe, RevisionRef};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A started revision that did not become ready.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotReady {
    #[error(
        "{revision} was not ready within {deadline_ms} ms ({probes} probes; the last: {last})"
    )]
    Deadline {
        revision: String,
        deadline_ms: u32,
        probes: u32,
        last: String,
    },
    #[error("cancelled while waiting for {revision} to be ready ({probes} probes)")]
    Cancelled { revision: String, probes: u32 },
    #[error("cannot probe {revision}'s readiness")]
    Probe {
        revision: String,
        #[source]
        source: DriverError,
    },
}

impl NotReady {
    pub(super) fn code(&self) -> ErrorCode {
        match self {
            NotReady::Deadline { .. } => ErrorCode::NotReady,
            NotReady::Cancelled { .. } => ErrorCode::Cancelled,
            NotReady::Probe { source, .. } => source.code(),
        }
    }

    /// The message with the driver's causes, for reports.
    pub(super) fn report(&self) -> String {
        match self {
            NotReady::Probe { source, .. } => format!("{self}: {}", source.report()),
            _ => self.to_string(),
        }
    }
}

impl Executor {
    /// Probes `rev` every `interval` until it passes `threshold` probes in a row, or
    /// fails once its deadline (counted from now, just after the driver started it)
    /// leaves no room for another probe. `cancel` (the agent's stop) cuts the wait.
    pub(super) async fn until_ready(
        &self,
        rev: RevisionRef<'_>,
        readiness: &Readiness,
        cancel: &CancellationToken,
    ) -> Result<(), NotReady> {
        let deadline = Instant::now() + readiness.deadline();
        let (mut probes, mut passed) = (0u32, 0u32);
        loop {
            let began = Instant::now();
            let probe = self
                .driver
                .probe(rev, &readiness.check, readiness.timeout())
                .await
                .map_err(|source| NotReady::Probe {
                    revision: rev.to_string(),
                    source,
                })?;
            probes += 1;
            let last = match probe {
                Probe::Ready => {
                    passed += 1;
                    if passed >= readiness.threshold {
                        tracing::info!(revision = %rev, probes, "ready");
                        return Ok(());
                    }
                    "passed, below the threshold".to_string()
                }
                Probe::NotReady(why) => {
                    passed = 0;
                    tracing::debug!(revision = %rev, probes, %why, "not ready yet");
                    why
                }
            };
            let next = began + readiness.interval();
            if next >= deadline {
                return Err(NotReady::Deadline {
                    revision: rev.to_string(),
                    deadline_ms: readiness.deadline_ms,
                    probes,
                    last,
                });
            }
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = cancel.cancelled() => {
                    return Err(NotReady::Cancelled {
                        revision: rev.to_string(),
                        probes,
                    })
                }
            }
        }
    }
}
