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
    /// The namespace's state directory: the default `WorkingDirectory=` and always
    /// in `ReadWritePaths=`.
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
    let state_dir = settings.state_dir.to_str().ok_or(EscapeError::Invalid {
        field: "state_dir",
        why: "not UTF-8",
    })?;
    let working_dir = spec.working_dir.as_deref().unwrap_or(state_dir);
    let mut read_write =
        escape::path_list(&[state_dir.to_string()]).map_err(|e| e.within("state_dir"))?;
    if !spec.systemd.read_write_paths.is_empty() {
        read_write.push(' ');
        read_write.push_str(
            &escape::path_list(&spec.systemd.read_write_paths)
                .map_err(|e| e.within("systemd.read_write_paths"))?,
        );
    }

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
    line(
        &mut t,
        "WorkingDirectory",
        escape::path(working_dir).map_err(|e| e.within("working_dir"))?,
    );
    line(&mut t, "Restart", "on-failure");
    line(
        &mut t,
        "RestartSec",
        format!("{}ms", settings.restart_sec_ms),
    );
    line(&mut t, "TimeoutStopSec", settings.stop_timeout_secs);
    line(&mut t, "Slice", naming::slice_name(rev.namespace));
    for setting in [
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
    ] {
        t.push_str(setting);
        t.push('\n');
    }
    line(&mut t, "ReadWritePaths", read_write);
    let s = &spec.systemd;
    if let Some(user) = &s.user {
        line(&mut t, "User", escape::plain("systemd.user", user)?);
    }
    if let Some(group) = &s.group {
        line(&mut t, "Group", escape::plain("systemd.group", group)?);
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
