//! The baseline: what the seeds' SSH driver did, over `ssh` with the fleet's key, a
//! new connection per step, one unit after another.

use super::capstan::ssh_ok;
use super::{value, verify, write};
use capstan_tests::fleet::FleetHost;
use capstan_tests::{wait_until, READY};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UNIT_DIR: &str = "/etc/systemd/system";

pub struct Ssh<'h, 'f> {
    host: &'h FleetHost<'f>,
    units: Vec<String>,
    pids: Vec<u32>,
    /// The master connection's socket and the host's known_hosts (the variant that
    /// reuses one connection).
    shared: tempfile::TempDir,
    /// The fleet's client key.
    key: PathBuf,
    master: Option<Child>,
}

impl Drop for Ssh<'_, '_> {
    fn drop(&mut self) {
        if let Some(mut master) = self.master.take() {
            let _ = master.kill();
            let _ = master.wait();
        }
    }
}

/// How each step reaches the host.
#[derive(Clone, Copy)]
pub enum Connection {
    /// A new `ssh` connection per step, as a script would (and the seeds' driver did).
    New,
    /// Every step over one master connection kept open (`ControlMaster`), opened
    /// before the round.
    Shared,
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
        key: PathBuf,
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
        let shared = tempfile::tempdir()?;
        let host_key = std::fs::read_to_string(host.path("/etc/ssh/ssh_host_ed25519_key.pub"))?;
        std::fs::write(
            shared.path().join("known_hosts"),
            format!("{} {host_key}", host.addr()),
        )?;
        let mut ssh = Ssh {
            host,
            units,
            pids: Vec::new(),
            key,
            shared,
            master: None,
        };
        ssh.verify(0)?;
        ssh.open_master()?;
        Ok(ssh)
    }

    /// Per unit, one after another, each step its own `ssh`: the drop-in with
    /// round `round`'s `T`, `systemctl daemon-reload`, `systemctl restart`.
    pub fn round(&self, round: usize, how: Connection) -> anyhow::Result<Duration> {
        let conf = env_conf(&value(round));
        let started = Instant::now();
        for unit in &self.units {
            self.run(how, &format!("printf '%s' '{conf}' > {}", dropin(unit)))?;
            self.run(how, "systemctl daemon-reload")?;
            self.run(how, &format!("systemctl restart {unit}"))?;
        }
        Ok(started.elapsed())
    }

    /// `command` (one remote shell line) over `how`; it must succeed.
    fn run(&self, how: Connection, command: &str) -> anyhow::Result<()> {
        let Connection::Shared = how else {
            return ssh_ok(self.host, command);
        };
        let out = self
            .ssh(&["-o", "ControlMaster=no"])
            .args(["--", command])
            .stdin(Stdio::null())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "ssh (shared) {command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// `ssh` to the host with the fleet's key, its own host key and the master
    /// connection's socket, with `options` before the destination.
    fn ssh(&self, options: &[&str]) -> Command {
        let dir = self.shared.path();
        let mut ssh = Command::new("ssh");
        ssh.args(["-F", "/dev/null", "-i"])
            .arg(&self.key)
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("known_hosts").display()
            ))
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("ControlPath={}", dir.join("master").display()))
            .args(options)
            .arg(format!("root@{}", self.host.addr()));
        ssh
    }

    /// Opens the master connection (a child of this process, ended on drop) and waits
    /// until it answers.
    fn open_master(&mut self) -> anyhow::Result<()> {
        let master = self
            .ssh(&["-M", "-N"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.master = Some(master);
        wait_until("the shared ssh connection", READY, || {
            self.ssh(&["-O", "check"])
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
        });
        Ok(())
    }

    /// What each step of a round costs alone, the median of `tries` (not part of the
    /// rounds): an `ssh` doing nothing, the drop-in write, `daemon-reload`, `restart`.
    pub fn steps(&self, tries: usize, round: usize) -> anyhow::Result<[Duration; 4]> {
        let unit = &self.units[0];
        let conf = env_conf(&value(round));
        let steps = [
            "true".to_string(),
            format!("printf '%s' '{conf}' > {}", dropin(unit)),
            "systemctl daemon-reload".to_string(),
            format!("systemctl restart {unit}"),
        ];
        let mut medians = [Duration::ZERO; 4];
        for (step, median) in steps.iter().zip(&mut medians) {
            let mut all = Vec::new();
            for _ in 0..tries {
                let started = Instant::now();
                self.run(Connection::New, step)?;
                all.push(started.elapsed());
            }
            all.sort();
            *median = all[all.len() / 2];
        }
        Ok(medians)
    }

    pub fn verify(&mut self, round: usize) -> anyhow::Result<()> {
        self.pids = verify(self.host, &self.units, &self.pids, &value(round))?;
        Ok(())
    }
}

fn env_conf(value: &str) -> String {
    format!("[Service]\nEnvironment=T={value}\n")
}
