//! One connection to a driver process: connect, check the peer, negotiate; then one
//! writer (whole lines, under a lock) and one reader task that hands each answer to
//! the request waiting for its id. When the connection ends, every request still
//! waiting learns that it was lost.

use crate::config::ExternalConfig;
use crate::wire::{self, AgentHello, DriverHello, ErrorBody, Op, Reply, WireError, VERSIONS};
use capstan_common::{DriverKind, ErrorCode};
use capstan_driver::{DriverError, Exit};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Why no connection to the driver could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the driver at {} did not answer the hello in time", path.display())]
    Timeout { path: PathBuf },
    #[error("cannot read the credentials of the process behind {}", path.display())]
    PeerCred {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the process behind {} runs as uid {uid} gid {gid}, which [external] does not trust \
         (allowed_uids, allowed_gids)",
        path.display()
    )]
    Untrusted { path: PathBuf, uid: u32, gid: u32 },
    #[error("the hello failed")]
    Wire(#[source] WireError),
    #[error("the driver refused the hello: {}: {}", .0.code, .0.message)]
    Refused(ErrorBody),
    #[error("the driver chose protocol version {chosen}, which was not offered ({offered:?})")]
    BadVersion { chosen: u32, offered: Vec<u32> },
    #[error("the driver announces a kind that is no kind's name")]
    BadKind(#[source] capstan_common::BadKind),
    #[error("the driver announces kind `{have}`, expected `{want}`")]
    WrongKind { want: DriverKind, have: DriverKind },
}

/// The connection broke: the request may or may not have been carried out.
#[derive(Debug, thiserror::Error)]
#[error("the connection to the driver was lost")]
pub struct Lost {
    #[source]
    cause: Option<Arc<WireError>>,
}

/// How a request failed.
pub(super) enum Failure {
    /// The driver answered with an error.
    Refused(ErrorBody),
    Lost(Lost),
}

impl Failure {
    pub(super) fn into_driver_error(self, op: &'static str, target: String) -> DriverError {
        match self {
            Failure::Refused(body) => DriverError::Refused {
                op,
                target,
                code: body.error_code(),
                reason: match body.error_code() {
                    // An unknown code is kept in the message.
                    ErrorCode::DriverFailed if body.code != "driver_failed" => {
                        format!("{}: {}", body.code, body.message)
                    }
                    _ => body.message,
                },
            },
            Failure::Lost(lost) => DriverError::Unavailable {
                op,
                target,
                source: Box::new(lost),
            },
        }
    }
}

/// How hard to try to connect: until the deadline (at start, the driver may still be
/// coming up), or once (a reconnect); the hello must be done by the deadline.
pub(super) enum Handshake {
    Retry(Instant),
    Once(Instant),
}

type Answer = oneshot::Sender<Result<Value, ErrorBody>>;

enum Pending {
    Call(Answer),
    Watch {
        exits: mpsc::Sender<Exit>,
        done: Answer,
    },
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    /// Set once the connection ended (with why, when known).
    lost: Option<Option<Arc<WireError>>>,
}

type Shared = Arc<std::sync::Mutex<State>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, State> {
    state.lock().expect("connection state lock")
}

pub(super) struct Conn {
    writer: Mutex<OwnedWriteHalf>,
    state: Shared,
    reader: JoinHandle<()>,
    next_id: AtomicU64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The kind a driver announced: any name in the kind grammar (a driver of a new kind
/// runs the specs that name it).
pub(super) fn kind_of(kind: &str) -> Result<DriverKind, ConnectError> {
    kind.parse().map_err(ConnectError::BadKind)
}

impl Conn {
    pub(super) async fn open(
        config: &ExternalConfig,
        how: Handshake,
    ) -> Result<(Conn, DriverHello), ConnectError> {
        let path = config.socket.clone();
        let (deadline, retry) = match how {
            Handshake::Retry(d) => (d, true),
            Handshake::Once(d) => (d, false),
        };
        let stream = loop {
            match UnixStream::connect(&path).await {
                Ok(s) => break s,
                // Not there yet (no socket, or nobody listening on it): wait for it.
                Err(e)
                    if retry
                        && Instant::now() < deadline
                        && matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                        ) =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(source) => return Err(ConnectError::Connect { path, source }),
            }
        };
        let cred = stream
            .peer_cred()
            .map_err(|source| ConnectError::PeerCred {
                path: path.clone(),
                source,
            })?;
        if !config.trusts(cred.uid(), cred.gid()) {
            return Err(ConnectError::Untrusted {
                path,
                uid: cred.uid(),
                gid: cred.gid(),
            });
        }
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let hello = tokio::time::timeout_at(deadline, hello(&mut reader, &mut write, &VERSIONS))
            .await
            .map_err(|_| ConnectError::Timeout { path })??;
        let state = Shared::default();
        let conn = Conn {
            writer: Mutex::new(write),
            reader: tokio::spawn(read_replies(reader, Arc::clone(&state))),
            state,
            next_id: AtomicU64::new(1),
        };
        Ok((conn, hello))
    }

    pub(super) fn is_closed(&self) -> bool {
        lock(&self.state).lost.is_some()
    }

    pub(super) async fn call(&self, op: &Op) -> Result<Value, Failure> {
        self.request(op, Pending::Call).await
    }

    /// A `watch_exits` request: its exits go to `exits` until it is answered.
    pub(super) async fn watch(&self, exits: mpsc::Sender<Exit>) -> Result<Value, Failure> {
        self.request(&Op::WatchExits, |done| Pending::Watch { exits, done })
            .await
    }

    async fn request(
        &self,
        op: &Op,
        pending: impl FnOnce(Answer) -> Pending,
    ) -> Result<Value, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        {
            let mut state = lock(&self.state);
            if let Some(cause) = &state.lost {
                return Err(Failure::Lost(Lost {
                    cause: cause.clone(),
                }));
            }
            state.pending.insert(id, pending(answer));
        }
        // Forgets the request if this future is dropped before its answer.
        let _forget = Forget(&self.state, id);
        let mut line = wire::request_line(id, op);
        line.push('\n');
        let written = self.writer.lock().await.write_all(line.as_bytes()).await;
        if let Err(e) = written {
            close(&self.state, Some(WireError::Io(e)));
        }
        match answered.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(body)) => Err(Failure::Refused(body)),
            Err(_) => Err(Failure::Lost(Lost {
                cause: lock(&self.state).lost.clone().flatten(),
            })),
        }
    }
}

