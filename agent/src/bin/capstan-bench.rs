//! `capstan-bench`: measures the agent's hot paths and reports each against a baseline
//! measured in the same run, as a ratio (absolute numbers vary with the machine; the
//! ratios are what to compare between builds).
//!
//! - `group-commit`: durable appends by N concurrent writers vs one writer at a time.
//! - `open`: reopening a long log with snapshots vs replaying it from scratch.
//! - `apply`: commands through the executor (log, fold, decisions) with a driver that
//!   does nothing, so the agent's own cost is measured; sequential vs spread over
//!   namespaces.

use capstan_agent::event::Event;
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::{Command, DriverKind, Op, Spec};
use capstan_driver::{Capabilities, Driver, DriverError, LaunchEnv, Observed, RevisionRef};
use clap::Parser;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "capstan-bench",
    about = "capstan agent benchmarks (ratios against an in-run baseline)"
)]
struct Args {
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
}

fn event(i: usize) -> Event {
    Event::NamespaceReady {
        command_id: format!("c{i}"),
        namespace: format!("n{}", i % 64),
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

async fn group_commit(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = Arc::new(Log::open(&dir.path().join("seq"), LogOptions::default())?);
    let t = Instant::now();
    for i in 0..args.appends {
        log.append_durable(&[event(i)]).await?;
    }
    let sequential = t.elapsed();

    let log = Arc::new(Log::open(&dir.path().join("con"), LogOptions::default())?);
    let t = Instant::now();
    let per = args.appends / args.writers;
    let tasks: Vec<_> = (0..args.writers)
        .map(|w| {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                for i in 0..per {
                    log.append_durable(&[event(w * per + i)]).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let concurrent = t.elapsed();
    println!(
        "group-commit  {} writers: {} appends in {} flushes",
        args.writers,
        per * args.writers,
        log.flushes()
    );
    let log = Arc::new(Log::open(&dir.path().join("mem"), LogOptions::default())?);
    let t = Instant::now();
    for i in 0..args.appends {
        log.append(&[event(i)])?;
    }
    let unflushed = t.elapsed();
    println!(
        "group-commit  appends without waiting for durability: {:>9.0}/s",
        rate(args.appends, unflushed)
    );
    let (a, b) = (
        rate(args.appends, sequential),
        rate(per * args.writers, concurrent),
    );
    println!("group-commit  1 writer: {a:>9.0} durable appends/s   {} writers: {b:>9.0}/s   ratio {:.1}x", args.writers, b / a);
    Ok(())
}

fn open(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("log");
    {
        let log = Log::open(&path, LogOptions::default())?;
        let batch: Vec<Event> = (0..1000).map(event).collect();
        for _ in 0..args.records / 1000 {
            log.append(&batch)?;
        }
        log.flush()?;
    }
    let t = Instant::now();
    let log = Log::open(&path, LogOptions::default())?;
    let with_snapshot = t.elapsed();
    let seq = log.last_seq();
    drop(log);
    let t = Instant::now();
    let log = Log::open(&path, LogOptions::default())?;
    let mut scratch = capstan_agent::intent::Intent::default();
    for r in log.read_since(0) {
        let r = r?;
        scratch.apply(r.seq, &r.event);
    }
    let full = t.elapsed();
    anyhow::ensure!(
        scratch == log.intent(),
        "snapshot intent differs from a full replay"
    );
    println!(
        "open          {seq} records: snapshot+tail {:>8.1} ms   full replay {:>8.1} ms   ratio {:.1}x faster",
        with_snapshot.as_secs_f64() * 1e3,
        full.as_secs_f64() * 1e3,
        full.as_secs_f64() / with_snapshot.as_secs_f64()
    );
    Ok(())
}

fn commands(n: usize, namespaces: usize) -> Vec<Command> {
    let mut out = Vec::new();
    for ns in 0..namespaces {
        out.push(Op::EnsureNamespace {
            namespace: format!("n{ns}"),
        });
    }
    let mut i = 0;
    while out.len() < n {
        let (namespace, workload, revision) = (
            format!("n{}", i % namespaces),
            format!("w{i}"),
            "r1".to_string(),
        );
        out.push(Op::PrepareRevision {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
            spec: Spec {
                driver: DriverKind::Sim,
                image: Some("app:1".into()),
                command: vec![],
                env: Default::default(),
                working_dir: None,
                mounts: vec![],
                ports: vec![],
                systemd: Default::default(),
            },
        });
        out.push(Op::ActivateRevision {
            namespace,
            workload,
            revision,
        });
        i += 1;
    }
    out.into_iter()
        .enumerate()
        .map(|(i, op)| Command {
            v: 1,
            id: format!("b{i}"),
            host: "bench".into(),
            issued_at: chrono::Utc::now(),
            op,
        })
        .collect()
}

async fn apply(args: &Args) -> anyhow::Result<()> {
    let mut rates = Vec::new();
    for namespaces in [1, 16] {
        let dir = tempfile::tempdir()?;
        let log = Arc::new(Log::open(&dir.path().join("log"), LogOptions::default())?);
        let driver = Arc::new(NullDriver);
        let executor = Arc::new(Executor::new("bench", log, driver));
        let cmds = commands(args.commands, namespaces);
        let (setup, rest) = cmds.split_at(namespaces);
        for c in setup {
            succeeded(&executor, c.clone()).await?;
        }
        let t = Instant::now();
        let tasks: Vec<_> = rest
            .chunks(rest.len().div_ceil(namespaces))
            .map(|chunk| {
                let (executor, chunk) = (Arc::clone(&executor), chunk.to_vec());
                tokio::spawn(async move {
                    for c in chunk {
                        succeeded(&executor, c).await?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        rates.push(rate(rest.len(), t.elapsed()));
    }
    println!(
        "apply         sequential: {:>9.0} commands/s   16 namespaces in parallel: {:>9.0}/s   ratio {:.1}x",
        rates[0],
        rates[1],
        rates[1] / rates[0]
    );
    Ok(())
}

/// Carries `command` out; a refusal is an error, since the benchmark would then measure
/// refusals (a spec naming another driver than the agent's, …) instead of work.
async fn succeeded(executor: &Executor, command: Command) -> anyhow::Result<()> {
    let r = executor.execute(command).await;
    anyhow::ensure!(
        r.outcome == capstan_common::Outcome::Succeeded,
        "a benchmark command did not succeed: {r:?}"
    );
    Ok(())
}

/// A driver that succeeds at once: the apply benchmark measures the agent, not a backend.
struct NullDriver;

#[async_trait::async_trait]
impl Driver for NullDriver {
    /// It stands in for the sim driver: the benchmark's specs name `sim`.
    fn kind(&self) -> capstan_common::DriverKind {
        capstan_common::DriverKind::Sim
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: false,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
        }
    }
    async fn ensure_namespace(&self, _: &str) -> Result<(), DriverError> {
        Ok(())
    }
    async fn delete_namespace(&self, _: &str) -> Result<(), DriverError> {
        Ok(())
    }
    async fn prepare(&self, _: RevisionRef<'_>, _: &Spec) -> Result<(), DriverError> {
        Ok(())
    }
    async fn activate(
        &self,
        _: RevisionRef<'_>,
        _: &Spec,
        _: &LaunchEnv,
        _: Option<&str>,
    ) -> Result<(), DriverError> {
        Ok(())
    }
    async fn start(&self, _: RevisionRef<'_>, _: &Spec, _: &LaunchEnv) -> Result<(), DriverError> {
        Ok(())
    }
    async fn resume(&self, _: RevisionRef<'_>) -> Result<(), DriverError> {
        Ok(())
    }
    async fn stop(&self, _: RevisionRef<'_>) -> Result<(), DriverError> {
        Ok(())
    }
    async fn retire(&self, _: RevisionRef<'_>) -> Result<(), DriverError> {
        Ok(())
    }
    async fn observe(&self) -> Result<Observed, DriverError> {
        Ok(Observed::default())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    group_commit(&args).await?;
    open(&args)?;
    apply(&args).await?;
    Ok(())
}
