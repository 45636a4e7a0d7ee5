//! Hosts boot, answer over SSH with the test's key, reach the machine over their
//! links, keep their disks across a reboot (and only their disks), and drop off the
//! network both ways while partitioned.

use super::ssh_ok;
use capstan_tests::fleet::{Fleet, FleetHost};
use capstan_tests::{wait_until, READY};
use std::collections::BTreeSet;
use std::io::Read as _;
use std::net::{Ipv4Addr, TcpListener};

/// Boots `names` side by side.
pub fn boot_all<'f>(fleet: &'f Fleet, names: &[&str]) -> Vec<FleetHost<'f>> {
    std::thread::scope(|s| {
        let booting: Vec<_> = names.iter().map(|n| s.spawn(|| fleet.boot(n))).collect();
        booting
            .into_iter()
            .map(|b| b.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// Whether `host` reaches the machine at `addr` (the machine end of its link, or the
/// fleet's hub, where the machine side's services listen): a line sent from inside it
/// (bash's `/dev/tcp`, run through `nsenter`, so not over its link) arrives at a
/// listener there within 3 s.
fn reaches(host: &FleetHost<'_>, addr: Ipv4Addr) -> bool {
    let listener = TcpListener::bind((addr, 0)).expect("listen on the machine");
    let port = listener.local_addr().expect("its address").port();
    let send = format!("echo {} >/dev/tcp/{addr}/{port}", host.name());
    let sent = host.nsenter(&["timeout", "3", "bash", "-c", &send]);
    if !sent.status.success() {
        return false;
    }
    // It connected and wrote: the connection waits in the backlog.
    listener.set_nonblocking(true).expect("non-blocking");
    let (mut conn, from) = listener.accept().expect("the connection it made");
    assert_eq!(from.ip(), host.addr(), "from its own address");
    conn.set_nonblocking(false).expect("blocking");
    let mut line = String::new();
    conn.read_to_string(&mut line).expect("its line");
    assert_eq!(line, format!("{}\n", host.name()));
    true
}

#[test]
fn three_hosts_boot_and_answer_over_ssh_each_as_itself() {
    let fleet = Fleet::create();
    let hosts = boot_all(&fleet, &["alpha", "bravo", "charlie"]);
    let mut names = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    let mut machine_ids = BTreeSet::new();
    for host in &hosts {
        let state = host.systemctl(&["is-system-running"]);
        let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
        assert!(
            state == "running" || state == "degraded",
            "{}: {state}",
            host.name()
        );
        assert_eq!(host.property("ssh.service", "ActiveState"), "active");
        ssh_ok(host, &["true"]);
        assert!(reaches(host, host.machine_addr()), "{}", host.name());
        assert!(reaches(host, fleet.hub_addr()), "{}", host.name());
        let name = ssh_ok(host, &["hostname"]);
        assert_eq!(name.trim(), host.name());
        names.insert(name.trim().to_string());
        addrs.insert(host.addr());
        machine_ids.insert(ssh_ok(host, &["cat", "/etc/machine-id"]));
        // Its own PID namespace: systemd is its PID 1, and the machine's processes
        // (this test binary) are not in it.
        assert_eq!(ssh_ok(host, &["cat", "/proc/1/comm"]).trim(), "systemd");
        let test = std::process::id().to_string();
        let out = host.nsenter(&["test", "-e", &format!("/proc/{test}/exe")]);
        assert!(!out.status.success(), "{} sees pid {test}", host.name());
    }
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(addrs.len(), 3, "{addrs:?}");
    assert_eq!(machine_ids.len(), 3, "{machine_ids:?}");
    // Without the key, root is refused: the key is what lets the test in.
    let mut ssh = std::process::Command::new("ssh");
    ssh.args([
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
    ])
    .args([
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
    ])
    .args(["-o", "IdentityFile=/dev/null", "-o", "LogLevel=ERROR"])
    .arg(format!("root@{}", hosts[0].addr()))
    .arg("true");
    let out = capstan_tests::process::output("ssh without the key", capstan_tests::READY, ssh);
    // ssh's own failure (authentication refused) is 255; `true` would be 0.
    assert_eq!(
        out.status.code(),
        Some(255),
        "root got in without the key: {out:?}"
    );
    for host in hosts {
        host.kill();
    }
}

#[test]
fn a_reboot_keeps_the_disk_and_starts_a_new_boot() {
    let fleet = Fleet::create();
    let mut host = fleet.boot("rebooted");
    // ssh joins its arguments into one line for root's shell on the host.
    ssh_ok(&host, &["echo kept > /root/kept && touch /run/gone"]);
    let boot = ssh_ok(&host, &["cat", "/proc/sys/kernel/random/boot_id"]);
    let pid = host.pid();

    let ended = host.reboot();
    assert!(ended.contains("Started ssh.service"), "{ended}");
    assert_ne!(host.pid(), pid);
    assert_eq!(ssh_ok(&host, &["cat", "/root/kept"]), "kept\n");
    let out = host.ssh(&["test", "-e", "/run/gone"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "/run survived the reboot: {out:?}"
    );
    let again = ssh_ok(&host, &["cat", "/proc/sys/kernel/random/boot_id"]);
    assert_ne!(again, boot);
    // Its journal, read from the machine, holds both boots.
    let boots = host.journal(&["--list-boots"]);
    assert_eq!(boots.lines().count(), 2, "{boots}");
    assert!(boots.contains(&boot.trim().replace('-', "")), "{boots}");
    let journal = host.kill();
    assert_eq!(
        journal.matches("Started ssh.service").count(),
        2,
        "{journal}"
    );
}

#[test]
fn a_partitioned_host_stops_answering_until_healed() {
    let fleet = Fleet::create();
    let hosts = boot_all(&fleet, &["left", "cut", "right"]);
    let cut = &hosts[1];

    cut.partition();
    wait_until(
        format_args!("{} ({}) to stop answering", cut.name(), cut.addr()),
        READY,
        || !cut.answers(),
    );
    let out = cut.ssh(&["true"]);
    assert_eq!(out.status.code(), Some(255), "ssh got through: {out:?}");
    assert!(
        !reaches(cut, cut.machine_addr()),
        "{} got through",
        cut.name()
    );
    assert!(
        !reaches(cut, fleet.hub_addr()),
        "{} got through",
        cut.name()
    );
    for other in [&hosts[0], &hosts[2]] {
        assert!(other.answers(), "{} stopped answering too", other.name());
        ssh_ok(other, &["true"]);
        assert!(reaches(other, fleet.hub_addr()), "{}", other.name());
    }
    // It is up all along: only the link is cut.
    assert_eq!(cut.property("ssh.service", "ActiveState"), "active");

    cut.heal();
    wait_until(
        format_args!("{} ({}) to answer again", cut.name(), cut.addr()),
        READY,
        || cut.answers(),
    );
    ssh_ok(cut, &["true"]);
    assert!(reaches(cut, fleet.hub_addr()), "{}", cut.name());
    for host in hosts {
        host.kill();
    }
}
