//! The unit files as text, rendered from a spec: a revision's service, the drop-in
//! that carries its launch environment, a namespace's slice. Each file begins with
//! [`HEADER`] and carries `X-Capstan-*` markers in `[Unit]` (systemd ignores `X-`
//! keys), by which the driver knows its own files again ([`markers`],
//! [`slice_markers`]). Every value goes through [`escape`]: nothing a spec holds can
//! add a line, a section or a directive.

use crate::escape::{self, EscapeError};
use crate::naming;
use capstan_common::Spec;
use capstan_driver::RevisionRef;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::PathBuf;

/// The first line of every file capstan writes: a file without it is not ours.
pub const HEADER: &str =
    "# Written by capstan-agent; managed over D-Bus. Do not edit: changes are overwritten.";

const HOST: &str = "X-Capstan-Host";
const NAMESPACE: &str = "X-Capstan-Namespace";
const WORKLOAD: &str = "X-Capstan-Workload";
const REVISION: &str = "X-Capstan-Revision";
const SPEC_HASH: &str = "X-Capstan-Spec-Hash";

/// What a service unit says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    pub host: String,
    pub namespace: String,
    pub workload: String,
    pub revision: String,
    /// [`naming::spec_hash`] of the spec the unit was rendered from.
    pub spec_hash: String,
}

/// The agent's settings for the units it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSettings {
    /// The namespace's state directory, `<state_dir>/<namespace>`: under `/var/lib`,
    /// made by systemd (`StateDirectory=`) for the unit's user; the default
    /// `WorkingDirectory=`.
    pub state_dir: PathBuf,
    /// `TimeoutStopSec=` (0: no timeout).
    pub stop_timeout_secs: u32,
    /// `StartLimitIntervalSec=` and `StartLimitBurst=`: more starts than the burst
    /// within the interval, restarts by the agent included, and systemd gives up
    /// (`start-limit-hit`).
    pub start_limit_interval_secs: u32,
    pub start_limit_burst: u32,
    /// `RestartSec=`, in milliseconds: the pause before systemd restarts a failed unit.
    pub restart_sec_ms: u32,
}

impl UnitSettings {
    /// The defaults: stop within 30 s; restart a failed unit after 1 s; give up after
    /// 10 starts within 60 s (systemd's own 5 in 10 s is hit by a few quick
    /// re-activations).
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            stop_timeout_secs: 30,
            start_limit_interval_secs: 60,
            start_limit_burst: 10,
            restart_sec_ms: 1000,
        }
    }
}

/// Where `StateDirectory=` paths are relative to.
pub const STATE_ROOT: &str = "/var/lib/";
/// Where systemd keeps the state directory of a unit with `DynamicUser=`: the unit
/// reaches it there whatever the modes of the directories above `state_dir` (the
/// shipped agent's data dir is `0700`); `state_dir/<ns>` is systemd's symlink to it.
pub const PRIVATE_STATE_ROOT: &str = "/var/lib/private/";

/// The sandbox every revision's unit gets, whatever its spec
/// (`docs/systemd.md`, *Hardening*). Its user, capabilities and extra system calls
/// come from the spec ([`service`]); `MemoryDenyWriteExecute=` is left out: it
/// breaks every JIT (JVM, V8, LuaJIT, .NET), so a site turns it on per namespace with a
/// drop-in.
pub const HARDENING: &[&str] = &[
    "NoNewPrivileges=yes",
    "SystemCallFilter=@system-service",
    "SystemCallErrorNumber=EPERM",
    "SystemCallArchitectures=native",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "PrivateIPC=yes",
    "ProtectProc=invisible",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictNamespaces=yes",
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    "LockPersonality=yes",
    "RemoveIPC=yes",
    "UMask=0077",
];

