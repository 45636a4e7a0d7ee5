//! A private nats-server for the agent's unit tests: a free loopback port, JetStream
//! in its own temporary store, killed (and reaped) on drop. The real server, never a
//! stand-in: `$CAPSTAN_NATS_SERVER` (`scripts/test.sh` sets it to the build of
//! `.ci/nats.sh`), else `nats-server` from `PATH` (`.ci/services.sh` installs it).

use std::time::Duration;

pub struct Server {
    child: std::process::Child,
    pub url: String,
    _store: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server and waits until it accepts connections.
pub async fn server() -> Server {
    server_with(&[]).await
}

/// [`server`], with more nats-server arguments (`--user U --pass P`, …).
pub async fn server_with(args: &[&str]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = tempfile::tempdir().unwrap();
    let binary = std::env::var("CAPSTAN_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let child = std::process::Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store.path())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let server = Server {
        child,
        url: format!("nats://127.0.0.1:{port}"),
        _store: store,
    };
    // Ready when it accepts connections: poll the port, bounded.
    for attempt in 0.. {
        assert!(attempt < 500, "nats-server did not come up");
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}
