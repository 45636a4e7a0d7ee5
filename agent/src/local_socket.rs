//! The agent's local socket, `<data_dir>/agent.sock`: what `capstan-agent log`,
//! `intent` and `log verify` read while `run` holds the log (sled lets one process
//! open it). One JSON request line, one JSON answer line, then the agent closes the
//! connection:
//!
//! - `{"verb":"ping"|"status"|"intent"|"log","body":{…}}` → the answer the NATS RPC
//!   gives for that verb ([`crate::transport::rpc::answer`]; `log` pages at
//!   [`MAX_LOG_RECORDS`]);
//! - `{"verb":"verify"}` → `{"verified":N,"anchor":…}` or
//!   `{"bad":{"seq":N,"defect":"…"}}`: the whole chain checked by the running agent
//!   (from the anchor after a prune; `anchor` is `null` before any);
//! - `{"verb":"export","body":{"since":S,"until":U,"limit":L}}` →
//!   `{"lines":[…],"anchor":…}`: the export lines ([`crate::log::export`]) of records
//!   after `S` up to `U`, at most `L` (and [`export::MAX_LINES`]);
//! - `{"verb":"layout"}` → `{"layout":"2"}`: the storage layout of the log the agent
//!   holds (this build's: it opened it), for `capstan-agent log layout`.
//!
//! The socket is `0600` in the agent's data dir (the shipped unit's is `0700` root):
//! whoever may read the log files may ask. It is never reachable by another user, not
//! even for a moment: [`bind`] makes it inside a private directory and renames it
//! into place.

use crate::executor::Executor;
use crate::log::{export, LogError};
use crate::transport::rpc::{self, MAX_LOG_RECORDS};
use crate::transport::HostInfo;
use capstan_common::answers::{
    read_answer, AgentCode, AnswerError, BadRecord, ErrorBody, ExportAnswer, ExportRequest,
    LayoutAnswer, LogAnswer, LogRequest, Verb, VerifyAnswer,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The socket's file name in the data dir.
pub const SOCKET: &str = "agent.sock";

/// The private directory, beside [`SOCKET`], the socket is made in ([`bind`]), and its
/// name in there: short, since a socket's whole path must fit in 107 bytes, and this
/// one is no longer than the socket's own.
const STAGING: &str = ".sock.d";
const STAGED: &str = "s";

/// The longest request line taken.
const MAX_REQUEST: u64 = 64 * 1024;

/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("cannot serve the local socket {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot ask the running agent over {}", path.display())]
    Ask {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the running agent's answer over {} is not the answer asked for", path.display())]
    Answer {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the running agent refused ({0})")]
    Refused(ErrorBody),
}

/// Makes the socket at `path`, never reachable by another user. The caller holds the
/// log, so no other agent serves this data dir: a socket left there by one that died
/// is replaced, and so is the staging directory a crash in here left.
///
/// How: the socket is bound inside a new directory of mode `0700` beside `path`
/// ([`stage`]), made `0600` there, then renamed over `path` ([`publish`]): while its
/// mode is the umask's, nobody else can pass the directory to reach it, and `path`
/// names the finished socket from its first moment (a rename is atomic; a client
/// meanwhile finds the old socket, refused, or none). Not a umask: it is the whole
/// process's, and while the agent sets one for its bind, every file its other threads
/// create would get it too. Not a `chmod` of the socket before `bind`: a path socket's
/// file only exists from `bind` on, and a `chmod` after it leaves the window this
/// closes.
pub fn bind(path: &Path) -> Result<UnixListener, LocalError> {
    let (listener, staged) = stage(path)?;
    publish(&staged, path)?;
    Ok(listener)
}

/// The first half of [`bind`]: a `0700` directory beside `path` (a stale one removed
/// first), a socket bound in it, made `0600`. Returns the listener and where the
/// socket is.
fn stage(path: &Path) -> Result<(UnixListener, PathBuf), LocalError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let dir = path.with_file_name(STAGING);
    let error = |source| LocalError::Bind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&dir).map_err(error)?,
        Ok(_) => std::fs::remove_file(&dir).map_err(error)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    // `create`, not `create_all`: it fails rather than reuse a directory someone made
    // since. The umask can only take bits away from 0700.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(error)?;
    let staged = dir.join(STAGED);
    let made = (|| {
        let m = std::fs::symlink_metadata(&dir)?;
        if !m.is_dir() || m.mode() & 0o077 != 0 {
            return Err(std::io::Error::other(
                "the staging directory is not this user's alone",
            ));
        }
        let listener = UnixListener::bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        Ok(listener)
    })();
    match made {
        Ok(listener) => Ok((listener, staged)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(error(e))
        }
    }
}

