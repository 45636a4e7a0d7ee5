//! The NATS side: a private nats-server per test (or a [`NatsCluster`] of three),
//! signing keys, coordinators as real processes and the `capstan` CLI. Agents that take commands from NATS are ordinary
//! [`crate::agent::Agent`]s built with `.nats(url).signing(key)`.
//!
//! [`NatsServer`] is in `server.rs`, [`NatsCluster`] in `cluster.rs`, [`Accounts`] and
//! [`Keys`] in `credentials.rs`, [`Coordinator`] and the `capstan` CLI in
//! `coordinator.rs`.

use serde_json::Value;

mod cluster;
mod coordinator;
mod credentials;
mod server;

pub use cluster::NatsCluster;
pub use coordinator::{alive_count, capstan_cli, capstan_cli_within, Coordinator};
pub use credentials::{Accounts, Keys};
pub use server::NatsServer;

/// A plain HTTP/1.0 GET on loopback `port` (nats-server's monitoring endpoint, a
/// coordinator without tokens): the status and the JSON body (`Null` if it is not
/// JSON). `None` if it does not answer within 2 s.
pub fn http_get(port: u16, path: &str) -> Option<(u16, Value)> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// A current-thread tokio runtime for a test's direct NATS or HTTP calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
