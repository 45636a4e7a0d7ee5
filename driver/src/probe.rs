//! Readiness probes over the network, for drivers whose workloads the agent can reach:
//! a TCP connect, and an HTTP `GET` read as far as its status line. A probe never
//! fails as an error: whatever goes wrong is why the workload is not ready yet.

use capstan_common::Check;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One probe's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Ready,
    /// Not ready, and why (for the command's message and the log).
    NotReady(String),
}

impl Probe {
    pub fn is_ready(&self) -> bool {
        matches!(self, Probe::Ready)
    }
}

/// The longest status line read, in bytes.
const MAX_STATUS_LINE: usize = 1024;

/// Probes `check` against `ip` within `timeout`; `None` for a check that is not a
/// network one (`exec`).
pub async fn network(ip: IpAddr, check: &Check, timeout: Duration) -> Option<Probe> {
    let (port, path) = match check {
        Check::Tcp { port } => (*port, None),
        Check::Http { port, path } => (*port, Some(path.as_str())),
        Check::Exec { .. } => return None,
    };
    let addr = SocketAddr::new(ip, port);
    let probe = async {
        match path {
            None => tcp(addr).await,
            Some(path) => http(addr, path).await,
        }
    };
    Some(match tokio::time::timeout(timeout, probe).await {
        Ok(probe) => probe,
        Err(_) => Probe::NotReady(format!(
            "no answer from {addr} in {} ms",
            timeout.as_millis()
        )),
    })
}

async fn tcp(addr: SocketAddr) -> Probe {
    match TcpStream::connect(addr).await {
        Ok(_) => Probe::Ready,
        Err(e) => Probe::NotReady(format!("connect to {addr}: {e}")),
    }
}

/// `GET path` on `addr`: ready on a 2xx or 3xx status. `path` is written into the
/// request line as it is: it must be one `capstan_common::readiness::is_request_path`
/// accepts.
async fn http(addr: SocketAddr, path: &str) -> Probe {
    debug_assert!(capstan_common::readiness::is_request_path(path));
    let mut stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return Probe::NotReady(format!("connect to {addr}: {e}")),
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: capstan-agent\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Probe::NotReady(format!("GET {path} on {addr}: {e}"));
    }
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    while !line.contains(&b'\n') && line.len() < MAX_STATUS_LINE {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) => return Probe::NotReady(format!("GET {path} on {addr}: {e}")),
        }
    }
    match status(&line) {
        Some(code) if (200..400).contains(&code) => Probe::Ready,
        Some(code) => Probe::NotReady(format!("GET {path} on {addr}: status {code}")),
        None => Probe::NotReady(format!("GET {path} on {addr}: no HTTP status line")),
    }
}

/// The status code of an HTTP/1.x status line (`HTTP/1.1 200 OK`).
fn status(bytes: &[u8]) -> Option<u16> {
    let end = bytes.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut parts = line.trim_end_matches('\r').splitn(3, ' ');
    let version = parts.next()?;
    let code = parts.next()?;
    (version.starts_with("HTTP/1.") && code.len() == 3)
        .then(|| code.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests;
