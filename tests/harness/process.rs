//! Every long-running child a test starts (agent daemons, nats-server, coordinators):
//! its stderr in a file to wait on, and stops that assert how it exited.

use serde_json::Value;
use std::cell::RefCell;
use std::fmt;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl Exit {
    /// Exit code 0.
    pub const OK: Exit = Exit::Code(0);
    /// Killed by SIGKILL.
    pub const KILLED: Exit = Exit::Signal(libc::SIGKILL);

    pub fn of(status: ExitStatus) -> Exit {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            (None, None) => unreachable!("a unix exit status has a code or a signal"),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// A running child with its stderr going to a file. SIGKILLed (and reaped, without
/// asserting anything) on drop if it still runs; [`Process::stop`] and
/// [`Process::kill`] are the stops that check how it ended.
pub struct Process {
    name: String,
    child: RefCell<Child>,
    stderr: PathBuf,
}

impl Process {
    /// Spawns `command` with its stderr in a new file `stderr` (stdin and stdout as
    /// the caller set them). `name` says which process it is in failure messages.
    pub fn spawn(name: impl Into<String>, mut command: Command, stderr: &Path) -> Process {
        let name = name.into();
        let file = std::fs::File::create(stderr).expect("stderr file");
        let child = command
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process {
            name,
            child: RefCell::new(child),
            stderr: stderr.to_path_buf(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.borrow().id()
    }

    /// Its stdin, when the command had `Stdio::piped()` for it.
    pub fn stdin(&mut self) -> ChildStdin {
        self.child.get_mut().stdin.take().expect("piped stdin")
    }

    /// Its stdout, when the command had `Stdio::piped()` for it.
    pub fn stdout(&mut self) -> ChildStdout {
        self.child.get_mut().stdout.take().expect("piped stdout")
    }

    /// Its stdout (piped) as [`Lines`]: each read bounded, never a block until the
    /// process writes or exits.
    pub fn stdout_lines(&mut self) -> Lines {
        let name = format!("{}'s stdout", self.name);
        Lines::new(name, self.stdout())
    }

    /// Everything it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its stderr lines so far, JSON diagnostics parsed (anything else as a string).
    pub fn lines(&self) -> Vec<Value> {
        self.stderr()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| Value::String(l.to_string())))
            .collect()
    }

    /// Waits until it has written a line matching `found`; returns that line. Panics
    /// (showing its stderr) if it exits first or `READY` passes.
    #[track_caller]
    pub fn wait_for_line(&self, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        let waiting = Waiting {
            what,
            process: self,
        };
        let hit = crate::wait_until(&waiting, crate::READY, || {
            if let Some(hit) = self.lines().into_iter().find(&found) {
                return Some(Ok(hit));
            }
            self.exited().map(Err)
        });
        match hit {
            Ok(line) => line,
            // It ended: read its stderr once more (the line may have come last).
            Err(exit) => match self.lines().into_iter().find(found) {
                Some(line) => line,
                None => panic!(
                    "{} ended ({exit}) before {what}; its stderr:\n{}",
                    self.name,
                    self.stderr()
                ),
            },
        }
    }

    /// Waits until its stderr contains `needle`; returns the stderr then.
    #[track_caller]
    pub fn wait_for_text(&self, needle: &str) -> String {
        self.wait_for_line(&format!("{needle:?}"), |l| match l {
            Value::String(s) => s.contains(needle),
            json => json.to_string().contains(needle),
        });
        self.stderr()
    }

    /// How it ended, if it has (reaping it).
    pub fn exited(&self) -> Option<Exit> {
        self.child
            .borrow_mut()
            .try_wait()
            .expect("try_wait")
            .map(Exit::of)
    }

    /// Graceful stop: SIGTERM, wait, and assert it exited 0. Returns its stderr.
    #[track_caller]
    pub fn stop(self) -> String {
        self.stop_expecting(Exit::OK)
    }

    /// SIGTERM, wait, and assert it ended as `want`. Returns its stderr.
    #[track_caller]
    pub fn stop_expecting(self, want: Exit) -> String {
        self.signal_expecting(libc::SIGTERM, want)
    }

    /// Sends `signal`, waits, and asserts it ended as `want`. Returns its stderr.
    #[track_caller]
    pub fn signal_expecting(self, signal: i32, want: Exit) -> String {
        if let Some(early) = self.exited() {
            panic!(
                "{} had already ended ({early}) before signal {signal}; its stderr:\n{}",
                self.name,
                self.stderr()
            );
        }
        send_signal(self.id(), signal);
        self.wait_expecting(want)
    }

    /// A crash: SIGKILL, wait, and assert SIGKILL ended it. Returns its stderr.
    #[track_caller]
    pub fn kill(self) -> String {
        if let Some(early) = self.exited() {
            panic!(
                "{} had already ended ({early}) before SIGKILL; its stderr:\n{}",
                self.name,
                self.stderr()
            );
        }
        self.child.borrow_mut().kill().expect("SIGKILL");
        self.wait_expecting(Exit::KILLED)
    }

    /// Waits (at most `READY`, then fails) for it to end on its own and asserts it
    /// ended as `want`.
    #[track_caller]
    pub fn wait_expecting(self, want: Exit) -> String {
        let exit = crate::wait_until(
            WaitingForExit {
                process: &self,
                want,
            },
            crate::READY,
            || self.exited(),
        );
        let stderr = self.stderr();
        assert_eq!(
            exit, want,
            "{} ended with {exit}, not {want}; its stderr:\n{stderr}",
            self.name
        );
        stderr
    }
}

/// What [`Process::wait_expecting`] gave up on, described when it gives up: the
/// process's state then (`/proc/<pid>/status`: running, sleeping, stopped, in the
/// disk, and what it waits in) and what it said.
struct WaitingForExit<'a> {
    process: &'a Process,
    want: Exit,
}

impl fmt::Display for WaitingForExit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pid = self.process.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let state = status
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or("State: unknown");
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        write!(
            f,
            "{} to exit (expecting {}); pid {pid} {state}, waiting in {wchan:?}; its stderr:\n{}",
            self.process.name,
            self.want,
            self.process.stderr()
        )
    }
}