/// The second half of [`bind`]: renames the staged socket over `path` and removes its
/// directory.
fn publish(staged: &Path, path: &Path) -> Result<(), LocalError> {
    let error = |source| LocalError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let dir = staged.parent().unwrap_or(staged);
    if let Err(e) = std::fs::rename(staged, path) {
        let _ = std::fs::remove_dir_all(dir);
        return Err(error(e));
    }
    std::fs::remove_dir(dir).map_err(error)
}

/// Answers on `listener` until `stop`, then removes the socket file.
pub fn serve(
    listener: UnixListener,
    path: PathBuf,
    executor: Arc<Executor>,
    info: HostInfo,
    published: Arc<OnceLock<watch::Receiver<u64>>>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let task = async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "local socket: accept failed");
                        continue;
                    }
                },
                _ = stop.cancelled() => break,
            };
            let (executor, info) = (Arc::clone(&executor), info.clone());
            let published = published.get().map_or(0, |p| *p.borrow());
            tokio::spawn(
                async move {
                    if let Err(e) = answer(stream, executor, info, published).await {
                        tracing::debug!(error = %e, "local socket: request dropped");
                    }
                }
                .in_current_span(),
            );
        }
        let _ = std::fs::remove_file(&path);
    };
    tokio::spawn(task.in_current_span())
}

async fn answer(
    stream: UnixStream,
    executor: Arc<Executor>,
    info: HostInfo,
    published: u64,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut read = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    tokio::time::timeout(REQUEST_TIMEOUT, read.read_until(b'\n', &mut line))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
    let reply = match serde_json::from_slice::<Request>(&line) {
        Err(e) => rpc::error(AgentCode::InvalidRequest, format!("bad request: {e}")),
        Ok(request) => match Verb::parse(&request.verb) {
            Some(Verb::Verify) => verify_answer(&executor).await,
            Some(Verb::Export) => export_answer(&executor, request.body),
            Some(Verb::Layout) => rpc::to_json(LayoutAnswer {
                layout: crate::log::current_layout().to_string(),
            }),
            Some(Verb::Ping | Verb::Status | Verb::Intent | Verb::Log) | None => {
                let body = request.body.to_string();
                rpc::answer(&request.verb, body.as_bytes(), &executor, &info, published)
            }
        },
    };
    let mut out = serde_json::to_vec(&reply).expect("answers serialise");
    out.push(b'\n');
    write.write_all(&out).await?;
    write.shutdown().await
}

/// `verify`: the whole chain, checked off the runtime's threads.
async fn verify_answer(executor: &Executor) -> Value {
    let log = Arc::clone(executor.log());
    let verified = tokio::task::spawn_blocking(move || {
        let anchor = log.anchor()?.map(|a| a.summary());
        log.verify().map(|n| (n, anchor))
    });
    match verified.await {
        Ok(Ok((verified, anchor))) => rpc::to_json(VerifyAnswer::Verified { verified, anchor }),
        Ok(Err(LogError::Corrupt(c))) => rpc::to_json(VerifyAnswer::Bad {
            bad: BadRecord {
                seq: c.seq,
                defect: c.defect.to_string(),
            },
        }),
        Ok(Err(e)) => rpc::error(AgentCode::LogUnreadable, e.to_string()),
        Err(e) => rpc::error(AgentCode::LogUnreadable, e.to_string()),
    }
}

fn export_answer(executor: &Executor, body: Value) -> Value {
    let body = if body.is_null() { json!({}) } else { body };
    let request: ExportRequest = match serde_json::from_value(body) {
        Ok(r) => r,
        Err(e) => {
            return rpc::error(
                AgentCode::InvalidRequest,
                format!("bad export request: {e}"),
            )
        }
    };
    let log = executor.log();
    let until = request.until.unwrap_or(u64::MAX);
    let limit = request.limit.unwrap_or(export::MAX_LINES);
    let answer = log.anchor().and_then(|anchor| {
        Ok(ExportAnswer {
            lines: log.export_lines(request.since, until, limit)?,
            anchor: anchor.map(|a| a.summary()),
        })
    });
    match answer {
        Ok(answer) => rpc::to_json(answer),
        Err(e) => rpc::error(AgentCode::LogUnreadable, e.to_string()),
    }
}

/// A request line: the verb stays text so that an unknown one is answered
/// `unknown_verb`, naming it, not refused as a bad request.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    verb: String,
    #[serde(default)]
    body: Value,
}