/// The `.service` of a revision. No environment (that is the drop-in's, see
/// [`env_dropin`]). `[Install]` says what enabling it means: started at boot with
/// `multi-user.target` (the driver enables a revision while intent wants it running,
/// unless the agent manages the lifecycle).
pub fn service(
    host: &str,
    rev: RevisionRef<'_>,
    spec: &Spec,
    settings: &UnitSettings,
) -> Result<String, EscapeError> {
    let ns = escape::plain("namespace", rev.namespace)?;
    let workload = escape::plain("workload", rev.workload)?;
    let revision = escape::plain("revision", rev.revision)?;
    let s = <crate::SystemdSpec as capstan_common::Settings>::read(spec)
        .map_err(|e| EscapeError::Settings(e.to_string()))?;
    let state = state_directory(&settings.state_dir)?;
    let working_dir = match &spec.working_dir {
        Some(dir) => escape::path(dir).map_err(|e| e.within("working_dir"))?,
        None => escape::path(&format!("{PRIVATE_STATE_ROOT}{state}"))
            .map_err(|e| e.within("state_dir"))?,
    };
    let user = match &s.user {
        Some(user) => escape::plain("systemd.user", user)?,
        None => escape::plain("systemd.user", &naming::namespace_user(rev.namespace))?,
    };
    let capabilities = escape::capabilities(&s.capabilities)?;

    let mut t = format!("{HEADER}\n[Unit]\n");
    line(
        &mut t,
        "Description",
        format!("capstan {ns}/{workload}@{revision}"),
    );
    line(&mut t, HOST, escape::plain("host", host)?);
    line(&mut t, NAMESPACE, &ns);
    line(&mut t, WORKLOAD, &workload);
    line(&mut t, REVISION, &revision);
    line(&mut t, SPEC_HASH, naming::spec_hash(spec));
    line(
        &mut t,
        "StartLimitIntervalSec",
        settings.start_limit_interval_secs,
    );
    line(&mut t, "StartLimitBurst", settings.start_limit_burst);
    t.push_str("\n[Service]\n");
    line(&mut t, "Type", "exec");
    line(&mut t, "ExecStart", escape::exec_start(&spec.command)?);
    line(&mut t, "WorkingDirectory", working_dir);
    line(&mut t, "Restart", "on-failure");
    line(
        &mut t,
        "RestartSec",
        format!("{}ms", settings.restart_sec_ms),
    );
    line(&mut t, "TimeoutStopSec", settings.stop_timeout_secs);
    line(&mut t, "Slice", naming::slice_name(rev.namespace));
    // Never root unless the spec says so: a dynamic user (the namespace's, or the
    // spec's name when no account has it; an existing account is used as it is).
    line(&mut t, "DynamicUser", "yes");
    line(&mut t, "User", user);
    if let Some(group) = &s.group {
        line(&mut t, "Group", escape::plain("systemd.group", group)?);
    }
    line(&mut t, "StateDirectory", state);
    line(&mut t, "StateDirectoryMode", "0700");
    line(&mut t, "CapabilityBoundingSet", &capabilities);
    line(&mut t, "AmbientCapabilities", &capabilities);
    for setting in HARDENING {
        t.push_str(setting);
        t.push('\n');
    }
    if !s.syscalls.is_empty() {
        line(&mut t, "SystemCallFilter", escape::syscalls(&s.syscalls)?);
    }
    if !s.read_write_paths.is_empty() {
        line(
            &mut t,
            "ReadWritePaths",
            escape::path_list(&s.read_write_paths)
                .map_err(|e| e.within("systemd.read_write_paths"))?,
        );
    }
    if let Some(bytes) = s.memory_max_bytes {
        line(&mut t, "MemoryMax", bytes);
    }
    if let Some(percent) = s.cpu_quota_percent {
        line(&mut t, "CPUQuota", format!("{percent}%"));
    }
    t.push_str("\n[Install]\n");
    line(&mut t, "WantedBy", "multi-user.target");
    Ok(t)
}

/// The namespace's state directory as `StateDirectory=` takes it: relative to
/// [`STATE_ROOT`].
pub fn state_directory(dir: &std::path::Path) -> Result<String, EscapeError> {
    let refuse = |why| EscapeError::Invalid {
        field: "state_dir",
        why,
    };
    let dir = dir.to_str().ok_or(refuse("not UTF-8"))?;
    let rel = dir
        .strip_prefix(STATE_ROOT)
        .ok_or(refuse("must be under /var/lib (systemd's StateDirectory=)"))?;
    escape::state_directory(rel)
}

