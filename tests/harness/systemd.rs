//! A real systemd per test ([`SystemdHost`]), and the workload the systemd tests run
//! in it ([`envdump`], the `capstan-envdump` binary of this crate).
//!
//! Each host is `/usr/lib/systemd/systemd --system` as PID 1 of a new PID + mount
//! namespace (DESIGN.md, "Real parts in tests"), started by `unshare` after a setup
//! that gives it, inside its mount namespace:
//!
//! - its own, initially empty `/etc/systemd/system`: a bind mount of
//!   [`SystemdHost::unit_dir`], a host dir, so the driver under test writes units
//!   there from the host side and the machine's own `/etc/systemd/system` (enabled
//!   sshd, dockerd, …) is neither started nor ever written;
//! - fresh tmpfs on `/run` (its D-Bus socket, its runtime state), `/tmp` and `/var/tmp`
//!   (its boot-time `systemd-tmpfiles --remove` would otherwise empty the machine's
//!   `/tmp` and delete other hosts' `/var/tmp/systemd-private-*`);
//! - its own persistent journal, a host dir bound on `/var/log/journal` (several
//!   journalds must not write the machine's one journal), kept across
//!   [`SystemdHost::reboot`] and readable after the host is gone
//!   ([`SystemdHost::journal`]); journald does not copy the machine's kernel log;
//! - its own cgroup (`<hierarchy>/capstan-tests/<host>` in each cgroup hierarchy but
//!   cpuset): systemd takes the cgroup it starts in as its root, so hosts never share
//!   `system.slice/<unit>` cgroups — without this, stopping a unit in one host kills
//!   the same-named unit's processes in every other host;
//! - a boot id of its own per boot (bound on `/proc/sys/kernel/random/boot_id`), so
//!   that a [`SystemdHost::reboot`] is a new boot to systemd and its journal;
//! - no gettys (`systemd.getty_auto=0`); systemd logs to its journal
//!   (`systemd.log_target=journal`; [`SystemdHost::log`], shown by failure messages),
//!   and an empty file is its `/dev/console` (PID 1 opens `/dev/console` for its
//!   status lines, which must not reach the machine's console; this file, not being a
//!   tty, takes nothing).
//!
//! Everything else is the machine's filesystem, so host paths are valid inside —
//! except under `/tmp`, `/var/tmp`, `/run` and `/etc/systemd/system`. That is why a
//! host's dir lives under `/var/lib/capstan-tests/systemd/` and why
//! [`SystemdHost::envdump`] is a copy of the binary inside it (the build may live
//! under `/tmp`).
//!
//! The driver talks to it at [`SystemdHost::bus_address`] (D-Bus, like on a real host);
//! [`SystemdHost::systemctl`] (`nsenter` + `systemctl`) is for test assertions only.
//!
//! Stopping it: SIGKILL to its PID 1 kills the whole PID namespace (the kernel kills
//! every other process in it, and reaps them, before `unshare` sees its child die),
//! and its mounts go with it. `unshare` (util-linux 2.38, Debian bookworm) then tries to
//! die of the same signal, fails to reset SIGKILL's handler, prints `unshare:
//! sigprocmask unblock failed: Invalid argument` and **exits 1**: [`EXIT`], which
//! [`SystemdHost::kill`] asserts. `--kill-child` makes `unshare`'s own death kill
//! systemd, so dropping a host in any state leaves nothing running, and `setpriv
//! --pdeathsig KILL` makes the test binary's death kill `unshare`, so not even a
//! watchdog abort leaves a host behind (its dir and cgroups stay, until the next
//! boot sweeps them away).

use crate::process::{send_signal, Exit, Process};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How `unshare` ends once its child, systemd, was SIGKILLed (see the module doc).
pub const EXIT: Exit = Exit::Code(1);

/// Where hosts' dirs live: visible inside the namespaces (not under `/tmp`).
const ROOT: &str = "/var/lib/capstan-tests/systemd";

