//! Dev-only support shared by capstan's tests (a dev-dependency, never in a binary):
//! the nats-server they start. The agent's unit tests, the coordinator's API tests
//! and the end-to-end harness (`capstan-tests`, which runs nats-server as a
//! `Process` with its log, stops, restarts and clusters) all run the binary
//! [`nats_server_binary`] names.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nats-server binary tests run: `$CAPSTAN_NATS_SERVER` (`scripts/test.sh` sets it
/// to the 2.15.2 build of `.ci/nats.sh`, and to Debian's 2.9.10 for its smoke run),
/// else `nats-server` from `PATH` (`.ci/services.sh` installs Debian's).
pub fn nats_server_binary() -> String {
    std::env::var("CAPSTAN_NATS_SERVER").unwrap_or_else(|_| "nats-server".into())
}

/// How much a test's nats-server may store: far more than any test writes, and set,
/// so that the server does not size its store from the disk. Left to itself it takes
/// 75 % of the free disk, and the coordinator's streams reserve about 6 GiB when they
/// are made: on a machine with under ~10 GB free every test's coordinator failed its
/// setup (`insufficient storage resources`), whatever the test wrote.
pub const TEST_STORE_LIMIT: &str = "1T";

/// Writes `dir/nats-server.test.conf`: `base`'s text (a config of `capstan-coordinator
/// nats-config`, …) or nothing, with the server's `max_file_store` set to
/// [`TEST_STORE_LIMIT`] (in place of the base's), and returns its path. A test's server loads it with `-c`.
pub fn store_limited_config(dir: &Path, base: Option<&Path>) -> PathBuf {
    let text = base.map_or_else(String::new, |b| {
        std::fs::read_to_string(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()))
    });
    // The base's own limit (nats-config writes the sum of its quotas) gives way.
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("  max_file_store:"))
        .map(|l| format!("{l}\n"))
        .collect();
    const OPEN: &str = "jetstream {\n";
    let limit = format!("max_file_store: {TEST_STORE_LIMIT}");
    // The server's own block starts a line (an account's is `jetstream { max_file: …`).
    let server_block = if text.starts_with(OPEN) {
        Some(0)
    } else {
        text.find("\njetstream {\n").map(|i| i + 1)
    };
    let text = match server_block {
        Some(at) => {
            let open = at + OPEN.len();
            format!("{}  {limit}\n{}", &text[..open], &text[open..])
        }
        None => format!("{text}\n{OPEN}  {limit}\n}}\n"),
    };
    let path = dir.join("nats-server.test.conf");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// The ports [`free_port`] hands out: below Linux's ephemeral range (32768–60999), so
/// that no outgoing connection — a client's, a watch's — takes one between the test
/// choosing it and its server binding it (a port from `bind(0)` is an ephemeral one,
/// and a kube-apiserver lost its port that way on a loaded machine).
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A free loopback TCP port (bound, then released) that no outgoing connection can be
/// given. Each process walks the range from its own start, never handing out a port
/// twice, so concurrent test binaries are unlikely to pick the same one.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = PORTS.end - PORTS.start;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let port = PORTS.start + NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let port = u16::try_from(port).expect("PORTS is within u16");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORTS:?}");
}

/// A private nats-server with JetStream on a loopback port it picked itself (`-p -1`),
/// its store in its own temporary dir; killed (and reaped) on drop. The real server,
/// never a stand-in.
///
/// It is ready when *its own* log says so: the port comes from its "Listening for
/// client connections on" line, not from a probe of a port chosen beforehand. A probe
/// would also be answered by another process's server holding that port (a
/// concurrent test, `scripts/fleet-demo.sh`), and the test's agents and streams would
/// then silently join that other fleet — an agent named `h1` answering the other
/// fleet's requests for `h1` with its own (empty) intent.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    _store: tempfile::TempDir,
}

