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
//!   daemon-reload`, `systemctl restart`. The same steps over one `ssh` master
//!   connection opened beforehand (`ControlMaster`) are measured too: what the
//!   connections cost.
//!
//! After every round (not timed), every unit of that side must be active with a new
//! main PID whose environment holds the round's `T`.

mod capstan;
mod ssh;
mod timeline;

use crate::Args;
use capstan_tests::fleet::{Fleet, FleetHost};
use serde_json::json;
use ssh::Connection;
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
    let mut ssh = ssh::Ssh::set_up(&host, fleet.key(), &capstan.unit_text()?, args.units)?;
    eprintln!(
        "fleet-systemd: host {} ({}) ready: {} capstan workloads in {namespaces} namespaces \
         (agent: the {agent_build} build), {} twin units",
        host.name(),
        host.addr(),
        args.units,
        args.units
    );

    let (mut ours, mut fresh, mut shared, mut timelines) = (vec![], vec![], vec![], vec![]);
    for round in 1..=args.rounds {
        // Each side after the host has settled (heartbeats, progress writes).
        std::thread::sleep(Duration::from_secs(2));
        let took = capstan.round(runtime, round)?;
        capstan.verify(round)?;
        let timeline = capstan.timeline(runtime, round)?;
        capstan.retire(runtime, round - 1)?;
        std::thread::sleep(Duration::from_secs(2));
        let took_fresh = ssh.round(round, Connection::New)?;
        ssh.verify(round)?;
        // The shared connection's round sets the same value again: a new one.
        std::thread::sleep(Duration::from_secs(2));
        let took_shared = ssh.round(args.rounds + round, Connection::Shared)?;
        ssh.verify(args.rounds + round)?;
        if !args.json {
            println!(
                "fleet-systemd round {round}: capstan {:>8.1} ms   ssh + systemctl {:>8.1} ms \
                 ({:.1}x)   over one shared ssh connection {:>8.1} ms ({:.1}x)",
                ms(took),
                ms(took_fresh),
                ratio(took_fresh, took),
                ms(took_shared),
                ratio(took_shared, took),
            );
            println!(
                "fleet-systemd   capstan from the agent's log: first command in +{:.1} ms, \
                 prepare p50 {:.1} ms, activate p50 {:.1} ms (max {:.1}), last done +{:.1} ms, \
                 all reported +{:.1} ms",
                timeline.first_received,
                timeline.prepare_p50,
                timeline.activate_p50,
                timeline.activate_max,
                timeline.last_completed,
                ms(took)
            );
        }
        ours.push(took);
        fresh.push(took_fresh);
        shared.push(took_shared);
        timelines.push(timeline);
    }
    let (capstan_ms, fresh_ms, shared_ms) = (median(&ours), median(&fresh), median(&shared));
    // The script's steps alone, with the drop-in of the last round (nothing changes).
    let steps = ssh.steps(5, 2 * args.rounds)?.map(|d| round2(ms(d)));
    let all = |times: &[Duration]| times.iter().map(|d| round2(ms(*d))).collect::<Vec<_>>();
    let report = json!({
        "bench": "fleet-systemd",
        "units": args.units,
        "namespaces": namespaces,
        "rounds": args.rounds,
        "agent_build": agent_build,
        "capstan": {
            "what": "per unit prepare_revision (new T) + activate_revision through the coordinator, \
                     namespaces concurrently, until every command is reported succeeded",
            "rounds_ms": all(&ours),
            "median_ms": round2(capstan_ms),
            "agent_log_ms": timelines.iter().map(|t| json!({
                "first_received": round2(t.first_received), "prepare_p50": round2(t.prepare_p50),
                "activate_p50": round2(t.activate_p50), "activate_max": round2(t.activate_max),
                "last_completed": round2(t.last_completed)})).collect::<Vec<_>>(),
        },
        "baseline": {
            "what": "per unit, one after another, each a new ssh connection: write the env \
                     drop-in, systemctl daemon-reload, systemctl restart",
            "rounds_ms": all(&fresh),
            "median_ms": round2(fresh_ms),
            "steps_median_of_5_ms": {"ssh_true": steps[0], "write_dropin": steps[1],
                "daemon_reload": steps[2], "restart": steps[3]},
        },
        "ratio": round2(fresh_ms / capstan_ms),
        "target": "ratio >= 10",
        "shared_connection": {
            "what": "the baseline's steps over one ssh master connection (ControlMaster)",
            "rounds_ms": all(&shared),
            "median_ms": round2(shared_ms),
            "ratio": round2(shared_ms / capstan_ms),
        },
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "fleet-systemd env change + restart of {} units ({namespaces} namespaces), median \
             of {}: capstan {capstan_ms:.1} ms   ssh + systemctl {fresh_ms:.1} ms   ratio {:.1}x \
             (target 10x; agent: {agent_build} build)   over one shared ssh connection \
             {shared_ms:.1} ms ({:.1}x)",
            args.units,
            args.rounds,
            fresh_ms / capstan_ms,
            shared_ms / capstan_ms
        );
        println!(
            "fleet-systemd one ssh step (median of 5): ssh true {:.1} ms   drop-in write {:.1} ms   \
             daemon-reload {:.1} ms   restart {:.1} ms",
            steps[0], steps[1], steps[2], steps[3]
        );
    }
    drop(ssh);
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
