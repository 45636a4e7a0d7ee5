//! What the harness's booted hosts share ([`crate::systemd::SystemdHost`],
//! [`crate::fleet::FleetHost`]): one [`Boot`] of a systemd as PID 1 of new namespaces
//! made by `setpriv --pdeathsig KILL -- unshare --pid --fork --kill-child ...`, the
//! host's own cgroups, the wait for the boot to end, its journal read from the
//! machine, and the sweep of what hosts of dead test binaries left behind.
//!
//! Stopping a boot: SIGKILL to its PID 1 kills the whole PID namespace (the kernel
//! kills every other process in it, and reaps them, before `unshare` sees its child
//! die), and its mounts (and net namespace) go with it. `unshare` (util-linux 2.38,
//! Debian bookworm) then tries to die of the same signal, fails to reset SIGKILL's
//! handler, prints `unshare: sigprocmask unblock failed: Invalid argument` and
//! **exits 1**: [`EXIT`], which [`Boot::kill`] asserts. `--kill-child` makes
//! `unshare`'s own death kill PID 1, so dropping a host in any state leaves nothing
//! running, and `setpriv --pdeathsig KILL` makes the test binary's death kill
//! `unshare`, so not even a watchdog abort leaves a host behind (its dir and cgroups
//! stay, until the next host's [`new_dir`] sweeps them away).

use crate::process::{send_signal, Exit, Process};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Output, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

/// How `unshare` ends once its child, systemd, was SIGKILLed (see the module doc).
pub const EXIT: Exit = Exit::Code(1);

/// One boot: `unshare` and its child, the host's PID 1. Dropping it kills PID 1,
/// reaps `unshare` and removes the host's cgroups (bounded, never asserting).
pub(crate) struct Boot {
    name: String,
    process: Option<Process>,
    pid: u32,
    cgroups: Vec<PathBuf>,
}

impl Boot {
    /// Creates `cgroups`, spawns `command` (`setpriv --pdeathsig KILL -- unshare
    /// --fork --kill-child ...`, whose child joins the cgroups) with its stderr in
    /// `log`, and waits for `unshare` to fork PID 1.
    pub fn start(name: String, command: Command, log: &Path, cgroups: &[PathBuf]) -> Boot {
        for cg in cgroups {
            std::fs::create_dir_all(cg)
                .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", cg.display()));
        }
        let process = spawn_for_life(name.clone(), command, log);
        let unshare = process.id();
        // PID 1 is unshare's only child: the setup `sh`, which execs systemd.
        let children = format!("/proc/{unshare}/task/{unshare}/children");
        let pid = crate::wait_until(format_args!("{name} to fork"), crate::READY, || {
            if let Some(exit) = process.exited() {
                panic!(
                    "{name} ended ({exit}) at once; its stderr:\n{}",
                    process.stderr()
                );
            }
            std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        });
        Boot {
            name,
            process: Some(process),
            pid,
            cgroups: cgroups.to_vec(),
        }
    }

    /// PID 1 of the host, as the machine sees it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `unshare`'s stdin (piped by the caller's command): the host's setup reads it.
    pub fn stdin(&mut self) -> ChildStdin {
        self.process.as_mut().expect("it runs").stdin()
    }

    /// Panics, showing `unshare`'s stderr and `log()` (the host's journal), if the
    /// boot has ended.
    #[track_caller]
    pub fn check_alive(&self, when: &str, log: impl FnOnce() -> String) {
        let process = self.process.as_ref().expect("it runs");
        if let Some(exit) = process.exited() {
            panic!(
                "{} (pid {}) ended ({exit}) {when}; unshare's stderr:\n{}\nits journal:\n{}",
                self.name,
                self.pid,
                process.stderr(),
                log()
            );
        }
    }

