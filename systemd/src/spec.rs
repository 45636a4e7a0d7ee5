//! The systemd driver's own part of a spec: its section ([`SystemdSpec`], under
//! `"systemd"`) and its rules (an absolute program to run, only settings it can write
//! into a unit: accounts, allowed capabilities, system call groups and names; port
//! readiness checks only).

use capstan_common::validate::{is_abs_path, truncate};
use capstan_common::{Check, DriverKind, ErrorCode, Rejection, Settings, Spec};
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;

/// A systemd unit's own settings, the spec's `"systemd"` section. Each one relaxes or
/// bounds the hardened default the systemd driver writes (`docs/systemd.md`).
// Fields added later are left out of the JSON while empty (`skip_serializing_if`), so
// the canonical JSON — and the hash and id binding — of a spec written before them
// stays what it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemdSpec {
    /// `User=`: a user name or a numeric uid; `None`: the namespace's own dynamic
    /// user (`DynamicUser=`), never root unless asked for.
    #[serde(default)]
    pub user: Option<String>,
    /// `Group=`: a group name or a numeric gid.
    #[serde(default)]
    pub group: Option<String>,
    /// Capabilities the unit holds (`CapabilityBoundingSet=` and
    /// `AmbientCapabilities=`), from [`SYSTEMD_CAPABILITIES`]; empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// System calls allowed besides `@system-service` (`SystemCallFilter=`): `@group`
    /// names of systemd's sets or single syscall names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<String>,
    /// Absolute paths the workload may write besides its namespace's state directory
    /// (`ReadWritePaths=`; the rest of the file system is read-only).
    #[serde(default)]
    pub read_write_paths: Vec<String>,
    /// `MemoryMax=` in bytes.
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
    /// `CPUQuota=` in percent of one CPU (200 = two CPUs).
    #[serde(default)]
    pub cpu_quota_percent: Option<u32>,
}

impl Settings for SystemdSpec {
    const KIND: DriverKind = DriverKind::SYSTEMD;
}

/// The systemd driver's rules for a spec of its own: an absolute program to run,
/// settings it can write into a unit, port readiness checks. Answers the settings.
pub fn check(spec: &Spec) -> Result<SystemdSpec, Rejection> {
    let invalid = |m: &str| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    let s = SystemdSpec::read(spec)
        .map_err(|e| Rejection::new(ErrorCode::InvalidSpec, format!("`systemd`: {e}")))?;
    match spec.command.first() {
        Some(program) if is_abs_path(program) => {}
        _ => return invalid("driver systemd needs `command` whose first item is an absolute path"),
    }
    if spec.image.is_some() {
        return invalid("driver systemd runs no image: leave `image` out");
    }
    if !spec.mounts.is_empty() || !spec.ports.is_empty() {
        return invalid(
            "driver systemd has no `mounts` or `ports`: use `systemd.read_write_paths`",
        );
    }
    if let Some(Check::Exec { .. }) = spec.readiness.as_ref().map(|r| &r.check) {
        return invalid(
            "the systemd driver probes `http` and `tcp` readiness only: an `exec` check would run outside the unit's sandbox",
        );
    }
    for id in [&s.user, &s.group].into_iter().flatten() {
        if !is_account_name(id) {
            return invalid(
                "`systemd.user`/`group` must be a number (0-4294967294, not 65535) or match ^[a-z_][a-z0-9_-]{0,31}$",
            );
        }
    }
    if let Some(bad) = s
        .capabilities
        .iter()
        .find(|c| !SYSTEMD_CAPABILITIES.contains(&c.as_str()))
    {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`systemd.capabilities`: {:?} is not one a spec may ask for ({})",
                truncate(bad),
                SYSTEMD_CAPABILITIES.join(", ")
            ),
        ));
    }
    if s.capabilities
        .iter()
        .enumerate()
        .any(|(i, c)| s.capabilities[..i].contains(c))
    {
        return invalid("`systemd.capabilities` names a capability twice");
    }
    if s.syscalls.len() > MAX_SYSCALLS {
        return invalid("`systemd.syscalls` holds at most 128 items");
    }
    if let Some(bad) = s.syscalls.iter().find(|c| !is_syscall_item(c)) {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`systemd.syscalls`: {:?} is neither one of systemd's groups ({}) nor a syscall name ^[a-z_][a-z0-9_]{{0,63}}$",
                truncate(bad),
                SYSCALL_GROUPS.join(", ")
            ),
        ));
    }
    if !s.read_write_paths.iter().all(|p| is_abs_path(p)) {
        return invalid(
            "`systemd.read_write_paths` must be absolute paths without NUL, newline, `,` or `..`",
        );
    }
    if s.memory_max_bytes == Some(0) || s.cpu_quota_percent == Some(0) {
        return invalid("`systemd.memory_max_bytes` and `cpu_quota_percent` must be above 0");
    }
    Ok(s)
}

