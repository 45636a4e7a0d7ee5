//! The baseline: what the seeds' SSH driver did, over `ssh` with the fleet's key, a
//! new connection per step, one unit after another.

use super::capstan::ssh_ok;
use super::{value, verify, write};
use capstan_tests::fleet::FleetHost;
use std::time::{Duration, Instant};

const UNIT_DIR: &str = "/etc/systemd/system";

pub struct Ssh<'h, 'f> {
    host: &'h FleetHost<'f>,
    units: Vec<String>,
    pids: Vec<u32>,
}

/// `template` (a capstan unit file) as a plain unit of its own: without capstan's
/// header, markers and slice; the same `ExecStart=` and hardening.
fn twin(template: &str, unit: &str) -> String {
    template
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("X-Capstan-") && !l.starts_with("Slice="))
        .map(|l| {
            if l.starts_with("Description=") {
                format!("Description=capstan-bench ssh twin {unit}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

fn dropin(unit: &str) -> String {
    format!("{UNIT_DIR}/{unit}.d/env.conf")
}

impl<'h, 'f> Ssh<'h, 'f> {
    /// Writes `units` twin units with `T` of round 0, starts them (not timed) and
    /// checks they run.
    pub fn set_up(
        host: &'h FleetHost<'f>,
        template: &str,
        units: usize,
    ) -> anyhow::Result<Ssh<'h, 'f>> {
        let units: Vec<String> = (0..units)
            .map(|i| format!("bench-ssh-{i:02}.service"))
            .collect();
        for unit in &units {
            write(host, &format!("{UNIT_DIR}/{unit}"), &twin(template, unit))?;
            write(host, &dropin(unit), &env_conf(&value(0)))?;
        }
        ssh_ok(host, "systemctl daemon-reload")?;
        ssh_ok(host, &format!("systemctl start {}", units.join(" ")))?;
        let mut ssh = Ssh {
            host,
            units,
            pids: Vec::new(),
        };
        ssh.verify(0)?;
        Ok(ssh)
    }

    /// Per unit, one after another, each step its own `ssh`: the drop-in with
    /// round `round`'s `T`, `systemctl daemon-reload`, `systemctl restart`.
    pub fn round(&self, round: usize) -> anyhow::Result<Duration> {
        let conf = env_conf(&value(round));
        let started = Instant::now();
        for unit in &self.units {
            ssh_ok(
                self.host,
                &format!("printf '%s' '{conf}' > {}", dropin(unit)),
            )?;
            ssh_ok(self.host, "systemctl daemon-reload")?;
            ssh_ok(self.host, &format!("systemctl restart {unit}"))?;
        }
        Ok(started.elapsed())
    }

    pub fn verify(&mut self, round: usize) -> anyhow::Result<()> {
        self.pids = verify(self.host, &self.units, &self.pids, &value(round))?;
        Ok(())
    }
}

fn env_conf(value: &str) -> String {
    format!("[Service]\nEnvironment=T={value}\n")
}