impl Drop for Process {
    /// Cleanup only (a test that failed, or did not stop it): never asserts, since a
    /// panic during unwinding aborts the test binary.
    fn drop(&mut self) {
        let child = self.child.get_mut();
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A child's stdout read line by line on a thread of its own, so that each read waits
/// at most [`crate::READY`] (then fails naming what it waited for) rather than until
/// the child writes or ends.
pub struct Lines {
    name: String,
    lines: mpsc::Receiver<std::io::Result<String>>,
}

impl Lines {
    pub fn new(name: impl Into<String>, stdout: ChildStdout) -> Lines {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            name: name.into(),
            lines,
        }
    }

    /// The next line (without its newline), or `None` at the end of the stream;
    /// panics naming `what` after [`crate::READY`].
    #[track_caller]
    pub fn next_line(&self, what: &str) -> Option<String> {
        crate::watchdog::watch();
        match self.lines.recv_timeout(crate::READY) {
            Ok(line) => Some(line.unwrap_or_else(|e| panic!("cannot read {}: {e}", self.name))),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "gave up after {:?} waiting for {what} on {}",
                crate::READY,
                self.name
            ),
        }
    }

    /// Every line left, up to the end of the stream (the process has ended, or is
    /// ending); panics naming `what` if the end has not come within
    /// [`crate::READY`].
    #[track_caller]
    pub fn rest(&self, what: &str) -> Vec<String> {
        let deadline = Instant::now() + crate::READY;
        let mut all = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    all.push(line.unwrap_or_else(|e| panic!("cannot read {}: {e}", self.name)))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return all,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "gave up after {:?} waiting for the end of {} ({what}); read so far: {all:?}",
                    crate::READY,
                    self.name
                ),
            }
        }
    }
}

/// Runs `command` to its end as [`Command::output`] does (stdin null, stdout and
/// stderr captured), but for at most `timeout`: a child that has not ended by then
/// (or whose pipes a process it started still holds) is SIGKILLed and the test fails
/// naming `what`. For every CLI run a test waits on (`apply`, `log`, `capstan …`).
#[track_caller]
pub fn output(what: impl fmt::Display, timeout: Duration, command: Command) -> Output {
    crate::watchdog::watch();
    output_within(timeout, command).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// [`output`] without panicking (for cleanup that may run while a test unwinds): a
/// child not ended within `timeout` is SIGKILLed and the answer is a
/// [`std::io::ErrorKind::TimedOut`] error.
pub fn output_within(timeout: Duration, mut command: Command) -> std::io::Result<Output> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (tx, done) = mpsc::channel();
    // `wait_with_output` reads both pipes to their end and then reaps the child: until
    // then its pid stays its own (a zombie at worst), so the kill below hits nothing
    // else.
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match done.recv_timeout(timeout) {
        Ok(out) => out,
        Err(_) => {
            // It may have ended meanwhile: then there is nothing to kill.
            let _ = Command::new("kill")
                .arg(format!("-{}", libc::SIGKILL))
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("gave up after {timeout:?} waiting for it to end (SIGKILLed it)"),
            ))
        }
    }
}

/// A wait's description that shows the process's stderr when it is formatted (only
/// if the wait gives up).
struct Waiting<'a> {
    what: &'a str,
    process: &'a Process,
}

impl fmt::Display for Waiting<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} to say {}; its stderr:\n{}",
            self.process.name,
            self.what,
            self.process.stderr()
        )
    }
}

/// Sends `signal` to `pid` with the `kill` command (the workspace forbids unsafe
/// code, so no `libc::kill`); panics if it was not delivered.
pub fn send_signal(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// This process's children that have not been reaped (every thread's:
/// `/proc/self/task/*/children`), by pid: each is still ours, so killing it hits no
/// other process.
pub fn children() -> Vec<u32> {
    children_in("/proc/self")
}

/// Process `pid`'s unreaped children (every thread's).
pub fn children_of(pid: u32) -> Vec<u32> {
    children_in(&format!("/proc/{pid}"))
}

fn children_in(proc_dir: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("{proc_dir}/task")) else {
        return pids;
    };
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs every child of this process ([`children`]) — the servers, agents,
/// coordinators and fleets it started, a booted host's `unshare` (whose PID 1 dies
/// with it) — for a program about to end without its destructors (`capstan-bench` on
/// SIGINT or SIGTERM, the watchdog's abort). How many it killed.
pub fn kill_children() -> usize {
    let pids = children();
    if !pids.is_empty() {
        // The `kill` command, as `send_signal`: the workspace forbids unsafe code.
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    pids.len()
}
