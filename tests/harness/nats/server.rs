//! One private nats-server with JetStream: started, stopped, restarted on its port.

use crate::process::{Exit, Process};
use capstan_testsupport::{listening_port, nats_server_binary, store_limited_config};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private nats-server with JetStream, on a loopback port it picks itself (or on
/// another address of this machine: [`NatsServer::start_on`]), read from its own log
/// (as `capstan_testsupport::NatsServer` does, and for the same reason); a restart
/// takes the same port again.
pub struct NatsServer {
    pub port: u16,
    addr: String,
    store: tempfile::TempDir,
    config: Option<PathBuf>,
    process: Option<Process>,
    runs: u32,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_with(None)
    }

    /// With a server config file (its listen address and store are overridden).
    pub fn start_with(config: Option<&Path>) -> NatsServer {
        Self::start_at("127.0.0.1", config)
    }

    /// Listening on `addr`, an address of this machine (e.g. a fleet's hub,
    /// [`crate::fleet::Fleet::hub_addr`]).
    pub fn start_on(addr: &str) -> NatsServer {
        Self::start_at(addr, None)
    }

    /// [`NatsServer::start_on`] with a server config file, as
    /// [`NatsServer::start_with`].
    pub fn start_on_with(addr: &str, config: &Path) -> NatsServer {
        Self::start_at(addr, Some(config))
    }

    fn start_at(addr: &str, config: Option<&Path>) -> NatsServer {
        crate::watchdog::watch();
        let mut server = NatsServer {
            port: 0,
            addr: addr.to_string(),
            store: tempfile::tempdir().expect("store dir"),
            config: config.map(Path::to_path_buf),
            process: None,
            runs: 0,
        };
        server.boot();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.addr, self.port)
    }

    /// The pid of the running server (a benchmark reads its CPU).
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("the server runs").id()
    }

    fn boot(&mut self) {
        self.runs += 1;
        let mut c = Command::new(nats_server_binary());
        // Its store bounded by a set limit, not by the disk's free space.
        let conf = store_limited_config(self.store.path(), self.config.as_deref());
        c.arg("-c").arg(conf);
        // The first run picks its port (-1); a restart takes that one again.
        let port = match self.port {
            0 => "-1".to_string(),
            port => port.to_string(),
        };
        c.args(["-js", "-a", &self.addr, "-p", &port, "-sd"])
            .arg(self.store.path().join("js"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = self.store.path().join(format!("server-{}.log", self.runs));
        let process = Process::spawn(
            format!("nats-server (port {port}, run {})", self.runs),
            c,
            &log,
        );
        let said = process.wait_for_text("Server is ready");
        self.port = listening_port(&said).expect("nats-server says its client port");
        self.process = Some(process);
    }

    /// Stops the server (SIGINT), keeping its store, asserting exit 0. (On SIGTERM,
    /// nats-server 2.9 exits 1 and 2.15 exits 0; both exit 0 on SIGINT.)
    #[track_caller]
    pub fn stop(&mut self) {
        let process = self.process.take().expect("the server runs");
        process.signal_expecting(libc::SIGINT, Exit::OK);
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        assert!(self.process.is_none(), "stop() first");
        self.boot();
    }
}
