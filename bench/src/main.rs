//! `capstan-bench`: measures the agent's hot paths and the systemd driver, and reports
//! each against a baseline measured in the same run, as a ratio (absolute numbers vary
//! with the machine; the ratios are what to compare between builds). How to run each
//! and the figures so far: `docs/benchmarks.md`.
//!
//! - `group-commit` ([`group_commit`]): durable appends by N concurrent writers vs one
//!   writer at a time.
//! - `open` ([`open`]): reopening a long log with snapshots vs replaying it from scratch.
//! - `apply` ([`apply`]): commands through the executor (log, fold, decisions) with a
//!   driver that does nothing, so the agent's own cost is measured; sequential vs
//!   spread over namespaces.
//! - `sim` ([`sim`]): commands through the executor on the sim driver, on a host
//!   holding `--workloads` workloads vs an empty one: what the host's size costs.
//! - `systemd` ([`systemd`]): an env change and restart of N units on one real systemd
//!   through the systemd driver vs a `systemctl` script doing the same one unit after
//!   another. Needs root and `/usr/lib/systemd/systemd`; skipped (with the reason)
//!   without them.
//! - `fleet-systemd` ([`fleet_systemd`]): an env change and restart of N units on one
//!   fleet host (a real Debian host booted by the test harness) through capstan (the
//!   agent package with the systemd driver, a coordinator, NATS) vs `ssh` + `systemctl`
//!   one unit after another. Needs root; skipped (with the reason) without it.
//! - `roundtrip` ([`roundtrip`]): submit → wait through the HTTP API vs the raw NATS +
//!   log chain under it.
//! - `throughput` ([`throughput`]): commands/s to one sim agent over NATS across 16
//!   namespaces vs the raw pipelined chain on the same nats-server ([`pipelined`]),
//!   with the CPU each process used a command.
//! - `reads` ([`reads`]): command status and `events?since` as a host's history grows
//!   to `--history` records; the smallest size is the baseline.
//! - `fanout` ([`fanout`]): one command to each of `--hosts` simulated hosts
//!   (`capstan-agent sim-fleet`) until all results are back, vs one command to one host.
//! - `log-append` ([`log_append`]): durable appends/s by 16 writers vs raw sled
//!   insert + flush of the same bytes by 16 threads.
//! - `replay` ([`replay`]): opening a 1,000,000-record log ([`million`]) vs raw sled
//!   open + scan.
//! - `query` ([`query`]): by workload, command id and time range on that log, and the
//!   CLI, vs a raw full scan.
//! - `docker` ([`docker`]): `--units` revisions prepared and activated through the
//!   executor and the docker driver vs as many `docker run -d` on the same engine
//!   (`$DOCKER_HOST`), with the engine requests each costs. Skipped (with the
//!   reason) without an engine socket or the `docker` CLI.
//! - `vm` ([`vm`]): `--units` revisions prepared and activated through the executor
//!   and the VM driver vs as many plain `qemu-system-x86_64 -daemonize` launches of the
//!   same guest (TCG). Skipped (with the reason) without QEMU or the test guest
//!   (`$CAPSTAN_VM_GUEST_DIR`).
//! - `footprint` ([`footprint`]): an idle `capstan-agent run` holding
//!   `--idle-workloads` workloads (sim, then docker): resident memory and CPU over
//!   `--idle-secs`.
//! - `fleet` ([`fleet`]), only when named: a three-step rollout (`capstan rollout`)
//!   to each of `--fleet-sizes` simulated hosts over a three-node JetStream cluster,
//!   with the coordinator's CPU and memory and every host's heartbeats; the smallest
//!   size, scaled linearly, is the baseline.
//!
//! The control-path measurements start their own nats-server, coordinator and agents
//! (the release binaries next to this one, built as [`BUILD`] says; an agent with the
//! test builds' fault seams is refused).
//!
//! `--smoke` ([`smoke`]) runs every measurement once at tiny sizes, judging no figure:
//! CI runs it (the e2e test `bench::smoke_runs_every_measurement_once`) so that a
//! benchmark that no longer runs is noticed. A measurement that fails does not stop
//! the others; the exit status says whether any did.
//!
//! Run under the name `capstan-envdump`, this binary is that workload
//! ([`capstan_tests::envdump`]): the systemd measurement's units run a copy of it, so
//! a release build needs nothing else built.

mod apply;
mod cpu;
mod docker;
mod engine_proxy;
mod fanout;
mod fleet;
mod fleet_systemd;
mod footprint;
mod group_commit;
mod log_append;
mod million;
mod needs;
mod open;
mod pipelined;
mod query;
mod reads;
mod replay;
mod roundtrip;
mod sim;
mod smoke;
mod stack;
mod systemd;
mod throughput;
mod vm;

