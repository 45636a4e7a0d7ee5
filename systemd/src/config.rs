//! `[systemd]` in the agent config.

use serde::Deserialize;
use std::path::PathBuf;

/// systemd driver settings (`[systemd]` in the agent config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemdConfig {
    /// The D-Bus address of systemd's bus, `unix:path=…`; absent: the system bus.
    #[serde(default)]
    pub bus: Option<String>,
    /// Where unit files are written; systemd must read units from there.
    #[serde(default = "default_unit_dir")]
    pub unit_dir: PathBuf,
    /// Each namespace's state directory is `<state_dir>/<namespace>`: the default
    /// working directory of its units and always writable by them. systemd makes it
    /// (`StateDirectory=`), so it must be under `/var/lib`.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The agent owns the units' lifecycle: its stop sweep stops them and its startup
    /// starts them. Off by default: systemd keeps units running without the agent, so
    /// an agent stop leaves them running and an agent start only reconciles.
    #[serde(default)]
    pub manage_lifecycle: bool,
    /// Remove units labelled as this host's that intent does not know (drift). Off by
    /// default: drift is only reported.
    #[serde(default)]
    pub reap_orphans: bool,
    /// How long a start, restart or stop job may take before the command fails.
    #[serde(default = "default_job_timeout")]
    pub job_timeout_secs: u32,
    /// `TimeoutStopSec=` of every unit: SIGTERM, then SIGKILL after this long.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
    /// `StartLimitIntervalSec=` and `StartLimitBurst=`: a unit started more often than
    /// this (by systemd's `Restart=` or by commands) is failed, and reported so.
    #[serde(default = "default_start_limit_interval")]
    pub start_limit_interval_secs: u32,
    #[serde(default = "default_start_limit_burst")]
    pub start_limit_burst: u32,
    /// `RestartSec=` in milliseconds: the pause before systemd restarts a crashed unit.
    #[serde(default = "default_restart_ms")]
    pub restart_sec_ms: u32,
}

fn default_unit_dir() -> PathBuf {
    "/etc/systemd/system".into()
}

fn default_state_dir() -> PathBuf {
    "/var/lib/capstan/units".into()
}

fn default_job_timeout() -> u32 {
    90
}

fn default_stop_timeout() -> u32 {
    10
}

fn default_start_limit_interval() -> u32 {
    60
}

fn default_start_limit_burst() -> u32 {
    10
}

fn default_restart_ms() -> u32 {
    1000
}

impl Default for SystemdConfig {
    fn default() -> Self {
        SystemdConfig {
            bus: None,
            unit_dir: default_unit_dir(),
            state_dir: default_state_dir(),
            manage_lifecycle: false,
            reap_orphans: false,
            job_timeout_secs: default_job_timeout(),
            stop_timeout_secs: default_stop_timeout(),
            start_limit_interval_secs: default_start_limit_interval(),
            start_limit_burst: default_start_limit_burst(),
            restart_sec_ms: default_restart_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_section_is_the_default_and_unknown_keys_are_refused() {
        let empty: SystemdConfig = toml_like("{}");
        assert_eq!(empty, SystemdConfig::default());
        assert!(serde_json::from_str::<SystemdConfig>(r#"{"unit_dirs":"/x"}"#).is_err());
    }

    fn toml_like(json: &str) -> SystemdConfig {
        serde_json::from_str(json).unwrap()
    }
}
