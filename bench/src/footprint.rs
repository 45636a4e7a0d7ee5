//! `footprint`: an idle `capstan-agent run` (the binary next to this one) holding
//! `--idle-workloads` running workloads, on the sim driver and then on the docker
//! driver (`$CAPSTAN_TEST_DOCKER_HOST`, as `.ci/services.sh` exports it; skipped
//! without it): its resident memory (`VmRSS`, and the peak `VmHWM`) and the CPU it
//! uses (utime + stime from `/proc/<pid>/stat`) over `--idle-secs` of doing nothing
//! after it said it was ready. No baseline: the target is absolute (< 20 MB, ~0 % CPU).

use crate::cpu;
use crate::roundtrip::round;
use crate::Args;
use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::command::Spec;
use capstan_tests::docker::{serve, Engine};
use serde_json::json;
use std::time::{Duration, Instant};

pub fn run(args: &Args) -> anyhow::Result<()> {
    let idle = Duration::from_secs(args.idle_secs);
    measure(
        "sim",
        Agent::builder("footprint-sim"),
        |_| Spec::sim(),
        args,
        idle,
    )?;
    if std::env::var_os("CAPSTAN_TEST_DOCKER_HOST").is_none() {
        println!("footprint     docker skipped: CAPSTAN_TEST_DOCKER_HOST is not set (eval \"$(.ci/services.sh)\")");
        return Ok(());
    }
    let host = capstan_tests::unique("footprint-docker");
    let builder = Agent::builder(&host).docker(Engine::Dockerd);
    measure("docker", builder, serve, args, idle)
}

fn measure(
    driver: &str,
    builder: AgentBuilder,
    spec: fn(&str) -> Spec,
    args: &Args,
    idle: Duration,
) -> anyhow::Result<()> {
    let agent = builder.build();
    let names: Vec<String> = (0..args.idle_workloads).map(|w| format!("w{w}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    agent.apply_ok(&agent.commands("idle").rollout(&names, "r1", spec));
    let daemon = agent.run();
    let pid = daemon.id();
    let ticks = cpu::ticks_per_second()?;
    let (cpu0, t0) = (cpu::ticks(pid)?, Instant::now());
    std::thread::sleep(idle);
    let (cpu1, elapsed) = (cpu::ticks(pid)?, t0.elapsed());
    let (rss, hwm) = (status_kib(pid, "VmRSS:")?, status_kib(pid, "VmHWM:")?);
    let threads = status_kib(pid, "Threads:")?;
    daemon.stop();
    let cpu_pct = (cpu1 - cpu0) as f64 / ticks / elapsed.as_secs_f64() * 100.0;
    let rss_mb = rss as f64 / 1024.0;
    println!(
        "{}",
        json!({
            "bench": "footprint",
            "driver": driver,
            "workloads": args.idle_workloads,
            "idle_secs": round(elapsed.as_secs_f64()),
            "rss_mib": round(rss_mb),
            "peak_rss_mib": round(hwm as f64 / 1024.0),
            "threads": threads,
            "cpu_percent": round(cpu_pct),
            "cpu_ticks": cpu1 - cpu0,
            "baseline": null,
            "target": "rss < 20 MiB, cpu ~0 %",
            "met": rss_mb < 20.0 && cpu_pct < 0.5,
        })
    );
    Ok(())
}

/// A `Name:  value kB` line of `/proc/<pid>/status`, as a number.
fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .ok_or_else(|| anyhow::anyhow!("no {key} in /proc/{pid}/status"))?;
    let value = line.split_whitespace().next().unwrap_or_default();
    Ok(value.parse()?)
}
