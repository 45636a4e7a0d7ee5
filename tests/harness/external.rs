//! The standalone sim driver (`capstan-sim-driver`) as an external driver: its socket
//! and its simulated host in a temp dir of its own, so that it outlives the agent
//! processes and its own restarts.

use crate::process::Process;
use capstan_driver::sim::SimHost;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One simulated host behind a socket; [`SimDriver::start`] runs its process.
pub struct SimDriver {
    dir: tempfile::TempDir,
    runs: Cell<u32>,
}

impl SimDriver {
    pub fn new() -> SimDriver {
        crate::watchdog::watch();
        SimDriver {
            dir: tempfile::tempdir().expect("temp dir"),
            runs: Cell::new(0),
        }
    }

    /// The socket it listens on (for [`crate::agent::AgentBuilder::external`]).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("driver.sock")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    /// Starts `capstan-sim-driver` with `args` (`--manages-lifecycle false`, `--hold
    /// activate`, …) and waits until it listens.
    #[track_caller]
    pub fn start(&self, args: &[&str]) -> Process {
        self.runs.set(self.runs.get() + 1);
        let mut c = Command::new(crate::binary("capstan-sim-driver"));
        c.arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let stderr = self.path(&format!("driver-{}.log", self.runs.get()));
        let driver = Process::spawn(
            format!("capstan-sim-driver (run {})", self.runs.get()),
            c,
            &stderr,
        );
        driver.wait_for_text("capstan-sim-driver listening");
        driver
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The simulated host as it is now (readable while the driver runs).
    pub fn host(&self) -> SimHost {
        SimHost::load(Path::new(&self.state_dir())).expect("read the sim host")
    }
}

impl Default for SimDriver {
    fn default() -> Self {
        SimDriver::new()
    }
}
