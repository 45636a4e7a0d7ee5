//! `throughput`: commands per second to one sim agent over NATS, spread over 16
//! namespaces — signed commands published straight to `CAPSTAN_COMMANDS`, until every
//! result is back in `capstan_results` — against the raw pipelined chain on the same
//! nats-server, with the same bodies, at the same concurrency ([`crate::pipelined`]),
//! measured in the same run; the CPU each process used a command on both sides; and,
//! for reference, the executor alone with the same sim driver and commands in process.

use crate::apply::commands;
use crate::cpu::Meter;
use crate::pipelined::{self, Item};
use crate::roundtrip::round;
use crate::stack::{Publisher, Stack};
use crate::{rate, Args};
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::Command;
use capstan_driver::sim::{SimConfig, SimDriver};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NAMESPACES: usize = 16;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let all = commands(args.commands, NAMESPACES);
    let in_process = in_process(&all).await?;
    let stack = Stack::start(&["tp"]);
    let publisher = Publisher::new(&stack, "tp").await?;
    let over_nats: Vec<Command> = all
        .iter()
        .map(|c| publisher.command(format!("tp-{}", c.id), c.op.clone()))
        .collect();
    let (setup, rest) = over_nats.split_at(NAMESPACES);
    publisher.run(setup, Duration::from_secs(60)).await?;
    let nats_pid = stack.server.pid();
    let meter = Meter::start(&[
        ("agent", stack.agent_pid(0)),
        ("nats_server", nats_pid),
        ("client", std::process::id()),
    ])?;
    let took = publisher.run(rest, Duration::from_secs(600)).await?;
    let cpu = meter.per(rest.len())?;
    // The same bodies through the raw chain, on the same server, with capstan idle.
    let items: Vec<Item> = over_nats
        .iter()
        .map(|c| Item {
            lane: namespace_number(c),
            body: publisher.body(c).into_bytes(),
        })
        .collect();
    let meter = Meter::start(&[
        ("nats_server", nats_pid),
        ("chain_and_client", std::process::id()),
    ])?;
    let chain_took =
        pipelined::run(stack.connect().await?, &items, Duration::from_secs(600)).await?;
    let chain_cpu = meter.per(rest.len())?;
    stack.stop();
    let nats = rate(rest.len(), took);
    let chain = rate(rest.len(), chain_took);
    println!(
        "{}",
        json!({
            "bench": "throughput",
            "commands": rest.len(),
            "namespaces": NAMESPACES,
            "commands_per_s": nats.round(),
            "cpu_ms_per_command": cpu,
            "baseline": {
                "what": "the raw pipelined chain on the same nats-server, same bodies, 16 lanes: JetStream publish+ack, pull (max_ack_pending 16), a sled append in group-committed batches, ack, result published in rounds, its receipt",
                "commands_per_s": chain.round(),
                "cpu_ms_per_command": chain_cpu,
            },
            "ratio": round(nats / chain),
            "in_process": {
                "what": "the executor in process, same sim driver, same commands",
                "commands_per_s": in_process.round(),
                "ratio": round(nats / in_process),
            },
            "target": "commands_per_s >= 2000 and ratio >= 0.7",
        })
    );
    Ok(())
}

/// `n<k>` → k: the namespace's lane.
fn namespace_number(c: &Command) -> usize {
    c.op.namespace()
        .and_then(|n| n.get(1..))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The executor's rate on `all` (the first [`NAMESPACES`] make the namespaces ready,
/// unmeasured), one task per namespace.
async fn in_process(all: &[Command]) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let log = Arc::new(Log::open(&dir.path().join("log"), LogOptions::default())?);
    let driver = Arc::new(SimDriver::open(dir.path(), SimConfig::default())?);
    let executor = Arc::new(Executor::new("bench", log, driver));
    let (setup, rest) = all.split_at(NAMESPACES);
    for c in setup {
        crate::apply::succeeded(&executor, c.clone()).await?;
    }
    let t = Instant::now();
    let mut lanes: Vec<Vec<Command>> = vec![Vec::new(); NAMESPACES];
    for c in rest {
        lanes[namespace_number(c)].push(c.clone());
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            let executor = Arc::clone(&executor);
            tokio::spawn(async move {
                for c in lane {
                    crate::apply::succeeded(&executor, c).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(rate(rest.len(), t.elapsed()))
}