/// The running agent's socket in `data_dir`, when one answers there: `None` when
/// there is no socket or nobody listens on it (no agent runs; read the files).
pub fn running(data_dir: &Path) -> Option<PathBuf> {
    let path = data_dir.join(SOCKET);
    std::os::unix::net::UnixStream::connect(&path)
        .ok()
        .map(|_| path)
}

/// [`ask`], the answer read as the `T` the verb gives: an error answer is
/// [`LocalError::Refused`], one that is not a `T` [`LocalError::Answer`].
pub fn ask_as<T: serde::de::DeserializeOwned>(
    path: &Path,
    verb: Verb,
    body: &impl serde::Serialize,
) -> Result<T, LocalError> {
    match read_answer(&ask(path, verb, body)?) {
        Ok(answer) => Ok(answer),
        Err(AnswerError::Refused(error)) => Err(LocalError::Refused(error)),
        Err(AnswerError::Malformed(source)) => Err(LocalError::Answer {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Asks the agent listening on `path`: `verb` with `body` (`()` for none); its
/// answer, an error answer too.
pub fn ask(path: &Path, verb: Verb, body: &impl serde::Serialize) -> Result<Value, LocalError> {
    let io = |source| LocalError::Ask {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(io)?;
    let request = json!({"verb": verb, "body": body});
    let mut request = serde_json::to_vec(&request).expect("requests serialise");
    request.push(b'\n');
    stream.write_all(&request).map_err(io)?;
    let mut line = Vec::new();
    BufReader::new(stream)
        .read_until(b'\n', &mut line)
        .map_err(io)?;
    serde_json::from_slice(&line).map_err(|source| LocalError::Answer {
        path: path.to_path_buf(),
        source,
    })
}

/// Every record after `request.since` that `request`'s filters keep, page by page
/// (its `limit` is the page size's: [`MAX_LOG_RECORDS`]).
pub fn log_records(path: &Path, request: &LogRequest) -> Result<Vec<Value>, LocalError> {
    let mut records = Vec::new();
    let mut request = LogRequest {
        limit: Some(MAX_LOG_RECORDS),
        ..request.clone()
    };
    loop {
        let page: LogAnswer = ask_as(path, Verb::Log, &request)?;
        let full = page.records.len() == MAX_LOG_RECORDS;
        if let Some(last) = page.last_record_seq() {
            request.since = last;
        }
        records.extend(page.records);
        if !full {
            return Ok(records);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Rig;
    use capstan_driver::sim::SimConfig;

    /// Given a running agent's socket (`web` running r1), when a client sends
    /// `line`, then its one-line answer (asked on a blocking thread, as the CLI does).
    async fn raw(path: &Path, line: &'static [u8]) -> Value {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
            stream.write_all(line).unwrap();
            let mut answer = Vec::new();
            BufReader::new(stream)
                .read_until(b'\n', &mut answer)
                .unwrap();
            serde_json::from_slice(&answer).unwrap()
        })
        .await
        .unwrap()
    }

    /// The data dir's entries as they appear, from inotify: (name, created by
    /// `bind`/`mkdir` rather than moved in, a directory).
    fn appeared(inotify: &nix::sys::inotify::Inotify) -> Vec<(String, bool, bool)> {
        use nix::sys::inotify::AddWatchFlags as F;
        inotify
            .read_events()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.mask.intersects(F::IN_CREATE | F::IN_MOVED_TO))
            .map(|e| {
                let name = e.name.map(|n| n.to_string_lossy().into_owned());
                (
                    name.unwrap_or_default(),
                    e.mask.contains(F::IN_CREATE),
                    e.mask.contains(F::IN_ISDIR),
                )
            })
            .collect()
    }

    /// Given a data dir with a socket a dead agent left and the staging directory a
    /// crash in `bind` left, when the socket is bound, then it never appears in the data
    /// dir but renamed in, finished (no file of its name is ever created there, where
    /// its mode would be the umask's); it is made inside a fresh `0700` directory, is
    /// `0600`, answers, and the stale files are gone.
    #[tokio::test]
    async fn the_socket_is_made_in_a_private_directory_and_renamed_into_place() {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SOCKET);
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let stale = dir.path().join(STAGING);
        std::fs::create_dir(&stale).unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(stale.join("left"), "").unwrap();

        let inotify = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        inotify
            .add_watch(dir.path(), F::IN_CREATE | F::IN_MOVED_TO)
            .unwrap();
        let (listener, staged) = stage(&path).unwrap();
        let meta = std::fs::metadata(staged.parent().unwrap()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700, "the staging directory");
        let socket = std::fs::symlink_metadata(&staged).unwrap();
        assert_eq!(
            socket.mode() & 0o777,
            0o600,
            "the socket before it is in place"
        );
        assert!(!staged.parent().unwrap().join("left").exists());
        publish(&staged, &path).unwrap();
        let placed = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(placed.ino(), socket.ino(), "renamed, not made again");
        assert_eq!(placed.mode() & 0o777, 0o600);
        assert!(!dir.path().join(STAGING).exists());
        let client = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        accepted.unwrap();
        connected.unwrap();
        drop(listener);

        // And `bind` as a whole: the socket arrives by a rename only.
        let _ = appeared(&inotify);
        let _listener = bind(&path).unwrap();
        let events = appeared(&inotify);
        assert!(
            !events
                .iter()
                .any(|(name, created, _)| name == SOCKET && *created),
            "{SOCKET} was created in the data dir, reachable before its chmod: {events:?}"
        );
        assert!(
            events.contains(&(SOCKET.to_string(), false, false)),
            "{SOCKET} renamed into place: {events:?}"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn bad_requests_are_answered_with_an_error_and_the_socket_keeps_serving() {
        let rig = Rig::new(SimConfig::default());
        rig.running_r1().await;
        let path = rig.dir.path().join(SOCKET);
        let info = crate::transport::HostInfo {
            host: crate::testkit::HOST.into(),
            version: "test".into(),
            drivers: vec!["sim".into()],
            capabilities: json!({}),
            outbox_alarm: Default::default(),
        };
        let stop = CancellationToken::new();
        let task = serve(
            bind(&path).unwrap(),
            path.clone(),
            Arc::clone(&rig.executor),
            info,
            Arc::default(),
            stop.clone(),
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let answer = raw(&path, b"not json\n").await;
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        let answer = raw(&path, b"{\"verb\":\"intent\",\"extra\":1}\n").await;
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        let answer = raw(&path, b"{\"verb\":\"reboot\"}\n").await;
        assert_eq!(answer["error"]["code"], "unknown_verb", "{answer}");
        let answer = raw(&path, b"{\"verb\":\"log\",\"body\":{\"since\":\"x\"}}\n").await;
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        let answer = raw(
            &path,
            b"{\"verb\":\"log\",\"body\":{\"since_time\":\"yesterday\"}}\n",
        )
        .await;
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        // A filter this agent does not know is refused, not ignored: an answer that
        // silently left it out would look like the filtered one.
        let answer = raw(
            &path,
            b"{\"verb\":\"log\",\"body\":{\"since_host_boot\":true}}\n",
        )
        .await;
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");

        let path2 = path.clone();
        let (layout, intent, verified, one, (before, after)) =
            tokio::task::spawn_blocking(move || {
                let a1 = LogRequest {
                    command: Some("a1".into()),
                    ..LogRequest::default()
                };
                let y2k = "2000-01-01T00:00:00Z".parse().ok();
                let before = LogRequest {
                    until_time: y2k,
                    ..a1.clone()
                };
                let after = LogRequest {
                    since_time: y2k,
                    ..a1.clone()
                };
                (
                    ask(&path2, Verb::Layout, &()).unwrap(),
                    ask(&path2, Verb::Intent, &()).unwrap(),
                    ask(&path2, Verb::Verify, &()).unwrap(),
                    log_records(&path2, &a1).unwrap(),
                    (
                        log_records(&path2, &before).unwrap(),
                        log_records(&path2, &after).unwrap(),
                    ),
                )
            })
            .await
            .unwrap();
        assert_eq!(layout, json!({"layout": "2"}));
        assert!(before.is_empty(), "nothing was appended before 2000");
        assert_eq!(after, one, "everything was appended after 2000");
        assert_eq!(
            intent,
            serde_json::to_value(rig.executor.log().intent().answer()).unwrap()
        );
        assert_eq!(verified["verified"], rig.executor.log().last_seq());
        assert_eq!(verified["anchor"], Value::Null);
        let path3 = path.clone();
        let (lines, bad) = tokio::task::spawn_blocking(move || {
            (
                ask(&path3, Verb::Export, &json!({"since": 1, "until": 2})).unwrap(),
                ask(&path3, Verb::Export, &json!({"since": "x"})).unwrap(),
            )
        })
        .await
        .unwrap();
        let lines = lines["lines"].as_array().unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["seq"], 2);
        assert!(lines[0]["hash"].is_string() && lines[0]["stored"].is_string());
        assert_eq!(bad["error"]["code"], "invalid_request", "{bad}");
        let kinds: Vec<_> = one.iter().map(|r| r["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["command_received", "workload_started", "command_completed"]
        );

        stop.cancel();
        task.await.unwrap();
        assert!(!path.exists(), "the socket is removed when serving stops");
        assert!(running(rig.dir.path()).is_none());
    }
}