/// The setup run by `sh` inside the new namespaces before it becomes systemd. `$1` is
/// the unit dir, `$2` the file to be its console, `$3` its journal dir, `$4` the file
/// holding this boot's id; the other arguments are the host's cgroup dirs, which it
/// joins (`echo 0`: the writer itself) before anything else.
const SETUP: &str = r#"set -e
units=$1; console=$2; journal=$3; boot_id=$4; shift 4
for cg in "$@"; do echo 0 > "$cg/cgroup.procs"; done
mount --make-rprivate /
mount --bind "$boot_id" /proc/sys/kernel/random/boot_id
mount --bind "$units" /etc/systemd/system
mount --bind "$console" /dev/console
mkdir -p /var/log/journal
mount --bind "$journal" /var/log/journal
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mkdir -p /run/systemd/journald.conf.d
printf '[Journal]\nReadKMsg=no\n' > /run/systemd/journald.conf.d/capstan-tests.conf
exec /usr/lib/systemd/systemd --system systemd.getty_auto=0 systemd.log_target=journal
"#;

/// The built `capstan-envdump` (this crate's workload binary): `capstan-envdump
/// OUT_PATH [ARGS...]` writes `{"argv", "env", "pid"}` as JSON to `OUT_PATH`, then runs
/// until SIGTERM (exit 0), or exits at once with `ENVDUMP_EXIT=<code>`. Inside a
/// [`SystemdHost`], run [`SystemdHost::envdump`] instead.
pub fn envdump() -> PathBuf {
    crate::binary("capstan-envdump")
}

/// A real systemd as PID 1 of its own PID + mount namespace (see the module doc).
/// Dropping it kills it without asserting; [`SystemdHost::kill`] asserts how it ended.
pub struct SystemdHost {
    dir: tempfile::TempDir,
    /// This host's cgroup in each hierarchy it joins.
    cgroups: Vec<PathBuf>,
    /// `unshare`, whose child is systemd.
    process: Option<Process>,
    /// systemd's pid, as the machine sees it.
    pid: u32,
    boots: u32,
}

impl SystemdHost {
    /// Boots a new host with an empty unit dir and state dir, and waits until
    /// `systemctl is-system-running` says `running` (a `degraded` boot is accepted,
    /// and its failed units printed on stderr).
    pub fn boot() -> SystemdHost {
        SystemdHost::boot_with(&envdump())
    }

    /// [`SystemdHost::boot`] with `workload` as the host's [`SystemdHost::envdump`]:
    /// a binary that is `capstan-envdump` when run under that name
    /// ([`crate::envdump::main`]), e.g. `capstan-bench`, which a release build has
    /// where this crate's own binaries may not be built.
    pub fn boot_with(workload: &Path) -> SystemdHost {
        crate::watchdog::watch();
        std::fs::create_dir_all(ROOT).unwrap_or_else(|e| panic!("cannot create {ROOT}: {e}"));
        sweep();
        let dir = tempfile::Builder::new()
            .prefix("host-")
            .tempdir_in(ROOT)
            .expect("a host dir");
        std::fs::write(dir.path().join("owner"), std::process::id().to_string())
            .expect("write the host's owner");
        // Readable by all, and the state dir writable by all (like /tmp), so that
        // workloads running as another user (`User=`, `DynamicUser=`) can use them.
        for (sub, mode) in [
            (".", 0o755),
            ("units", 0o755),
            ("state", 0o1777),
            ("bin", 0o755),
            ("journal", 0o2755),
        ] {
            let path = dir.path().join(sub);
            if sub != "." {
                std::fs::create_dir(&path).expect("a host subdir");
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .expect("chmod a host subdir");
        }
        std::fs::copy(workload, dir.path().join("bin/capstan-envdump")).unwrap_or_else(|e| {
            panic!(
                "cannot copy {} into the host dir as capstan-envdump: {e}",
                workload.display()
            )
        });
        let mut host = SystemdHost {
            cgroups: cgroups(dir.path().file_name().expect("a dir name")),
            dir,
            process: None,
            pid: 0,
            boots: 0,
        };
        host.start();
        host
    }

    fn start(&mut self) {
        self.boots += 1;
        for cg in &self.cgroups {
            std::fs::create_dir_all(cg)
                .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", cg.display()));
        }
        let started = Instant::now();
        let console = self.dir.path().join("console");
        // A boot id of its own, as a real reboot gets (the kernel's is the machine's).
        let boot_id = self.dir.path().join(format!("boot_id-{}", self.boots));
        std::fs::copy("/proc/sys/kernel/random/uuid", &boot_id).expect("a new boot id");
        std::fs::File::create(&console).expect("a console file");
        // setpriv --pdeathsig: unshare dies with the test binary, even one that aborts
        // (the watchdog) and runs no drop; --kill-child takes systemd with it.
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--", "unshare"])
            .args(["--pid", "--fork", "--kill-child", "--mount", "--mount-proc"])
            .args(["sh", "-c", SETUP, "sh"])
            .arg(self.unit_dir())
            .arg(&console)
            .arg(self.dir.path().join("journal"))
            .arg(&boot_id)
            .args(&self.cgroups)
            // systemd passes nothing of its environment on to units; `container`
            // tells it that it runs in one (no hardware to set up).
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("container", "other")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = self.dir.path().join(format!("unshare-{}.log", self.boots));
        let name = format!(
            "systemd ({}, boot {})",
            self.dir.path().display(),
            self.boots
        );
        let process = spawn_for_life(name.clone(), c, &log);
        let unshare = process.id();
        // systemd is unshare's only child: the `sh` above, which execs it.
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
        self.pid = pid;
        self.process = Some(process);
        let state = self.wait_running();
        eprintln!(
            "{name}: pid {pid}, {state} after {} ms",
            started.elapsed().as_millis()
        );
    }

    /// Waits until the bus socket exists and the boot is over; returns the state.
    fn wait_running(&self) -> String {
        let process = self.process.as_ref().expect("it runs");
        let socket = self.bus_socket();
        let state = crate::wait_until(Booting(self), crate::READY, || -> Option<String> {
            if let Some(exit) = process.exited() {
                self.ended(process, exit, "while booting");
            }
            if !socket.exists() {
                return None;
            }
            let out = self.systemctl(&["is-system-running"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            matches!(state.as_str(), "running" | "degraded").then_some(state)
        });
        if state == "degraded" {
            let failed = self.systemctl(&["--failed", "--plain", "--no-legend"]);
            eprintln!(
                "systemd {} booted degraded; failed units:\n{}",
                self.pid,
                String::from_utf8_lossy(&failed.stdout)
            );
        }
        state
    }

    /// systemd's pid, as the machine sees it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn bus_socket(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/root/run/dbus/system_bus_socket",
            self.pid
        ))
    }

