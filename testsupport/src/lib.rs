//! Dev-only support shared by capstan's tests (a dev-dependency, never in a binary):
//! the nats-server they start. The agent's unit tests, the coordinator's API tests
//! and the end-to-end harness (`capstan-tests`, which runs nats-server as a
//! `Process` with its log, stops, restarts and clusters) all run the binary
//! [`nats_server_binary`] names.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nats-server binary tests run: `$CAPSTAN_NATS_SERVER` (`scripts/test.sh` sets it
/// to the 2.15.2 build of `.ci/nats.sh`, and to Debian's 2.9.10 for its smoke run),
/// else `nats-server` from `PATH` (`.ci/services.sh` installs Debian's).
pub fn nats_server_binary() -> String {
    std::env::var("CAPSTAN_NATS_SERVER").unwrap_or_else(|_| "nats-server".into())
}

/// A free loopback TCP port (bound to port 0, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A private nats-server with JetStream on a free loopback port, its store in its own
/// temporary dir; killed (and reaped) on drop. The real server, never a stand-in.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    _store: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one, with more nats-server arguments (`--user U --pass P`, …), and
    /// waits until it accepts connections (polled every 20 ms, at most 10 s).
    pub fn start(args: &[&str]) -> NatsServer {
        let port = free_port();
        let store = tempfile::tempdir().expect("nats-server store dir");
        let binary = nats_server_binary();
        let child = Command::new(&binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let server = NatsServer {
            child,
            port,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{binary} did not take connections on port {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
