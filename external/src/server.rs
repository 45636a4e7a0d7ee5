//! The driver's side: [`serve`] exposes any [`Driver`] over the protocol. Each
//! connection answers its hello, then carries out every request in a task of its
//! own (several in flight at once, answered by id, in any order); the connection's
//! tasks end with it.

use crate::wire::{
    self, AgentHello, DriverHello, ErrorBody, Op, Reply, WireError, WireExit, WireObserved,
    WireProbe, VERSIONS,
};
use capstan_common::ErrorCode;
use capstan_driver::{Driver, DriverError};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument as _;

/// Why a connection was closed by the driver's side.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reading from the agent failed")]
    Wire(#[from] WireError),
    #[error("the agent speaks none of our protocol versions (it offered {0:?})")]
    NoCommonVersion(Vec<u32>),
}

/// The version to speak: the newest both sides know.
pub fn choose(offered: &[u32]) -> Option<u32> {
    VERSIONS.iter().rev().copied().find(|v| offered.contains(v))
}

/// Serves `driver` to every connection on `listener`, for ever (until the task is
/// dropped); fails only when accepting fails.
pub async fn serve(listener: UnixListener, driver: Arc<dyn Driver>) -> std::io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = listener.accept().await?;
        while connections.try_join_next().is_some() {}
        let driver = Arc::clone(&driver);
        let span = tracing::info_span!("connection");
        connections.spawn(
            async move {
                match connection(stream, driver).await {
                    Ok(()) => tracing::info!("the agent disconnected"),
                    Err(e) => {
                        tracing::warn!(error = %capstan_common::report(&e), "connection closed")
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// One agent's connection, until it closes or breaks the protocol.
async fn connection(stream: UnixStream, driver: Arc<dyn Driver>) -> Result<(), ServeError> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let (out, mut lines) = mpsc::unbounded_channel::<String>();
    // The one writer: whole lines, in the order they were queued.
    let writer = tokio::spawn(async move {
        while let Some(mut line) = lines.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    let result = requests(&mut reader, &out, driver).await;
    // Whatever ended the connection, say so before closing it.
    if let Err(e) = &result {
        let code = match e {
            ServeError::NoCommonVersion(_) => ErrorCode::UnsupportedVersion,
            ServeError::Wire(WireError::TooLong) => ErrorCode::TooLarge,
            ServeError::Wire(_) => ErrorCode::InvalidJson,
        };
        let body = ErrorBody::new(code, capstan_common::report(e));
        let _ = out.send(serde_json::json!({ "error": body }).to_string());
    }
    drop(out);
    let _ = writer.await;
    result
}

async fn requests(
    reader: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    out: &mpsc::UnboundedSender<String>,
    driver: Arc<dyn Driver>,
) -> Result<(), ServeError> {
    let mut buf = Vec::new();
    if !wire::read_line(reader, &mut buf).await? {
        return Ok(());
    }
    let hello: AgentHello = match wire::parse_hello(&buf)? {
        Ok(h) => h,
        Err(e) => return Err(WireError::Malformed(format!("expected a hello, got {e:?}")).into()),
    };
    let protocol = choose(&hello.protocol).ok_or(ServeError::NoCommonVersion(hello.protocol))?;
    tracing::info!(agent = %hello.agent, protocol, "agent connected");
    let answer = DriverHello {
        protocol,
        kind: driver.kind().to_string(),
        driver: format!("capstan-external {}", env!("CARGO_PKG_VERSION")),
        capabilities: driver.capabilities().into(),
    };
    let _ = out.send(wire::hello_line(&answer));
    // Dropped (aborting every request in flight) when the connection ends.
    let mut tasks = JoinSet::new();
    while wire::read_line(reader, &mut buf).await? {
        while tasks.try_join_next().is_some() {}
        let (id, op) = wire::parse_request(&buf)?;
        let (driver, out) = (Arc::clone(&driver), out.clone());
        tasks.spawn(async move {
            let reply = match op {
                Ok(op) => match carry_out(&*driver, op, id, &out).await {
                    Ok(value) => Reply::Ok(id, value),
                    Err(e) => Reply::Error(id, ErrorBody::new(e.code(), e.report())),
                },
                Err(refused) => Reply::Error(id, refused),
            };
            let _ = out.send(reply.line());
        });
    }
    Ok(())
}

/// Runs `op` on `driver`; a `watch_exits` streams its exits (tagged `id`) to `out`
/// until the driver's feed ends.
async fn carry_out(
    driver: &dyn Driver,
    op: Op,
    id: u64,
    out: &mpsc::UnboundedSender<String>,
) -> Result<Value, DriverError> {
    let unit = |()| Value::Null;
    match op {
        Op::EnsureNamespace { namespace } => driver.ensure_namespace(&namespace).await.map(unit),
        Op::DeleteNamespace { namespace } => driver.delete_namespace(&namespace).await.map(unit),
        Op::Prepare { rev, spec } => driver.prepare(rev.as_rev(), &spec).await.map(unit),
        Op::Activate {
            rev,
            spec,
            launch_env,
            previous,
        } => driver
            .activate(rev.as_rev(), &spec, &launch_env, previous.as_deref())
            .await
            .map(unit),
        Op::Start {
            rev,
            spec,
            launch_env,
        } => driver
            .start(rev.as_rev(), &spec, &launch_env)
            .await
            .map(unit),
        Op::Resume { rev } => driver.resume(rev.as_rev()).await.map(unit),
        Op::Stop { rev } => driver.stop(rev.as_rev()).await.map(unit),
        Op::Retire { rev } => driver.retire(rev.as_rev()).await.map(unit),
        Op::Observe => driver
            .observe()
            .await
            .map(|o| serde_json::to_value(WireObserved::from(o)).expect("serialises")),
        Op::State { rev } => driver
            .state(rev.as_rev())
            .await
            .map(|s| serde_json::to_value(s).expect("serialises")),
        Op::Probe {
            rev,
            check,
            timeout_ms,
        } => driver
            .probe(rev.as_rev(), &check, Duration::from_millis(timeout_ms))
            .await
            .map(|p| serde_json::to_value(WireProbe::from(p)).expect("serialises")),
        Op::WatchExits => {
            let (exits, mut feed) = mpsc::channel(64);
            let watch = driver.watch_exits(exits);
            tokio::pin!(watch);
            let ended = loop {
                tokio::select! {
                    ended = &mut watch => break ended,
                    Some(exit) = feed.recv() => {
                        let _ = out.send(Reply::Exit(id, WireExit::from(&exit)).line());
                    }
                }
            };
            while let Ok(exit) = feed.try_recv() {
                let _ = out.send(Reply::Exit(id, WireExit::from(&exit)).line());
            }
            ended.map(|()| Value::Null)
        }
    }
}