    /// Its system bus, as a D-Bus address the driver connects to from the machine.
    pub fn bus_address(&self) -> String {
        format!("unix:path={}", self.bus_socket().display())
    }

    /// The host dir that this systemd sees as `/etc/systemd/system` (empty at first).
    pub fn unit_dir(&self) -> PathBuf {
        self.dir.path().join("units")
    }

    /// A dir for the test's files, the same path inside and outside: workloads write
    /// there (e.g. `capstan-envdump`'s dumps) and the test reads.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The host's dir: the same path inside and outside (under `/var/lib`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Copies `binary` into the host's `bin/` and returns the copy's path, valid
    /// inside the host (the build may live under `/tmp`, which the host does not see).
    pub fn install(&self, binary: &Path) -> PathBuf {
        let name = binary.file_name().expect("a binary's file name");
        let to = self.dir.path().join("bin").join(name);
        std::fs::copy(binary, &to)
            .unwrap_or_else(|e| panic!("cannot copy {} into the host: {e}", binary.display()));
        to
    }

    /// `capstan-envdump` at a path valid inside this host (a copy in its dir).
    pub fn envdump(&self) -> PathBuf {
        self.dir.path().join("bin/capstan-envdump")
    }

    /// `journalctl --directory <its journal> ARGS` from the machine: its journal, of
    /// every boot, also once it is gone. Returns stdout (empty if there is none yet).
    pub fn journal(&self, args: &[&str]) -> String {
        let out = Command::new("journalctl")
            .arg("--directory")
            .arg(self.dir.path().join("journal"))
            .args(["--no-pager", "--quiet"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run journalctl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// This boot's journal (systemd's own messages and the units' output), from the
    /// machine: what failure messages show.
    pub fn log(&self) -> String {
        self.journal(&["--boot", "--output", "short-monotonic"])
    }

    /// Runs `command` inside the host's mount and PID namespaces (`nsenter -m -p`),
    /// e.g. `journalctl`; for test assertions only. Whatever it exits with is the
    /// caller's to judge.
    pub fn nsenter(&self, command: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-m", "-p", "--"])
            .args(command)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run nsenter {command:?}: {e}"))
    }

    /// `systemctl ARGS` inside the host, for test assertions only (the driver talks
    /// D-Bus). Whatever it exits with is the caller's to judge.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        let mut command = vec!["systemctl", "--no-pager"];
        command.extend_from_slice(args);
        self.nsenter(&command)
    }

    /// `systemctl ARGS` that must succeed; returns its stdout.
    #[track_caller]
    pub fn systemctl_ok(&self, args: &[&str]) -> String {
        let out = self.systemctl(args);
        assert!(
            out.status.success(),
            "systemctl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The value of one property of `unit` (`systemctl show -p NAME --value`).
    #[track_caller]
    pub fn property(&self, unit: &str, name: &str) -> String {
        self.systemctl_ok(&["show", "-p", name, "--value", unit])
            .trim_end_matches('\n')
            .to_string()
    }

    /// SIGKILL to its PID 1 (the whole namespace dies with it); asserts `unshare`
    /// ended as [`EXIT`] and the host's cgroups are gone. Returns systemd's log
    /// ([`SystemdHost::log`]).
    #[track_caller]
    pub fn kill(mut self) -> String {
        self.stop()
    }

    /// A reboot: [`SystemdHost::kill`], then a boot with the same unit and state dirs
    /// (its `/run` is new; its unit files and the state dir are kept).
    #[track_caller]
    pub fn reboot(&mut self) {
        self.stop();
        self.start();
    }

    #[track_caller]
    fn stop(&mut self) -> String {
        let process = self.process.take().expect("it runs");
        if let Some(early) = process.exited() {
            self.ended(&process, early, "before SIGKILL");
        }
        send_signal(self.pid, libc::SIGKILL);
        process.wait_expecting(EXIT);
        crate::wait_until(
            format_args!("the cgroups of systemd {} to go", self.pid),
            crate::READY,
            || remove_cgroups(&self.cgroups).is_ok(),
        );
        self.log()
    }

    #[track_caller]
    fn ended(&self, process: &Process, exit: Exit, when: &str) -> ! {
        panic!(
            "systemd {} ended ({exit}) {when}; unshare's stderr:\n{}\nsystemd's log:\n{}",
            self.pid,
            process.stderr(),
            self.log()
        )
    }
}

impl Drop for SystemdHost {
    /// Cleanup only, never asserting: kills systemd (its namespace with it), reaps
    /// `unshare`, and removes the cgroups (bounded: a few tries).
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            if process.exited().is_none() {
                let _ = Command::new("kill")
                    .args(["-9", &self.pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            // unshare exits once it has reaped systemd; killing it first would leave
            // systemd a zombie for the machine's init to reap.
            for _ in 0..100 {
                if process.exited().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Reaps unshare (SIGKILLing it first if it still runs: --kill-child then
            // kills systemd).
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
            .name("capstan-tests systemd spawner".into())
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
        .expect("the spawner thread runs");
    answer
        .recv()
        .expect("the spawner thread answers")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Shows the boot's state and log if the wait for it gives up.
struct Booting<'a>(&'a SystemdHost);

impl std::fmt::Display for Booting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = self.0;
        let jobs = host.systemctl(&["list-jobs", "--plain"]);
        write!(
            f,
            "systemd {} to boot (bus socket {}); its jobs:\n{}\nits log:\n{}",
            host.pid,
            if host.bus_socket().exists() {
                "present"
            } else {
                "absent"
            },
            String::from_utf8_lossy(&jobs.stdout),
            host.log()
        )
    }
}

/// Removes what hosts of test binaries that are gone left behind (a binary that
/// aborted runs no drop; its hosts died with it): their dirs and cgroups. A host whose
/// `owner` file is not written yet, or names a live process, is left alone.
fn sweep() {
    let Ok(entries) = std::fs::read_dir(ROOT) else {
        return;
    };
    for entry in entries.flatten() {
        let owner = std::fs::read_to_string(entry.path().join("owner"));
        let Some(pid) = owner.ok().and_then(|o| o.trim().parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if remove_cgroups(&cgroups(&entry.file_name())).is_ok() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The host's cgroup dir `capstan-tests/<name>` in each cgroup hierarchy mounted
/// here, but cpuset (which needs cpus and mems set before a task may join, and which
/// systemd does not use on cgroup v1).
fn cgroups(name: &std::ffi::OsStr) -> Vec<PathBuf> {
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
