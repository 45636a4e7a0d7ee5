//! `throughput`: commands per second to one sim agent over NATS, spread over 16
//! namespaces — signed commands published straight to `CAPSTAN_CMD`, until every
//! result is back in `capstan_results` — against the executor alone with the same
//! sim driver and the same commands, in process, measured in the same run.

use crate::apply::commands;
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
    let baseline = in_process(&all).await?;
    let stack = Stack::start(&["tp"]);
    let publisher = Publisher::new(&stack, "tp").await?;
    let over_nats: Vec<Command> = all
        .iter()
        .map(|c| publisher.command(format!("tp-{}", c.id), c.op.clone()))
        .collect();
    let (setup, rest) = over_nats.split_at(NAMESPACES);
    publisher.run(setup, Duration::from_secs(60)).await?;
    let took = publisher.run(rest, Duration::from_secs(600)).await?;
    stack.stop();
    let nats = rate(rest.len(), took);
    println!(
        "{}",
        json!({
            "bench": "throughput",
            "commands": rest.len(),
            "namespaces": NAMESPACES,
            "commands_per_s": nats.round(),
            "baseline": {
                "what": "the executor in process, same sim driver, same commands",
                "commands_per_s": baseline.round(),
            },
            "ratio": round(nats / baseline),
            "target": "commands_per_s >= 2000 and ratio >= 0.7",
        })
    );
    Ok(())
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
        let n: usize = c.op.namespace().unwrap_or_default()[1..].parse()?;
        lanes[n].push(c.clone());
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
