//! Finding a revision's QEMU process: its pidfile, then `/proc/PID/cmdline` naming the
//! revision (`-name guest=<name>,…`), so a pid reused by anything else is never taken
//! for it. Whoever started it (this agent, an earlier one), it is found the same way:
//! that is how a VM left running across an agent upgrade is adopted.

use crate::launch::{name_option, Vm};
use std::time::Duration;

/// The pid of `vm`'s QEMU, when one runs.
pub fn running(vm: &Vm) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(vm.pidfile())
        .ok()?
        .trim()
        .parse()
        .ok()?;
    is_qemu_of(pid, &vm.name).then_some(pid)
}

/// Whether process `pid` is the QEMU of the VM named `name`.
pub fn is_qemu_of(pid: i32, name: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let wanted = name_option(name);
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == wanted.as_bytes())
}

/// Waits until process `pid` (the QEMU of `name`) is gone, at most `timeout`; whether
/// it is. Polled: a daemonized QEMU is not this process's child.
pub async fn gone(pid: i32, name: &str, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !is_qemu_of(pid, name) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILL to process `pid`, if it is still the QEMU of `name`.
pub fn kill(pid: i32, name: &str) {
    if is_qemu_of(pid, name) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
