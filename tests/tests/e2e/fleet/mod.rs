//! The fleet harness ([`capstan_tests::fleet`]): real Debian hosts booted with systemd
//! as PID 1 of their own namespaces on an overlay of the cached rootfs, reached over
//! SSH on links of their own; rebooted keeping their disks, partitioned and healed;
//! and the shipped capstan-agent package installed and run on one.

mod hosts;
mod install;
mod package;
mod systemd;

use capstan_tests::fleet::FleetHost;

/// `ssh root@<host> COMMAND` that must succeed; returns its stdout.
#[track_caller]
pub fn ssh_ok(host: &FleetHost<'_>, command: &[&str]) -> String {
    let out = host.ssh(command);
    assert!(
        out.status.success(),
        "ssh root@{} ({}) {} failed ({}): {}{}",
        host.addr(),
        host.name(),
        command.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