use capstan_agent::event::Event;
use clap::{Parser, ValueEnum};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "capstan-bench",
    about = "capstan benchmarks (ratios against an in-run baseline; see docs/benchmarks.md)"
)]
pub struct Args {
    /// Run only these measurements (repeatable, or a comma list); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Measurement>,
    /// Appends per group-commit measurement.
    #[arg(long, default_value_t = 2000)]
    appends: usize,
    /// Concurrent writers for the group-commit measurement.
    #[arg(long, default_value_t = 32)]
    writers: usize,
    /// Records in the log for the open measurement.
    #[arg(long, default_value_t = 50_000)]
    records: u64,
    /// Commands for the apply measurement.
    #[arg(long, default_value_t = 2000)]
    commands: usize,
    /// Workloads already on the sim host in the sim measurement.
    #[arg(long, default_value_t = 1000)]
    workloads: usize,
    /// Units restarted per round in the systemd measurement; revisions activated per
    /// round in the docker measurement.
    #[arg(long, default_value_t = 20)]
    units: usize,
    /// Rounds of the systemd and docker measurements (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Namespaces the fleet-systemd workloads are spread over (0: one per unit).
    #[arg(long, default_value_t = 0)]
    namespaces: usize,
    /// Print the fleet-systemd report as one JSON line (the others always do or never).
    #[arg(long)]
    json: bool,
    /// Commands measured one at a time in the roundtrip measurement.
    #[arg(long, default_value_t = 200)]
    roundtrips: usize,
    /// The largest host history (records) of the reads measurement.
    #[arg(long, default_value_t = 100_000)]
    history: u64,
    /// Simulated hosts in the fanout measurement.
    #[arg(long, default_value_t = 500)]
    hosts: usize,
    /// Fleet sizes of the fleet measurement, smallest first (a comma list).
    #[arg(long, value_delimiter = ',', default_values_t = [1000, 2000, 5000, 10_000])]
    fleet_sizes: Vec<usize>,
    /// Simulated hosts per `sim-fleet` process in the fleet measurement.
    #[arg(long, default_value_t = 2500)]
    fleet_per_process: usize,
    /// Seconds a step of the fleet measurement's rollout may take before the size
    /// counts as failed (past the target, to see how long it takes).
    #[arg(long, default_value_t = 120)]
    fleet_step_timeout: u64,
    /// Records in the large log of the replay and query measurements.
    #[arg(long, default_value_t = 1_000_000)]
    log_records: u64,
    /// Workloads the large log's records are spread over.
    #[arg(long, default_value_t = 1000)]
    log_workloads: usize,
    /// Running workloads the idle agent of the footprint measurement holds.
    #[arg(long, default_value_t = 20)]
    idle_workloads: usize,
    /// Seconds the footprint measurement watches the idle agent.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Every measurement once (`fleet` too) at tiny sizes, replacing the sizes above;
    /// figures printed, none judged; a test build's agent is accepted.
    #[arg(long)]
    smoke: bool,
}

/// The measurements, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Measurement {
    GroupCommit,
    Open,
    Apply,
    Sim,
    Systemd,
    FleetSystemd,
    Roundtrip,
    Throughput,
    Reads,
    Fanout,
    LogAppend,
    Replay,
    Query,
    Docker,
    Vm,
    Footprint,
    Fleet,
}

pub fn event(i: usize) -> Event {
    Event::NamespaceReady {
        command_id: format!("c{i}"),
        namespace: format!("n{}", i % 64),
    }
}

pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// How the binaries the benchmarks run are built: as the package builds them, without
/// the test builds' fault seams.
const BUILD: &str =
    "cargo build --release -p capstan-agent -p capstan-coordinator -p capstan-bench --bins";

/// Refuses to measure an agent with the fault-injection seams (feature `testing`, its
/// `--version`'s third line): the benchmarks measure what ships. (`cargo build
/// --workspace` builds one: it unifies the e2e tests' dev-dependency features.)
fn shipped_agent() -> anyhow::Result<()> {
    let agent = std::env::current_exe()?.with_file_name("capstan-agent");
    anyhow::ensure!(agent.exists(), "{} is missing: {BUILD}", agent.display());
    anyhow::ensure!(
        !capstan_tests::agent::has_fault_seams(&agent),
        "{} is a test build (its --version says `testing seams: on`); the benchmarks \
         measure what ships: {BUILD}",
        agent.display()
    );
    Ok(())
}

