//! A counting proxy in front of a container engine's unix socket: every HTTP request
//! line that passes through it is recorded (`POST /v1.43/containers/create?name=…`),
//! so a measurement can say how many engine round trips an operation costs, ours
//! and the docker CLI's alike. Only for counting: the timed rounds talk to the
//! engine directly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

/// A running proxy; dropping it stops accepting (connections in use end with their
/// clients).
pub struct EngineProxy {
    path: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl EngineProxy {
    /// Listens on `path`, forwarding to the engine socket `upstream`.
    pub fn start(path: &Path, upstream: &Path) -> std::io::Result<EngineProxy> {
        let listener = UnixListener::bind(path)?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (seen, upstream) = (Arc::clone(&requests), upstream.to_path_buf());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (seen, upstream) = (Arc::clone(&seen), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(engine) = UnixStream::connect(&upstream).await {
                        let _ = relay(client, engine, seen).await;
                    }
                });
            }
        });
        Ok(EngineProxy {
            path: path.to_path_buf(),
            requests,
            accept,
        })
    }

    /// Its socket as an engine address, `unix:///…`.
    pub fn url(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// The request lines seen since the last call (method and path, no HTTP version).
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().expect("requests"))
    }
}

impl Drop for EngineProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways; the client's bytes are scanned for request lines.
async fn relay(
    client: UnixStream,
    engine: UnixStream,
    seen: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_engine, mut to_engine) = engine.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_engine, &mut to_client).await;
    });
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        let lines = request_lines(&mut pending);
        seen.lock().expect("requests").extend(lines);
        to_engine.write_all(&buf[..n]).await?;
    }
    to_engine.shutdown().await?;
    let _ = answers.await;
    Ok(())
}

const VERSION: &[u8] = b" HTTP/1.1\r\n";

/// Takes the complete request lines out of `pending` (what follows the last one is
/// kept: it may be the start of the next). Bodies are JSON, which never holds a raw
/// CRLF, so what ends in ` HTTP/1.1` CRLF is a request line.
fn request_lines(pending: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    let mut consumed = 0;
    while let Some(at) = pending[consumed..]
        .windows(VERSION.len())
        .position(|w| w == VERSION)
    {
        let end = consumed + at;
        // The request starts at its method: a body without a final CRLF (JSON)
        // may come right before it.
        let line = String::from_utf8_lossy(&pending[consumed..end]);
        let start = ["GET /", "HEAD /", "POST /", "PUT /", "DELETE /"]
            .iter()
            .filter_map(|m| line.rfind(m))
            .max()
            .unwrap_or(0);
        let (method, path) = line[start..].split_once(' ').unwrap_or_default();
        // The path without the API version and the query.
        let path = path.split('?').next().unwrap_or_default();
        let path = match path.strip_prefix("/v") {
            Some(rest) => rest.find('/').map_or(path, |i| &rest[i..]),
            None => path,
        };
        out.push(format!("{method} {path}"));
        consumed = end + VERSION.len();
    }
    pending.drain(..consumed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_found_across_reads_and_bodies() {
        let mut pending =
            b"POST /v1.43/containers/create?name=x HTTP/1.1\r\nHost: d\r\n\r\n{\"a\":1}GET /_p"
                .to_vec();
        assert_eq!(request_lines(&mut pending), ["POST /containers/create"]);
        pending.extend_from_slice(b"ing HTTP/1.1\r\n\r\n");
        assert_eq!(request_lines(&mut pending), ["GET /_ping"]);
        assert!(pending.ends_with(b"\r\n"));
    }
}