    /// SIGKILL to PID 1; asserts `unshare` ended as [`EXIT`] and waits until the
    /// host's cgroups are gone (removed).
    #[track_caller]
    pub fn kill(mut self, log: impl FnOnce() -> String) {
        self.check_alive("before SIGKILL", log);
        let process = self.process.take().expect("it runs");
        send_signal(self.pid, libc::SIGKILL);
        process.wait_expecting(EXIT);
        crate::wait_until(
            format_args!("the cgroups of {} to go", self.name),
            crate::READY,
            || remove_cgroups(&self.cgroups).is_ok(),
        );
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            if process.exited().is_none() {
                let _ = Command::new("kill")
                    .args(["-9", &self.pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            // unshare exits once it has reaped PID 1; killing it first would leave
            // PID 1 a zombie for the machine's init to reap.
            for _ in 0..100 {
                if process.exited().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Reaps unshare (SIGKILLing it first if it still runs: --kill-child then
            // kills PID 1).
            drop(process);
        }
        for _ in 0..40 {
            if remove_cgroups(&self.cgroups).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Waits until the host's bus `socket` exists and `systemctl is-system-running`
/// says `running` or `degraded` (then printing its failed units on stderr); returns
/// the state. `alive` panics if the boot ended; `waiting` says what failed if the
/// wait gives up.
pub(crate) fn wait_booted(
    name: &str,
    socket: &Path,
    waiting: impl Display,
    alive: impl Fn(),
    systemctl: impl Fn(&[&str]) -> Output,
) -> String {
    let state = crate::wait_until(waiting, crate::READY, || -> Option<String> {
        alive();
        if !socket.exists() {
            return None;
        }
        let out = systemctl(&["is-system-running"]);
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        matches!(state.as_str(), "running" | "degraded").then_some(state)
    });
    if state == "degraded" {
        let failed = systemctl(&["--failed", "--plain", "--no-legend"]);
        eprintln!(
            "{name} booted degraded; failed units:\n{}",
            String::from_utf8_lossy(&failed.stdout)
        );
    }
    state
}

/// `journalctl --directory <dir> ARGS` from the machine; returns stdout (empty if
/// there is no journal yet).
pub(crate) fn journal(dir: &Path, args: &[&str]) -> String {
    let mut c = Command::new("journalctl");
    c.arg("--directory")
        .arg(dir)
        .args(["--no-pager", "--quiet"])
        .args(args);
    let out = crate::process::output(format_args!("journalctl {args:?}"), crate::READY, c);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new dir `<root>/<prefix>XXXXXX` owned by this test binary (its pid in `owner`),
/// after sweeping away the dirs under `root` whose owner is gone (an aborted binary
/// runs no drop; its hosts died with it) once the cgroups `cgroups_of(dir)` names
/// are removed. A dir whose `owner` is not written yet, or names a live process, is
/// left alone.
pub(crate) fn new_dir(
    root: &str,
    prefix: &str,
    cgroups_of: impl Fn(&Path) -> Vec<PathBuf>,
) -> tempfile::TempDir {
    std::fs::create_dir_all(root).unwrap_or_else(|e| panic!("cannot create {root}: {e}"));
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let owner = std::fs::read_to_string(entry.path().join("owner"));
        let Some(pid) = owner.ok().and_then(|o| o.trim().parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if remove_cgroups(&cgroups_of(&entry.path())).is_ok() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(root)
        .unwrap_or_else(|e| panic!("cannot create a dir in {root}: {e}"));
    std::fs::write(dir.path().join("owner"), std::process::id().to_string())
        .expect("write the dir's owner");
    dir
}

/// [`Process::spawn`] on a thread that lives as long as the test binary. The parent
/// death signal (`setpriv --pdeathsig`) fires when the *thread* that forked the child
/// ends, so a host booted on a test's own thread (or a scoped thread, or a blocking
/// task) would die with that thread, not with the test binary.
fn spawn_for_life(name: String, command: Command, stderr: &Path) -> Process {
    type Spawned = Result<Process, String>;
    type Request = (String, Command, PathBuf, mpsc::Sender<Spawned>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("capstan-tests host spawner".into())
            .spawn(move || {
                for (name, command, stderr, reply) in rx {
                    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        Process::spawn(name, command, &stderr)
                    }))
                    .map_err(|panic| {
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .unwrap_or_else(|| "Process::spawn panicked".into())
                    });
                    let _ = reply.send(spawned);
                }
            })
            .expect("start the spawner thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((name, command, stderr.to_path_buf(), reply))
        .expect("the spawner thread answers");
    answer
        .recv_timeout(crate::READY)
        .unwrap_or_else(|e| {
            panic!(
                "the spawner thread did not answer ({e}) within {:?}",
                crate::READY
            )
        })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The host's cgroup dir `capstan-tests/<name>` in each cgroup hierarchy mounted
/// here, but cpuset (which needs cpus and mems set before a task may join, and which
/// systemd does not use on cgroup v1). systemd takes the cgroup it starts in as its
/// root, so hosts in cgroups of their own never share `system.slice/<unit>` cgroups:
/// otherwise stopping a unit in one host kills the same-named unit's processes in
/// every other host.
pub(crate) fn cgroups(name: &std::ffi::OsStr) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mut dirs = Vec::new();
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let fstype = fields.get(dash + 1).copied().unwrap_or_default();
        let superopts = fields.get(dash + 3).copied().unwrap_or_default();
        let is_cpuset = superopts.split(',').any(|o| o == "cpuset");
        if (fstype == "cgroup" && !is_cpuset) || fstype == "cgroup2" {
            dirs.push(Path::new(fields[4]).join("capstan-tests").join(name));
        }
    }
    assert!(!dirs.is_empty(), "no cgroup hierarchy is mounted here");
    dirs
}

/// Removes each of `dirs` with every cgroup under it (deepest first). A cgroup still
/// holding a process is an error (EBUSY); a missing one is done.
fn remove_cgroups(dirs: &[PathBuf]) -> std::io::Result<()> {
    fn remove(dir: &Path) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                remove(&entry.path())?;
            }
        }
        match std::fs::remove_dir(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
    dirs.iter().try_for_each(|d| remove(d))
}
