//! `fleet-systemd`: an env change + restart of `--units` systemd units on one fleet
//! host (a real Debian host of the test harness's [`Fleet`], systemd as its PID 1,
//! reached over SSH), through capstan vs over SSH with `systemctl`, one unit after
//! another, as the seeds' SSH driver did. Both sides run on the same host in the same
//! run, alternating round by round.
//!
//! - **capstan** ([`capstan`]): the agent package (`.deb` of the binaries next to
//!   this one) installed on the host with `driver = "systemd"`, joined to a nats-server
//!   on the fleet's hub and a coordinator. Each workload's env lives in its revision's
//!   spec, so an operator's env change is a new revision: per workload,
//!   `prepare_revision` r(k) with the new `T` and `activate_revision` r(k) (which
//!   starts it and stops r(k−1)), POSTed to the coordinator, timed until the
//!   coordinator reports every command succeeded (`…/wait`). Workloads are spread
//!   over `--namespaces` namespaces (default: one each): the agent runs commands of
//!   different namespaces concurrently, those of one namespace in order. r(k−1) is
//!   retired after the round, not timed, so the host keeps its size.
//! - **ssh** ([`ssh`]), the baseline: twin units (capstan's unit file, hardening and
//!   all, without its markers), and per unit, one after another, each step a new
//!   `ssh` connection with the fleet's key: write the env drop-in, `systemctl
//!   daemon-reload`, `systemctl restart`.
//!
//! After every round (not timed), every unit of that side must be active with a new
//! main PID whose environment holds the round's `T`.

mod capstan;
mod ssh;

use crate::Args;
use capstan_tests::fleet::{Fleet, FleetHost};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// Why the measurement cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    crate::needs::root_and_tools(
        "it boots a fleet host in namespaces of its own",
        &[
            "unshare",
            "nsenter",
            "setpriv",
            "ssh",
            "ssh-keygen",
            "dpkg-deb",
        ],
    )
}

pub fn run(args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    if let Some(why) = unavailable() {
        println!("fleet-systemd skipped: {why}");
        return Ok(());
    }
    let namespaces = match args.namespaces {
        0 => args.units,
        n => n.min(args.units),
    };
    let fleet = Fleet::create();
    let host = fleet.boot("bench-1");
    let agent_build = capstan_tests::bin_dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut capstan = capstan::Capstan::set_up(&fleet, &host, runtime, args.units, namespaces)?;
    let mut ssh = ssh::Ssh::set_up(&host, &capstan.unit_text()?, args.units)?;
    eprintln!(
        "fleet-systemd: host {} ({}) ready: {} capstan workloads in {namespaces} namespaces \
         (agent: the {agent_build} build), {} twin units",
        host.name(),
        host.addr(),
        args.units,
        args.units
    );

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        // Each side after the host has settled (heartbeats, progress writes).
        std::thread::sleep(Duration::from_secs(2));
        let took = capstan.round(runtime, round)?;
        capstan.verify(round)?;
        capstan.retire(runtime, round - 1)?;
        std::thread::sleep(Duration::from_secs(2));
        let took_ssh = ssh.round(round)?;
        ssh.verify(round)?;
        if !args.json {
            println!(
                "fleet-systemd round {round}: capstan {:>8.1} ms   ssh + systemctl {:>8.1} ms   \
                 {:.1}x",
                ms(took),
                ms(took_ssh),
                ratio(took_ssh, took)
            );
        }
        ours.push(took);
        theirs.push(took_ssh);
    }
    let (capstan_ms, ssh_ms) = (median(&ours), median(&theirs));
    let report = json!({
        "bench": "fleet-systemd",
        "units": args.units,
        "namespaces": namespaces,
        "rounds": args.rounds,
        "agent_build": agent_build,
        "capstan": {
            "what": "per unit prepare_revision (new T) + activate_revision through the coordinator, \
                     namespaces concurrently, until every command is reported succeeded",
            "rounds_ms": ours.iter().map(|d| round2(ms(*d))).collect::<Vec<_>>(),
            "median_ms": round2(capstan_ms),
        },
        "baseline": {
            "what": "per unit, one after another, each a new ssh connection: write the env \
                     drop-in, systemctl daemon-reload, systemctl restart",
            "rounds_ms": theirs.iter().map(|d| round2(ms(*d))).collect::<Vec<_>>(),
            "median_ms": round2(ssh_ms),
        },
        "ratio": round2(ssh_ms / capstan_ms),
        "target": "ratio >= 10",
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "fleet-systemd env change + restart of {} units ({namespaces} namespaces), median \
             of {}: capstan {capstan_ms:.1} ms   ssh + systemctl {ssh_ms:.1} ms   ratio {:.1}x \
             (target 10x; agent: {agent_build} build)",
            args.units,
            args.rounds,
            ssh_ms / capstan_ms
        );
    }
    capstan.stop();
    host.kill();
    Ok(())
}

/// A unit's state on the host: its `ActiveState`, main PID and that process's env.
struct Running {
    active: String,
    pid: u32,
    env: Vec<String>,
}

fn running(host: &FleetHost<'_>, unit: &str) -> anyhow::Result<Running> {
    let active = host.property(unit, "ActiveState");
    let pid: u32 = host.property(unit, "MainPID").parse()?;
    let out = host.nsenter(&["cat", &format!("/proc/{pid}/environ")]);
    let env = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .map(str::to_string)
        .collect();
    Ok(Running { active, pid, env })
}

/// Checks each of `units` runs with `T=value` in a process other than the one in
/// `before` (same order, empty at setup); returns their main PIDs.
fn verify(
    host: &FleetHost<'_>,
    units: &[String],
    before: &[u32],
    value: &str,
) -> anyhow::Result<Vec<u32>> {
    let want = format!("T={value}");
    let mut pids = Vec::new();
    for (i, unit) in units.iter().enumerate() {
        let now = running(host, unit)?;
        anyhow::ensure!(
            now.active == "active" && now.pid != 0 && before.get(i) != Some(&now.pid),
            "{unit}: {} with main PID {} (before: {:?})",
            now.active,
            now.pid,
            before.get(i)
        );
        anyhow::ensure!(
            now.env.contains(&want),
            "{unit} (PID {}) has no {want} in its env: {:?}",
            now.pid,
            now.env
        );
        pids.push(now.pid);
    }
    Ok(pids)
}

/// The value of `T` in round `round` (0: setup).
fn value(round: usize) -> String {
    format!("round-{round}")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(slow: Duration, fast: Duration) -> f64 {
    slow.as_secs_f64() / fast.as_secs_f64()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The median in milliseconds.
fn median(times: &[Duration]) -> f64 {
    let mut all = times.to_vec();
    all.sort();
    ms(all[all.len() / 2])
}

/// Writes `text` at `path` inside the host (setup only: not what is timed).
fn write(host: &FleetHost<'_>, path: &str, text: &str) -> anyhow::Result<()> {
    let at = host.path(path);
    if let Some(dir) = at.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&at, text)
        .map_err(|e| anyhow::anyhow!("write {}: {e}", Path::new(path).display()))
}