/// The unit that removes namespace `namespace`'s state directory
/// ([`naming::cleanup_unit`]): run once by `delete_namespace`, as root, after the
/// last unit of the namespace is gone. It removes both where systemd keeps the
/// directory of a dynamic user and `state_dir/<ns>` (systemd's symlink to it, or the
/// plain directory an older agent made). Its `[Unit]` names the host only: it is
/// neither a revision nor a namespace.
pub fn cleanup(
    host: &str,
    namespace: &str,
    state_dir: &std::path::Path,
) -> Result<String, EscapeError> {
    let ns = escape::plain("namespace", namespace)?;
    let state = state_directory(state_dir)?;
    let command = [
        "/bin/rm",
        "-rf",
        "--one-file-system",
        "--",
        &format!("{PRIVATE_STATE_ROOT}{state}"),
        &format!("{STATE_ROOT}{state}"),
    ]
    .map(String::from);
    let mut t = format!("{HEADER}\n[Unit]\n");
    line(
        &mut t,
        "Description",
        format!("capstan: remove the state of namespace {ns}"),
    );
    line(&mut t, HOST, escape::plain("host", host)?);
    t.push_str("\n[Service]\n");
    line(&mut t, "Type", "oneshot");
    line(&mut t, "ExecStart", escape::exec_start(&command)?);
    line(&mut t, "PrivateNetwork", "yes");
    line(&mut t, "NoNewPrivileges", "yes");
    Ok(t)
}

/// Whether `text` is a cleanup unit ([`cleanup`]) this host wrote.
pub fn is_cleanup(host: &str, text: &str) -> bool {
    unit_markers(text).is_some_and(|m| m.len() == 1 && m.get(HOST) == Some(&host))
}

/// The drop-in ([`naming::ENV_DROPIN`]) holding a revision's whole environment, one
/// `Environment=` line a variable, in map order. The caller passes
/// `capstan_driver::merged_env(spec, launch_env)`.
pub fn env_dropin(env: &BTreeMap<String, String>) -> Result<String, EscapeError> {
    let mut t = format!("{HEADER}\n[Service]\n");
    for (name, value) in env {
        t.push_str(&escape::environment(name, value)?);
        t.push('\n');
    }
    Ok(t)
}

/// The `.slice` of a namespace.
pub fn slice(host: &str, namespace: &str) -> Result<String, EscapeError> {
    let ns = escape::plain("namespace", namespace)?;
    let mut t = format!("{HEADER}\n[Unit]\n");
    line(&mut t, "Description", format!("capstan namespace {ns}"));
    line(&mut t, HOST, escape::plain("host", host)?);
    line(&mut t, NAMESPACE, &ns);
    t.push_str("\n[Slice]\n");
    Ok(t)
}

/// The markers of a service unit capstan wrote, or `None` when `text` is not one:
/// [`HEADER`] must be its first line and each marker present once in `[Unit]`.
pub fn markers(text: &str) -> Option<Markers> {
    let mut m = unit_markers(text)?;
    let mut take = |key| m.remove(key).map(str::to_string);
    Some(Markers {
        host: take(HOST)?,
        namespace: take(NAMESPACE)?,
        workload: take(WORKLOAD)?,
        revision: take(REVISION)?,
        spec_hash: take(SPEC_HASH)?,
    })
}

/// The host and namespace of a slice capstan wrote, or `None` when `text` is not
/// one (a service's markers name a workload; a slice's do not).
pub fn slice_markers(text: &str) -> Option<(String, String)> {
    let m = unit_markers(text)?;
    if m.contains_key(WORKLOAD) {
        return None;
    }
    Some((m.get(HOST)?.to_string(), m.get(NAMESPACE)?.to_string()))
}

/// The `X-Capstan-*` keys of `[Unit]` with their non-empty values, when [`HEADER`]
/// is the first line and no key is repeated.
fn unit_markers(text: &str) -> Option<BTreeMap<&str, &str>> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut in_unit = false;
    let mut found = BTreeMap::new();
    for l in lines.map(str::trim) {
        if l.starts_with('[') {
            in_unit = l == "[Unit]";
            continue;
        }
        let Some((key, value)) = l.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if !in_unit || !key.starts_with("X-Capstan-") {
            continue;
        }
        if value.is_empty() || found.insert(key, value).is_some() {
            return None;
        }
    }
    Some(found)
}

fn line(t: &mut String, key: &str, value: impl Display) {
    t.push_str(key);
    t.push('=');
    t.push_str(&value.to_string());
    t.push('\n');
}

#[cfg(test)]
mod tests;