/// The client port nats-server says it listens on (`-p -1` lets it pick one), from
/// its log: the "Listening for client connections on <addr>:<port>" line.
pub fn listening_port(log: &str) -> Option<u16> {
    log.lines().find_map(|line| {
        let (_, at) = line.split_once("Listening for client connections on ")?;
        at.trim().rsplit(':').next()?.parse().ok()
    })
}

impl NatsServer {
    /// Starts one, with more nats-server arguments (`--user U --pass P`, …), and
    /// waits (at most 10 s) until its log says it is ready; panics with its log if it
    /// exits first.
    pub fn start(args: &[&str]) -> NatsServer {
        Self::spawn("-1", args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts one on `port` (`-1`: one it picks), or says why it did not start.
    fn spawn(port: &str, args: &[&str]) -> Result<NatsServer, String> {
        let store = tempfile::tempdir().expect("nats-server store dir");
        let config = store_limited_config(store.path(), None);
        let binary = nats_server_binary();
        let mut child = Command::new(&binary)
            .arg("-c")
            .arg(config)
            .args(["-js", "-a", "127.0.0.1", "-p", port, "-sd"])
            .arg(store.path().join("js"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let (lines, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        // Reads its log to the end, so that the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut port, mut log) = (None, String::new());
        let failed = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    port = port.or_else(|| listening_port(&line));
                    let ready = line.contains("Server is ready");
                    log.push_str(&line);
                    log.push('\n');
                    if ready {
                        break None;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    break Some("was not ready within 10 s")
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Some("exited before it was ready")
                }
            }
        };
        let port = match (failed, port) {
            (None, Some(port)) => port,
            (failed, _) => {
                let _ = child.kill();
                let status = child.wait();
                let why = failed.unwrap_or("said it was ready without a client port");
                return Err(format!("{binary} {why} ({status:?}); its log:\n{log}"));
            }
        };
        Ok(NatsServer {
            child,
            port,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        })
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The way tests once joined another fleet: a server that cannot have its port
    /// is an error, never a handle on whoever holds that port.
    #[test]
    fn a_port_held_by_another_server_is_an_error_not_that_server() {
        let holder = NatsServer::start(&[]);
        let Err(error) = NatsServer::spawn(&holder.port.to_string(), &[]) else {
            panic!(
                "a second server on port {} was taken as started",
                holder.port
            );
        };
        assert!(error.contains("exited before it was ready"), "{error}");
    }

    /// The limit goes into the server's own block, never an account's, or a block of
    /// its own when there is none.
    #[test]
    fn the_store_limit_goes_into_the_servers_jetstream_block() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.conf");
        std::fs::write(
            &base,
            "jetstream {\n  max_memory_store: 256M\n}\n\naccounts {\n  A {\n    jetstream { max_file: 2G, max_mem: 0 }\n  }\n}\n",
        )
        .unwrap();
        let text = std::fs::read_to_string(store_limited_config(dir.path(), Some(&base))).unwrap();
        assert!(
            text.starts_with("jetstream {\n  max_file_store: 1T\n  max_memory_store: 256M\n}"),
            "{text}"
        );
        assert!(
            text.contains("    jetstream { max_file: 2G, max_mem: 0 }\n"),
            "{text}"
        );
        let plain = std::fs::read_to_string(store_limited_config(dir.path(), None)).unwrap();
        assert_eq!(plain, "\njetstream {\n  max_file_store: 1T\n}\n");
    }

    /// Each handle reaches its own server: the one it started, by name.
    #[test]
    fn two_servers_started_together_are_each_reached_at_their_own_port() {
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| NatsServer::start(&["--name", "capstan-test-a"]));
            let b = s.spawn(|| NatsServer::start(&["--name", "capstan-test-b"]));
            (a.join().unwrap(), b.join().unwrap())
        });
        for (server, name) in [(&a, "capstan-test-a"), (&b, "capstan-test-b")] {
            let stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            let mut info = String::new();
            BufReader::new(stream).read_line(&mut info).unwrap();
            assert!(info.starts_with("INFO "), "{info}");
            assert!(
                info.contains(&format!("\"server_name\":\"{name}\"")),
                "{info}"
            );
        }
    }
}
