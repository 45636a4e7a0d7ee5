//! The agent's side: [`ExternalDriver`] is a [`Driver`] whose every operation is a
//! request to a driver process over its socket. One connection carries every request
//! (answers matched by id). When it breaks, the requests in flight fail with
//! `driver_unavailable` (retryable: driver operations are idempotent) and the next
//! operation connects again.

mod conn;

use crate::config::ExternalConfig;
use crate::wire::{self, Op, Rev, WireCapabilities, WireObserved, WireProbe};
use capstan_common::{Check, DriverKind, Spec};
use capstan_driver::{
    BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, Probe, RevisionRef,
};
use conn::{Conn, Handshake};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

pub use conn::ConnectError;

/// A driver in another process, reached over its Unix socket.
pub struct ExternalDriver {
    config: ExternalConfig,
    kind: DriverKind,
    capabilities: WireCapabilities,
    /// The live connection; `None` or closed: the next operation connects again.
    conn: Mutex<Option<Arc<Conn>>>,
}

impl ExternalDriver {
    /// Connects to the driver at `config.socket` and negotiates, waiting up to
    /// `connect_timeout` for it to come up.
    pub async fn connect(config: ExternalConfig) -> Result<ExternalDriver, ConnectError> {
        let deadline = tokio::time::Instant::now() + config.connect_timeout();
        let (conn, hello) = Conn::open(&config, Handshake::Retry(deadline)).await?;
        let kind = conn::kind_of(&hello.kind)?;
        if let Some(want) = config.kind.filter(|want| *want != kind) {
            return Err(ConnectError::WrongKind { want, have: kind });
        }
        tracing::info!(
            driver = %hello.driver, kind = %kind, protocol = hello.protocol,
            capabilities = ?hello.capabilities, "connected to the external driver"
        );
        Ok(ExternalDriver {
            config,
            kind,
            capabilities: hello.capabilities,
            conn: Mutex::new(Some(Arc::new(conn))),
        })
    }

    /// The live connection, connecting again (once) if it broke. The kind the driver
    /// announces must not change; changed capabilities are only warned about: the
    /// agent keeps those it started with until it restarts.
    async fn conn(&self, op: &'static str, target: &str) -> Result<Arc<Conn>, DriverError> {
        let mut current = self.conn.lock().await;
        if let Some(conn) = current.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        let unavailable = |source: ConnectError| DriverError::Unavailable {
            op,
            target: target.to_string(),
            source: Box::new(source),
        };
        let deadline = tokio::time::Instant::now() + self.config.connect_timeout();
        let (conn, hello) = Conn::open(&self.config, Handshake::Once(deadline))
            .await
            .map_err(unavailable)?;
        let kind = conn::kind_of(&hello.kind).map_err(unavailable)?;
        if kind != self.kind {
            return Err(unavailable(ConnectError::WrongKind {
                want: self.kind,
                have: kind,
            }));
        }
        if hello.capabilities != self.capabilities {
            tracing::warn!(
                was = ?self.capabilities, now = ?hello.capabilities,
                "the external driver changed its capabilities: restart the agent to use them"
            );
        }
        tracing::info!(driver = %hello.driver, "reconnected to the external driver");
        let conn = Arc::new(conn);
        *current = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// Sends `op` and waits for its answer.
    async fn call(&self, name: &'static str, target: String, op: Op) -> Result<Value, DriverError> {
        let conn = self.conn(name, &target).await?;
        conn.call(&op)
            .await
            .map_err(|failure| failure.into_driver_error(name, target))
    }

    async fn unit(&self, name: &'static str, target: String, op: Op) -> Result<(), DriverError> {
        self.call(name, target, op).await.map(|_| ())
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    op: &'static str,
    target: String,
    value: Value,
) -> Result<T, DriverError> {
    serde_json::from_value(value).map_err(|e| DriverError::Backend {
        op,
        target,
        source: Box::new(wire::WireError::Malformed(e.to_string())),
    })
}

#[async_trait::async_trait]
impl Driver for ExternalDriver {
    fn kind(&self) -> DriverKind {
        self.kind
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities.into()
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = Op::EnsureNamespace {
            namespace: namespace.into(),
        };
        self.unit("ensure_namespace", namespace.into(), op).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = Op::DeleteNamespace {
            namespace: namespace.into(),
        };
        self.unit("delete_namespace", namespace.into(), op).await
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        if spec.readiness.is_some() && !self.capabilities.probes {
            // A check this driver would never carry out.
            let reason = "this external driver did not announce `probes`: it carries out no readiness checks (docs/driver-protocol.md)";
            return Err(DriverError::refused(
                "prepare",
                rev,
                capstan_common::ErrorCode::InvalidSpec,
                reason,
            ));
        }
        let op = Op::Prepare {
            rev: Rev::of(rev),
            spec: spec.clone(),
        };
        self.unit("prepare", rev.to_string(), op).await
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let op = Op::Activate {
            rev: Rev::of(rev),
            spec: spec.clone(),
            launch_env: launch_env.clone(),
            previous: previous.map(str::to_string),
        };
        self.unit("activate", rev.to_string(), op).await
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let op = Op::Start {
            rev: Rev::of(rev),
            spec: spec.clone(),
            launch_env: launch_env.clone(),
        };
        self.unit("start", rev.to_string(), op).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = Op::Resume { rev: Rev::of(rev) };
        self.unit("resume", rev.to_string(), op).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = Op::Stop { rev: Rev::of(rev) };
        self.unit("stop", rev.to_string(), op).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = Op::Retire { rev: Rev::of(rev) };
        self.unit("retire", rev.to_string(), op).await
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let value = self.call("observe", "host".into(), Op::Observe).await?;
        decode::<WireObserved>("observe", "host".into(), value).map(Observed::from)
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        let op = Op::State { rev: Rev::of(rev) };
        let value = self.call("state", rev.to_string(), op).await?;
        decode("state", rev.to_string(), value)
    }

    /// One `probe` request, to a driver that announced `probes`; any other refuses
    /// it as the trait's default does (its specs with `readiness` were refused at
    /// prepare).
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        if !self.capabilities.probes {
            return Err(DriverError::refused(
                "probe",
                rev,
                capstan_common::ErrorCode::InvalidSpec,
                "this external driver did not announce `probes`",
            ));
        }
        let op = Op::Probe {
            rev: Rev::of(rev),
            check: check.clone(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let value = self.call("probe", rev.to_string(), op).await?;
        decode::<WireProbe>("probe", rev.to_string(), value).map(Probe::from)
    }

    /// One `watch_exits` request; its exits arrive on the same connection, tagged with
    /// its id. Ends `Ok` when `exits` is dropped or the driver ends the feed, `Err`
    /// (`driver_unavailable`) when the connection breaks.
    async fn watch_exits(&self, exits: mpsc::Sender<Exit>) -> Result<(), DriverError> {
        let target = "host".to_string();
        let conn = self.conn("watch_exits", &target).await?;
        let closed = exits.clone();
        tokio::select! {
            ended = conn.watch(exits) => ended
                .map(|_| ())
                .map_err(|failure| failure.into_driver_error("watch_exits", target)),
            () = closed.closed() => Ok(()),
        }
    }
}

#[cfg(test)]
pub(crate) use conn::hello as conn_hello_for_tests;