/// On SIGINT or SIGTERM: kills every process the run started (servers, agents,
/// coordinators, fleets, booted hosts: `capstan_tests::process::kill_children`) and
/// exits 128 + the signal's number, without waiting for the measurement in progress.
/// Its temporary directories stay, and so do containers a `docker` run made (named
/// after the run's host name, `docs/benchmarks.md`).
fn stop_on_signals(rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Registered here, before any child starts; heard on the runtime's workers
    // whatever the main thread is doing.
    let (mut int, mut term) = rt.block_on(async {
        anyhow::Ok((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    rt.spawn(async move {
        let number = tokio::select! {
            _ = int.recv() => 2, // SIGINT
            _ = term.recv() => 15, // SIGTERM
        };
        let killed = capstan_tests::process::kill_children();
        eprintln!(
            "capstan-bench: signal {number}: killed the {killed} processes it started; exiting"
        );
        std::process::exit(128 + number);
    });
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let called = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&called)
        .file_name()
        .is_some_and(|n| n == "capstan-envdump")
    {
        capstan_tests::envdump::main();
    }
    let mut args = Args::parse();
    if args.smoke {
        smoke::shrink(&mut args);
    }
    anyhow::ensure!(
        args.units > 0 && args.rounds > 0 && args.roundtrips > 0,
        "--units, --rounds and --roundtrips must be at least 1"
    );
    anyhow::ensure!(args.history >= 1_000, "--history must be at least 1000");
    anyhow::ensure!(args.hosts > 0, "--hosts must be at least 1");
    anyhow::ensure!(
        !args.fleet_sizes.is_empty() && args.fleet_sizes.iter().all(|&n| n > 0),
        "--fleet-sizes must list sizes of at least 1"
    );
    anyhow::ensure!(
        args.log_workloads > 0 && args.log_records >= 10_000,
        "--log-workloads must be at least 1 and --log-records at least 10000"
    );
    anyhow::ensure!(args.commands > 16, "--commands must be more than 16");
    // A smoke run judges no figure: the e2e tests' build (with the fault seams) will do.
    if !args.smoke {
        shipped_agent()?;
    }
    // Not a test: its runs are as long as they need (the harness's per-test clock).
    capstan_tests::watchdog::off();
    let runtime = tokio::runtime::Runtime::new()?;
    stop_on_signals(&runtime)?;
    let rt = &runtime;
    let args = &args;
    let wanted = |m| args.only.is_empty() || args.only.contains(&m);
    let mut runner = smoke::Runner::default();
    if wanted(Measurement::GroupCommit) {
        runner.run("group-commit", || rt.block_on(group_commit::run(args)));
    }
    if wanted(Measurement::Open) {
        runner.run("open", || open::run(args));
    }
    if wanted(Measurement::Apply) {
        runner.run("apply", || rt.block_on(apply::run(args)));
    }
    if wanted(Measurement::Sim) {
        runner.run("sim", || rt.block_on(sim::run(args)));
    }
    if wanted(Measurement::Systemd) {
        runner.run("systemd", || systemd::run(args, rt));
    }
    if wanted(Measurement::FleetSystemd) {
        runner.run("fleet-systemd", || fleet_systemd::run(args, rt));
    }
    if wanted(Measurement::Roundtrip) {
        runner.run("roundtrip", || rt.block_on(roundtrip::run(args)));
    }
    if wanted(Measurement::Throughput) {
        runner.run("throughput", || rt.block_on(throughput::run(args)));
    }
    if wanted(Measurement::Reads) {
        runner.run("reads", || rt.block_on(reads::run(args)));
    }
    if wanted(Measurement::Fanout) {
        runner.run("fanout", || rt.block_on(fanout::run(args)));
    }
    if wanted(Measurement::LogAppend) {
        runner.run("log-append", || rt.block_on(log_append::run(args)));
    }
    if wanted(Measurement::Replay) || wanted(Measurement::Query) {
        match million::Million::build(args) {
            Ok(log) => {
                if wanted(Measurement::Replay) {
                    runner.run("replay", || replay::run(&log));
                }
                if wanted(Measurement::Query) {
                    runner.run("query", || query::run(&log));
                }
            }
            Err(e) => runner.run("replay", || Err(e.context("building the large log"))),
        }
    }
    if wanted(Measurement::Docker) {
        runner.run("docker", || rt.block_on(docker::run(args)));
    }
    if wanted(Measurement::Vm) {
        runner.run("vm", || rt.block_on(vm::run(args)));
    }
    if wanted(Measurement::Footprint) {
        runner.run("footprint", || footprint::run(args));
    }
    // Only when named, or in a smoke run (at its tiny sizes).
    if (args.smoke && args.only.is_empty()) || args.only.contains(&Measurement::Fleet) {
        runner.run("fleet", || rt.block_on(fleet::run(args)));
    }
    runner.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn only_takes_a_comma_list_and_repeats_and_defaults_to_all() {
        Args::command().debug_assert();
        let args =
            Args::try_parse_from(["capstan-bench", "--only", "open,systemd", "--only", "apply"])
                .unwrap();
        assert!(args.only == [Measurement::Open, Measurement::Systemd, Measurement::Apply]);
        let args = Args::try_parse_from(["capstan-bench", "--only", "group-commit"]).unwrap();
        assert!(args.only == [Measurement::GroupCommit]);
        assert!(Args::try_parse_from(["capstan-bench"])
            .unwrap()
            .only
            .is_empty());
        let args = Args::try_parse_from(["capstan-bench", "--only", "docker"]).unwrap();
        assert!(args.only == [Measurement::Docker]);
        let Err(err) = Args::try_parse_from(["capstan-bench", "--only", "dockers"]) else {
            panic!("--only dockers was accepted");
        };
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue, "{err}");
    }
}
