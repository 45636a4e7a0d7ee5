//! The driver contract kit's view of a systemd workload's environment
//! ([`capstan_driver::testkit::EnvProbe`]): the environ of the unit's main process,
//! read inside the test host, so what the kit sees is what the process got.

use capstan_driver::testkit::EnvProbe;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::systemd::SystemdHost;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// Reads `/proc/<MainPID>/environ` of a revision's unit inside a test host (the
/// host's PID 1, [`SystemdHost::pid`]: the host itself is not `Sync`).
pub struct UnitEnv(u32);

impl UnitEnv {
    pub fn of(host: &SystemdHost) -> UnitEnv {
        UnitEnv(host.pid())
    }

    /// `command` inside the host's mount and PID namespaces, as
    /// [`SystemdHost::nsenter`]: its stdout, or why it failed.
    fn nsenter(&self, command: &[&str]) -> Result<Vec<u8>, String> {
        let out = Command::new("nsenter")
            .args(["-t", &self.0.to_string(), "-m", "-p", "--"])
            .args(command)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run nsenter {command:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{command:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(out.stdout)
    }
}

#[async_trait::async_trait]
impl EnvProbe for UnitEnv {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let unit = naming::unit_name(rev);
        let show = ["systemctl", "show", "-p", "MainPID", "--value", &unit];
        let pid = String::from_utf8_lossy(&self.nsenter(&show)?)
            .trim()
            .to_string();
        if pid == "0" || pid.is_empty() {
            return Err(format!("{unit} has no main process"));
        }
        let environ = self.nsenter(&["cat", &format!("/proc/{pid}/environ")])?;
        parse(&environ).map_err(|e| format!("{unit}'s process {pid}: {e}"))
    }
}

/// `NAME=value` entries, each ended by NUL, as `/proc/<pid>/environ` holds them.
fn parse(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    bytes
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let entry = std::str::from_utf8(entry)
                .map_err(|e| format!("an entry that is not UTF-8 ({e}): {entry:?}"))?;
            let (name, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("an entry without '=': {entry:?}"))?;
            Ok((name.to_string(), value.to_string()))
        })
        .collect()
}