/// The capabilities a systemd spec may ask for (`systemd.capabilities`). Left out on
/// purpose, as each one reaches beyond the workload's own files and processes on a
/// shared host: `CAP_SYS_ADMIN`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_SYS_PTRACE`,
/// `CAP_SYS_BOOT`, `CAP_SYS_TIME`, `CAP_SYS_NICE`, `CAP_SYS_RESOURCE`,
/// `CAP_SYS_PACCT`, `CAP_SYS_TTY_CONFIG`, `CAP_SYS_CHROOT`, `CAP_NET_ADMIN`,
/// `CAP_KILL`, `CAP_SETUID`, `CAP_SETGID`, `CAP_SETPCAP`, `CAP_SETFCAP`,
/// `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_MKNOD`, `CAP_LINUX_IMMUTABLE`,
/// `CAP_IPC_OWNER`, `CAP_MAC_ADMIN`, `CAP_MAC_OVERRIDE`, `CAP_AUDIT_CONTROL`,
/// `CAP_AUDIT_READ`, `CAP_SYSLOG`, `CAP_BPF`, `CAP_PERFMON`, `CAP_CHECKPOINT_RESTORE`
/// (`docs/systemd.md`, *Hardening*).
pub const SYSTEMD_CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_WRITE",
    "CAP_BLOCK_SUSPEND",
    "CAP_CHOWN",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_IPC_LOCK",
    "CAP_LEASE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_RAW",
    "CAP_WAKE_ALARM",
];

/// systemd 252's system call groups (`systemd-analyze syscall-filter`), which
/// `systemd.syscalls` may name.
pub const SYSCALL_GROUPS: &[&str] = &[
    "@aio",
    "@basic-io",
    "@chown",
    "@clock",
    "@cpu-emulation",
    "@debug",
    "@file-system",
    "@io-event",
    "@ipc",
    "@keyring",
    "@known",
    "@memlock",
    "@module",
    "@mount",
    "@network-io",
    "@obsolete",
    "@pkey",
    "@privileged",
    "@process",
    "@raw-io",
    "@reboot",
    "@resources",
    "@sandbox",
    "@setuid",
    "@signal",
    "@swap",
    "@sync",
    "@system-service",
    "@timer",
];

/// The most items `systemd.syscalls` holds.
const MAX_SYSCALLS: usize = 128;

/// One of [`SYSCALL_GROUPS`], or a system call's name: `^[a-z_][a-z0-9_]{0,63}$`.
pub fn is_syscall_item(s: &str) -> bool {
    if s.starts_with('@') {
        return SYSCALL_GROUPS.contains(&s);
    }
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// A user or group as systemd's `User=`/`Group=` take it: a numeric id (not
/// 4294967295 nor 65535, the 32- and 16-bit "no id") or a portable account name.
pub fn is_account_name(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.is_empty() && b.iter().all(u8::is_ascii_digit) {
        return s
            .parse::<u32>()
            .is_ok_and(|id| id != u32::MAX && id != 65535);
    }
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}
