//! One host of a [`Fleet`]: its disk, its boots, its link and what tests ask it.

use super::{net, rootfs, ssh, Fleet};
use crate::pid1::Boot;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

/// The setup run by `sh` as PID 1 of the new namespaces, before it becomes systemd.
/// `$1` rootfs, `$2` upper dir, `$3` work dir, `$4` the overlay's mount point, `$5`
/// hostname, `$6` this boot's id file, `$7` `eth0`'s address, `$8` the machine end's
/// address, `$9` the fleet's hub address; the rest are the host's cgroup dirs. It waits for a line on stdin: the machine side's word that
/// `eth0` is in its net namespace.
const SETUP: &str = r#"set -e
rootfs=$1 upper=$2 work=$3 root=$4 name=$5 boot_id=$6 addr=$7 gateway=$8 hub=$9
shift 9
for cg in "$@"; do echo 0 > "$cg/cgroup.procs"; done
mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
mount --bind "$boot_id" "$root/proc/sys/kernel/random/boot_id"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for d in null zero full random urandom tty; do
  touch "$root/dev/$d"
  mount --bind "/dev/$d" "$root/dev/$d"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
hostname "$name"
ip link set lo up
read -r _
ip addr add "$addr" dev eth0
ip link set eth0 up
ip route add "$hub/32" via "$gateway" dev eth0
exec chroot "$root" /usr/bin/env container=other \
  /lib/systemd/systemd --system systemd.log_target=journal </dev/null
"#;

/// One booted host of a [`Fleet`] (see the module doc). Dropping it kills it without
/// asserting; [`FleetHost::kill`] asserts how it ended.
pub struct FleetHost<'f> {
    /// The running boot (dropped first: PID 1 dies, and its cgroups go, before the
    /// slot is released).
    boot: Option<Boot>,
    fleet: &'f Fleet,
    name: String,
    /// `upper/`, `work/` (the overlay's), `root/` (its mount point), logs.
    dir: PathBuf,
    slot: net::Slot,
    cgroups: Vec<PathBuf>,
    /// Its PID 1 (this boot's or the last one's), as the machine sees it.
    pid: u32,
    boots: u32,
}

impl<'f> FleetHost<'f> {
    /// Prepares the disk of a new host in `dir` (holding empty `upper/`, `work/` and
    /// `root/`) and boots it.
    pub(super) fn boot(
        fleet: &'f Fleet,
        name: &str,
        dir: PathBuf,
        slot: net::Slot,
        cgroups: Vec<PathBuf>,
    ) -> FleetHost<'f> {
        let mut host = FleetHost {
            boot: None,
            fleet,
            name: name.to_string(),
            dir,
            slot,
            cgroups,
            pid: 0,
            boots: 0,
        };
        host.prepare_disk();
        host.start();
        host
    }
}

