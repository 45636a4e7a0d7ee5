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
//! - its own `/var/lib/private` (where systemd keeps the state directories of units
//!   with `DynamicUser=`, as every revision's unit has): a host dir, so they go with
//!   the host and never land in the machine's; a namespace's state directory
//!   `<state_dir>/<ns>` is then a symlink into it that only resolves inside
//!   ([`SystemdHost::inside`]);
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
//! Stopping it: SIGKILL to its PID 1 kills the whole namespace; `unshare` then exits
//! 1 ([`EXIT`]), which [`SystemdHost::kill`] asserts; the `setpriv --pdeathsig` +
//! `unshare --kill-child` chain kills it with the test binary, and the next boot
//! sweeps away the dirs and cgroups of hosts whose binary is gone ([`crate::pid1`]).

pub use crate::pid1::EXIT;
use crate::pid1::{cgroups, Boot};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

/// Where hosts' dirs live: visible inside the namespaces (not under `/tmp`).
const ROOT: &str = "/var/lib/capstan-tests/systemd";

/// The setup run by `sh` inside the new namespaces before it becomes systemd. `$1` is
/// the unit dir, `$2` the file to be its console, `$3` its journal dir, `$4` the file
/// holding this boot's id, `$5` its `/var/lib/private`; the other arguments are the
/// host's cgroup dirs, which it joins (`echo 0`: the writer itself) before anything
/// else.
const SETUP: &str = r#"set -e
units=$1; console=$2; journal=$3; boot_id=$4; private=$5; shift 5
for cg in "$@"; do echo 0 > "$cg/cgroup.procs"; done
mount --make-rprivate /
mount --bind "$boot_id" /proc/sys/kernel/random/boot_id
mount --bind "$units" /etc/systemd/system
mount --bind "$console" /dev/console
mkdir -p /var/log/journal
mount --bind "$journal" /var/log/journal
mkdir -p /var/lib/private
mount --bind "$private" /var/lib/private
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
    /// The running boot (dropped first: systemd dies before its dir goes).
    boot: Option<Boot>,
    dir: tempfile::TempDir,
    /// This host's cgroup in each hierarchy it joins.
    cgroups: Vec<PathBuf>,
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
        let dir = crate::pid1::new_dir(ROOT, "host-", |dir| {
            cgroups(dir.file_name().expect("a dir name"))
        });
        // Readable by all, and the state dir writable by all (like /tmp), so that
        // workloads running as another user (`User=`, `DynamicUser=`) can use them.
        for (sub, mode) in [
            (".", 0o755),
            ("units", 0o755),
            ("state", 0o1777),
            ("bin", 0o755),
            ("journal", 0o2755),
            // As systemd makes it: only root may pass (the state dirs below belong to
            // dynamic users whose ids are reused later).
            ("private", 0o700),
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
            boot: None,
            pid: 0,
            boots: 0,
        };
        host.start();
        host
    }

    fn start(&mut self) {
        self.boots += 1;
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
            .arg(self.dir.path().join("private"))
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
        let boot = Boot::start(name.clone(), c, &log, &self.cgroups);
        let pid = boot.pid();
        self.pid = pid;
        self.boot = Some(boot);
        let state = self.wait_running();
        eprintln!(
            "{name}: pid {pid}, {state} after {} ms",
            started.elapsed().as_millis()
        );
    }

    /// Waits until the bus socket exists and the boot is over; returns the state.
    fn wait_running(&self) -> String {
        let boot = self.boot.as_ref().expect("it runs");
        crate::pid1::wait_booted(
            &format!("systemd {}", self.pid),
            &self.bus_socket(),
            Booting(self),
            || boot.check_alive("while booting", || self.log()),
            |args| self.systemctl(args),
        )
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

    /// `path` as the host sees it, reached from the machine (through its PID 1's
    /// root, `/proc/<pid>/root`): what a namespace's state directory, a symlink into
    /// the host's own `/var/lib/private`, holds is only there.
    pub fn inside(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(relative)
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
        crate::pid1::journal(&self.dir.path().join("journal"), args)
    }

    /// This boot's journal (systemd's own messages and the units' output), from the
    /// machine: what failure messages show.
    pub fn log(&self) -> String {
        self.journal(&["--boot", "--output", "short-monotonic"])
    }

    /// Runs `command` inside the host's mount and PID namespaces (`nsenter -m -p`),
    /// e.g. `journalctl`; for test assertions only. Whatever it exits with is the
    /// caller's to judge.
    #[track_caller]
    pub fn nsenter(&self, command: &[&str]) -> Output {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.pid.to_string(), "-m", "-p", "--"])
            .args(command);
        crate::process::output(format_args!("nsenter {command:?}"), crate::READY, c)
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
        let boot = self.boot.take().expect("it runs");
        boot.kill(|| self.log());
        self.log()
    }
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