struct Forget<'a>(&'a Shared, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.0).pending.remove(&self.1);
    }
}

/// Sends the agent's hello offering `versions` and reads the driver's.
pub(crate) async fn hello(
    reader: &mut BufReader<OwnedReadHalf>,
    writer: &mut OwnedWriteHalf,
    versions: &[u32],
) -> Result<DriverHello, ConnectError> {
    let ours = AgentHello {
        protocol: versions.to_vec(),
        agent: format!("capstan-agent {}", env!("CARGO_PKG_VERSION")),
    };
    let mut line = wire::hello_line(&ours);
    line.push('\n');
    let io = |e| ConnectError::Wire(WireError::Io(e));
    writer.write_all(line.as_bytes()).await.map_err(io)?;
    let mut buf = Vec::new();
    if !wire::read_line(reader, &mut buf)
        .await
        .map_err(ConnectError::Wire)?
    {
        return Err(ConnectError::Wire(WireError::Closed));
    }
    let theirs: DriverHello = wire::parse_hello(&buf)
        .map_err(ConnectError::Wire)?
        .map_err(ConnectError::Refused)?;
    if !versions.contains(&theirs.protocol) {
        return Err(ConnectError::BadVersion {
            chosen: theirs.protocol,
            offered: versions.to_vec(),
        });
    }
    Ok(theirs)
}

/// Marks the connection lost and fails every request waiting on it.
fn close(state: &Shared, cause: Option<WireError>) {
    let mut state = lock(state);
    if state.lost.is_none() {
        state.lost = Some(cause.map(Arc::new));
    }
    // Dropping the answer senders wakes every waiter with "lost".
    state.pending.clear();
}

/// Hands each reply to its request until the connection ends.
async fn read_replies(mut reader: BufReader<OwnedReadHalf>, state: Shared) {
    let mut buf = Vec::new();
    let cause = loop {
        match wire::read_line(&mut reader, &mut buf).await {
            Ok(false) => break None,
            Err(e) => break Some(e),
            Ok(true) => {}
        }
        let reply = match Reply::parse(&buf) {
            Ok(reply) => reply,
            Err(e) => {
                let line = String::from_utf8_lossy(&buf[..buf.len().min(512)]).into_owned();
                tracing::error!(%line, "the external driver broke the protocol: disconnecting");
                break Some(e);
            }
        };
        let (id, result) = match reply {
            Reply::Ok(id, value) => (id, Ok(value)),
            Reply::Error(id, body) => (id, Err(body)),
            Reply::Exit(id, exit) => {
                let feed = match lock(&state).pending.get(&id) {
                    Some(Pending::Watch { exits, .. }) => Some(exits.clone()),
                    _ => None,
                };
                // An exit for a feed nobody watches any more is dropped.
                if let Some(feed) = feed {
                    let _ = feed.send(exit.into()).await;
                }
                continue;
            }
        };
        let answer = match lock(&state).pending.remove(&id) {
            Some(Pending::Call(answer) | Pending::Watch { done: answer, .. }) => answer,
            None => continue,
        };
        let _ = answer.send(result);
    };
    if let Some(e) = &cause {
        tracing::warn!(error = %e, "the connection to the external driver broke");
    }
    close(&state, cause);
}
