//! A fleet of real hosts on this machine ([`Fleet`], [`FleetHost`]): each one a
//! Debian system booted with systemd as PID 1 of its own PID + mount + net + UTS
//! namespace (DESIGN.md, "Real parts in tests"; docs/fleet-harness.md).
//!
//! - Its root is an overlay: the cached rootfs of `.ci/rootfs.sh` (debootstrap
//!   bookworm with systemd, dbus, openssh-server, iproute2; `$CAPSTAN_FLEET_ROOTFS`)
//!   is the shared, read-only lower dir; its upper and work dirs are its own, under
//!   the test's dir in `/var/lib/capstan-tests/fleet/`, kept across
//!   [`FleetHost::reboot`] (its disk), gone with the [`Fleet`].
//! - Before its first boot the harness writes into its upper dir: its hostname, a
//!   machine id, an ed25519 host key of its own, and the test's public key in root's
//!   `authorized_keys`.
//! - Inside the new namespaces a setup script mounts the overlay, `proc` (with a boot
//!   id of its own per boot bound on `kernel/random/boot_id`), `/sys`, a small `/dev`
//!   and a new `/run`, sets the hostname, joins the host's own cgroups (as
//!   [`crate::systemd::SystemdHost`] does, so hosts never share unit cgroups), waits
//!   for the machine side to move `eth0` in, configures it, and execs systemd
//!   chrooted into the overlay.
//! - Its link is a veth pair on a `/30` of its own ([`net::Slot`]): the machine end is
//!   `capf<n>`, so cutting that link is a partition ([`FleetHost::partition`]).
//! - It is ready once `systemctl is-system-running` says `running` (or `degraded`,
//!   its failed units printed) and sshd answers on its address with an SSH banner.
//!
//! Stopping: SIGKILL to its PID 1 ends the namespace (mounts, link and all); `unshare`
//! then exits 1 ([`crate::systemd::EXIT`]), which [`FleetHost::kill`] asserts. The
//! same `setpriv --pdeathsig KILL` + `unshare --kill-child` chain as `SystemdHost`
//! kills every host when the test binary dies; the next [`Fleet::create`] sweeps away
//! the dirs and cgroups of fleets whose test binary is gone.

mod host;
pub mod net;
pub mod ssh;

pub use host::FleetHost;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where fleets' dirs and the subnet slots live.
const ROOT: &str = "/var/lib/capstan-tests/fleet";

/// The cached rootfs: `$CAPSTAN_FLEET_ROOTFS` (`scripts/test.sh` sets it), else what
/// `.ci/rootfs.sh` prints (it builds the rootfs first on a machine without it).
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let path = std::env::var_os("CAPSTAN_FLEET_ROOTFS")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::ci_script("rootfs.sh"));
        assert!(
            path.join("lib/systemd/systemd").exists(),
            "{} is not a fleet rootfs (.ci/rootfs.sh builds one)",
            path.display()
        );
        path
    })
}

/// One test's fleet: its dir (hosts' disks, logs) and its SSH client key. Hosts
/// borrow it, so they are all gone before it is.
pub struct Fleet {
    dir: tempfile::TempDir,
    /// Its hub's slot: the address every host reaches the machine at.
    hub: net::Slot,
}

impl Fleet {
    /// A new, empty fleet with a fresh ed25519 client key.
    pub fn create() -> Fleet {
        crate::watchdog::watch();
        let dir = crate::pid1::new_dir(ROOT, "fleet-", |dir| {
            let fleet = dir.file_name().expect("a dir name").to_string_lossy();
            let hosts = std::fs::read_dir(dir.join("hosts")).into_iter().flatten();
            hosts
                .flatten()
                .flat_map(|host| cgroups(&fleet, &host.file_name().to_string_lossy()))
                .collect()
        });
        net::Slot::sweep(&Path::new(ROOT).join("net"));
        ssh::keygen(&dir.path().join("id_ed25519"), "capstan-tests");
        let hub = net::Slot::take(&Path::new(ROOT).join("net"));
        // A crashed binary's hub link is swept with its slot; wait if it still goes.
        crate::wait_until(
            format_args!("{} (the slot's previous link) to go", hub.link()),
            crate::READY,
            || !hub.linked(),
        );
        hub.hub();
        Fleet { dir, hub }
    }

    /// The machine address every host of the fleet reaches, whatever happens to the
    /// other hosts' links: where the machine side's services listen for them (e.g.
    /// nats-server). Each host routes it via the machine end of its own link, so a
    /// partitioned host does not reach it.
    pub fn hub_addr(&self) -> Ipv4Addr {
        self.hub.machine_addr()
    }

    /// The test's SSH private key, which every host's root accepts.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("id_ed25519")
    }

    /// Boots a new host called `name` (a DNS label, unique in this fleet) and waits
    /// until it is ready (see the module doc).
    pub fn boot(&self, name: &str) -> FleetHost<'_> {
        assert!(
            !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{name:?} is not a DNS label"
        );
        let dir = self.dir.path().join("hosts").join(name);
        std::fs::create_dir_all(dir.parent().expect("hosts")).expect("the hosts dir");
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!("cannot create {} (a host name twice?): {e}", dir.display())
        });
        for sub in ["upper", "work", "root"] {
            std::fs::create_dir(dir.join(sub)).expect("a host subdir");
        }
        let slot = net::Slot::take(&Path::new(ROOT).join("net"));
        let cgroups = cgroups(&self.name(), name);
        FleetHost::boot(self, name, dir, slot, cgroups)
    }

    fn name(&self) -> String {
        self.dir
            .path()
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned()
    }
}

/// A host's cgroups: `<fleet dir's name>.<host>` in each hierarchy.
fn cgroups(fleet: &str, host: &str) -> Vec<PathBuf> {
    crate::pid1::cgroups(format!("{fleet}.{host}").as_ref())
}

impl Drop for Fleet {
    /// Its hosts are gone (they borrow it): removes its hub link; its slot and dir go
    /// after.
    fn drop(&mut self) {
        self.hub.unlink();
    }
}