impl FleetHost<'_> {
    /// Writes into its upper dir, before its first boot: its hostname, a machine id,
    /// an ed25519 host key of its own (the only one its `known_hosts` trusts), and the
    /// fleet's public key in root's `authorized_keys`.
    fn prepare_disk(&self) {
        let upper = self.dir.join("upper");
        for (sub, mode) in [("etc", 0o755), ("etc/ssh", 0o755), ("root", 0o700)] {
            mkdir(&upper.join(sub), mode);
        }
        mkdir(&upper.join("root/.ssh"), 0o700);
        write(
            &upper.join("etc/hostname"),
            &format!("{}\n", self.name),
            0o644,
        );
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").expect("a uuid");
        let id: String = uuid.trim().chars().filter(|c| *c != '-').collect();
        write(&upper.join("etc/machine-id"), &format!("{id}\n"), 0o444);
        let host_key = upper.join("etc/ssh/ssh_host_ed25519_key");
        ssh::keygen(&host_key, &format!("root@{}", self.name));
        let known = format!("{} {}", self.addr(), ssh::public(&host_key));
        std::fs::write(self.dir.join("known_hosts"), known).expect("write known_hosts");
        let authorized = ssh::public(&self.fleet.key());
        write(&upper.join("root/.ssh/authorized_keys"), &authorized, 0o600);
    }

    fn start(&mut self) {
        self.boots += 1;
        let name = format!("fleet host {} (boot {})", self.name, self.boots);
        let started = Instant::now();
        // The previous boot's link goes with its net namespace, a moment after it.
        crate::wait_until(
            format_args!("{} (the slot's previous link) to go", self.slot.link()),
            crate::READY,
            || !self.slot.linked(),
        );
        let boot_id = self.dir.join(format!("boot_id-{}", self.boots));
        std::fs::copy("/proc/sys/kernel/random/uuid", &boot_id).expect("a new boot id");
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--", "unshare"])
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--net",
                "--uts",
            ])
            .args(["sh", "-c", SETUP, "sh"])
            .arg(rootfs())
            .arg(self.dir.join("upper"))
            .arg(self.dir.join("work"))
            .arg(self.dir.join("root"))
            .arg(&self.name)
            .arg(&boot_id)
            .arg(format!("{}/30", self.addr()))
            .arg(self.machine_addr().to_string())
            .arg(self.fleet.hub_addr().to_string())
            .args(&self.cgroups)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::null());
        let log = self.dir.join(format!("unshare-{}.log", self.boots));
        let mut boot = Boot::start(name.clone(), c, &log, &self.cgroups);
        let pid = boot.pid();
        self.pid = pid;
        self.slot.connect(pid);
        // Its setup waits for this line before it configures eth0 and starts systemd.
        let go = boot.stdin().write_all(b"go\n");
        self.boot = Some(boot);
        if let Err(e) = go {
            self.check_alive("before its go");
            panic!("{name} took no go: {e}");
        }
        let state = self.wait_running(&name);
        crate::wait_until(
            format_args!("{name}: sshd to answer on {}:22", self.addr()),
            crate::READY,
            || {
                self.check_alive("while sshd starts");
                ssh::answers(self.addr())
            },
        );
        eprintln!(
            "{name}: pid {pid}, {state}, sshd answering on {} after {} ms",
            self.addr(),
            started.elapsed().as_millis()
        );
    }

    /// Waits until its bus socket exists and the boot is over; returns the state.
    fn wait_running(&self, name: &str) -> String {
        let socket = PathBuf::from(format!(
            "/proc/{}/root/run/dbus/system_bus_socket",
            self.pid
        ));
        crate::pid1::wait_booted(
            name,
            &socket,
            Booting { host: self, name },
            || self.check_alive("while booting"),
            |args| self.systemctl(args),
        )
    }

    #[track_caller]
    fn check_alive(&self, when: &str) {
        let boot = self.boot.as_ref().expect("it runs");
        boot.check_alive(when, || self.log());
    }

    /// Its hostname.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address, which the machine reaches over its link.
    pub fn addr(&self) -> Ipv4Addr {
        self.slot.host_addr()
    }

    /// The machine end's address on its link (where the host reaches the machine).
    pub fn machine_addr(&self) -> Ipv4Addr {
        self.slot.machine_addr()
    }

    /// Its PID 1, as the machine sees it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `path` inside the running host, as a machine path (`/proc/<pid>/root/...`,
    /// through its overlay): for writing and reading its files from the test.
    pub fn path(&self, path: &str) -> PathBuf {
        self.check_alive("before a file access");
        Path::new(&format!("/proc/{}/root", self.pid)).join(path.trim_start_matches('/'))
    }

    /// Runs `command` in all of the host's namespaces and its root (`nsenter -a -r
    /// -w`), for test assertions. Whatever it exits with is the caller's to judge.
    #[track_caller]
    pub fn nsenter(&self, command: &[&str]) -> Output {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.pid.to_string(), "-a", "-r", "-w", "--"])
            .args(command)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        crate::process::output(
            format_args!("nsenter {command:?} in {}", self.name()),
            crate::READY,
            c,
        )
    }

    /// `command` inside the host that must succeed; returns its stdout.
    #[track_caller]
    pub fn nsenter_ok(&self, command: &[&str]) -> String {
        ok(
            &format!("{}: {}", self.name, command.join(" ")),
            self.nsenter(command),
        )
    }

    /// `systemctl ARGS` inside the host. Whatever it exits with is the caller's.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        let mut command = vec!["systemctl", "--no-pager"];
        command.extend_from_slice(args);
        self.nsenter(&command)
    }

    /// The value of one property of `unit` (`systemctl show -p NAME --value`).
    #[track_caller]
    pub fn property(&self, unit: &str, name: &str) -> String {
        let mut out = self.nsenter_ok(&["systemctl", "show", "-p", name, "--value", unit]);
        out.truncate(out.trim_end().len());
        out
    }

    /// `ssh root@<addr> COMMAND` from the machine with the fleet's key, checking the
    /// host's own host key. Whatever it exits with is the caller's to judge.
    pub fn ssh(&self, command: &[&str]) -> Output {
        ssh::ssh(
            self.addr(),
            &self.fleet.key(),
            &self.dir.join("known_hosts"),
            command,
        )
    }

    /// Whether its sshd answers on its address now (a connect and a banner, each
    /// within [`ssh::CONNECT`]).
    pub fn answers(&self) -> bool {
        ssh::answers(self.addr())
    }

    /// Cuts its link (the machine end goes down): nothing gets through either way.
    pub fn partition(&self) {
        self.slot.set_up(false);
    }

    /// Mends its link after [`FleetHost::partition`].
    pub fn heal(&self) {
        self.slot.set_up(true);
    }

    /// `journalctl --directory <its journal> ARGS` from the machine (its upper dir's
    /// `/var/log/journal`): every boot's, also once it is down. Returns stdout.
    pub fn journal(&self, args: &[&str]) -> String {
        crate::pid1::journal(&self.dir.join("upper/var/log/journal"), args)
    }

    /// Its last boot's journal, as failure messages show it.
    pub fn log(&self) -> String {
        self.journal(&["--boot=-0", "--output", "short-monotonic"])
    }

    /// A reboot: [`FleetHost::kill`]'s stop, then a boot on the same disk (upper dir)
    /// and address. Its `/run` and processes are new; its files are kept. Returns the
    /// journal of the boot that ended.
    #[track_caller]
    pub fn reboot(&mut self) -> String {
        self.stop();
        // Its last boot in its journal (journalctl's own "current boot" is the machine's).
        let ended = self.journal(&["--boot=-0", "--output", "short-monotonic"]);
        self.start();
        ended
    }

    /// SIGKILL to its PID 1 (the namespace dies with it); asserts `unshare` ended as
    /// [`EXIT`] and that its cgroups and link are gone. Returns its whole journal,
    /// every boot's (the host is gone for good).
    #[track_caller]
    pub fn kill(mut self) -> String {
        self.stop();
        self.journal(&["--output", "short-monotonic"])
    }

    #[track_caller]
    fn stop(&mut self) {
        let boot = self.boot.take().expect("it runs");
        boot.kill(|| self.log());
        crate::wait_until(
            format_args!("{} to go with its namespace", self.slot.link()),
            crate::READY,
            || !self.slot.linked(),
        );
    }
}

/// Shows the host's jobs and log if the wait for its boot gives up.
struct Booting<'a, 'f> {
    host: &'a FleetHost<'f>,
    name: &'a str,
}

impl std::fmt::Display for Booting<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobs = self.host.systemctl(&["list-jobs", "--plain"]);
        write!(
            f,
            "{} to boot; its jobs:\n{}\nits log:\n{}",
            self.name,
            String::from_utf8_lossy(&jobs.stdout),
            self.host.log()
        )
    }
}

fn mkdir(path: &Path, mode: u32) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `out`'s stdout, asserting it succeeded (`what` names it otherwise).
#[track_caller]
fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
