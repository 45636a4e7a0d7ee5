//! A `run` daemon's `/metrics` endpoint: where it serves, and a scrape.

use crate::process::Process;

/// Where a `run` daemon serves `/metrics` (its log line `serving metrics`).
#[track_caller]
pub fn metrics_address(daemon: &Process) -> std::net::SocketAddr {
    let line = daemon.wait_for_line("the metrics endpoint", |l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("serving metrics"))
    });
    line["fields"]["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line}"))
}

/// `GET /metrics` at `addr`: the status, the `Content-Type` and the body.
pub fn scrape(addr: std::net::SocketAddr) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let timeout = std::time::Duration::from_secs(10);
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, timeout).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(timeout))
        .expect("write timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send GET");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read /metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}
