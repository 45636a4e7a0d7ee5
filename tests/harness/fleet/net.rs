//! A fleet host's link to the machine: a `/30` of `10.213.0.0/16` and a veth pair
//! named after it, both unique machine-wide while the host's [`Slot`] is held.
//!
//! Slots are files `<ROOT>/net/<n>` created with `O_EXCL` and holding their owner's
//! pid, so parallel tests and parallel test binaries never share a subnet or a veth
//! name; [`Slot::sweep`] frees those whose owner is gone (a test binary that aborted).
//! Slot `n` is `10.213.0.0/16`'s `n`-th `/30`: the machine end is its `.1`, the host
//! end its `.2`, and the machine end is named `capf<n>` (at most 9 characters: link
//! names are limited to 15). The host end is `eth0` inside the host's net namespace;
//! the pair goes when that namespace does, which is when the host's PID 1 dies.
//!
//! A [`crate::fleet::Fleet`] takes a slot too, for its hub: a link `capf<n>` (one end
//! of a veth pair kept on the machine) holding the slot's `.1` as a `/32`, the one machine address that every host of the
//! fleet reaches (each host routes it via the machine end of its own link), where the
//! machine side's services (nats-server) listen. It stays up whatever happens to any
//! host's link.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How many `/30`s `10.213.0.0/16` holds.
const SLOTS: u32 = 1 << 14;

/// One host's subnet and link name, released (its file removed) on drop.
pub struct Slot {
    n: u32,
    file: PathBuf,
}

impl Slot {
    /// Takes a free slot under `dir`, starting the search at a place derived from the
    /// pid (so that parallel binaries rarely contend).
    pub fn take(dir: &Path) -> Slot {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let start = std::process::id().wrapping_mul(97) % SLOTS;
        for i in 0..SLOTS {
            let n = (start + i) % SLOTS;
            let file = dir.join(n.to_string());
            if claim(&file) {
                return Slot { n, file };
            }
        }
        panic!("no free fleet subnet slot under {}", dir.display());
    }

    /// Frees the slots under `dir` whose owner is gone (a test binary that aborted
    /// runs no drop), removing their links: a hub's link outlives its binary, a
    /// host's veth is going with its namespace anyway.
    pub fn sweep(dir: &Path) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(n) = name.parse::<u32>() else {
                continue;
            };
            if stale(&entry.path()) {
                // Renamed first: of several binaries sweeping it, one wins the rename.
                let doomed = dir.join(format!("{n}.stale.{}", std::process::id()));
                if std::fs::rename(entry.path(), &doomed).is_ok() {
                    unlink(&machine_link(n));
                    let _ = std::fs::remove_file(&doomed);
                }
            }
        }
    }

    fn base(&self) -> u32 {
        u32::from(Ipv4Addr::new(10, 213, 0, 0)) + 4 * self.n
    }

    /// The machine end's address (`.1` of the `/30`).
    pub fn machine_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base() + 1)
    }

    /// The host's address (`.2` of the `/30`).
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base() + 2)
    }

    /// The machine end's link name.
    pub fn link(&self) -> String {
        machine_link(self.n)
    }

    /// Makes the veth pair: `link()` here, `eth0` in the net namespace of `pid`, and
    /// gives the machine end its address and brings it up. The host end is
    /// configured from inside (the setup script).
    pub fn connect(&self, pid: u32) {
        self.make_link(&["eth0", "netns", &pid.to_string()], 30);
    }

    /// Makes this slot a fleet's hub: a link holding [`Slot::machine_addr`] alone.
    /// Removed by [`Slot::unlink`] (or, after a crash, [`Slot::sweep`]).
    pub fn hub(&self) {
        // A veth pair with both ends here (this kernel has no dummy links): its
        // addressed end has a carrier once both are up.
        let peer = format!("{}x", self.link());
        self.make_link(&[&peer], 32);
        ip(&["link", "set", &peer, "up"]);
    }

    /// A veth pair: [`Slot::link`] with [`Slot::machine_addr`]`/prefix`, up, and its
    /// peer named by `peer` (`NAME [netns PID]`).
    fn make_link(&self, peer: &[&str], prefix: u8) {
        let link = self.link();
        let mut add = vec!["link", "add", &link, "type", "veth", "peer", "name"];
        add.extend_from_slice(peer);
        ip(&add);
        let addr = format!("{}/{prefix}", self.machine_addr());
        ip(&["addr", "add", &addr, "dev", &link]);
        ip(&["link", "set", &link, "up"]);
    }

    /// Removes the machine end's link, if any (cleanup only: never asserts).
    pub fn unlink(&self) {
        unlink(&self.link());
    }

    /// Whether the machine end exists (it goes with the host's net namespace).
    pub fn linked(&self) -> bool {
        link_exists(&self.link())
    }

    /// Brings the machine end down (a partition) or up again (healed).
    pub fn set_up(&self, up: bool) {
        ip(&["link", "set", &self.link(), if up { "up" } else { "down" }]);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn machine_link(n: u32) -> String {
    format!("capf{n}")
}

fn unlink(name: &str) {
    if link_exists(name) {
        let _ = Command::new("ip")
            .args(["link", "del", name])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Creates `file` holding this process's pid, if nobody holds it.
fn claim(file: &Path) -> bool {
    use std::io::Write as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
    {
        Ok(mut f) => {
            f.write_all(std::process::id().to_string().as_bytes())
                .expect("write a slot's owner");
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => panic!("cannot create {}: {e}", file.display()),
    }
}

/// Whether `file` names an owner that is gone. A file still being written (empty)
/// is not stale.
fn stale(file: &Path) -> bool {
    let Ok(owner) = std::fs::read_to_string(file) else {
        return false;
    };
    owner
        .trim()
        .parse::<u32>()
        .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// `ip ARGS` on the machine, which must succeed.
#[track_caller]
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (Debian's iproute2)");
    assert!(
        out.status.success(),
        "ip {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
