//! `sim`: commands through the executor on the sim driver, on a host already holding
//! `--workloads` workloads vs an empty one. Each timed command touches one workload,
//! so the ratio shows what the host's size costs a command (1.0x: nothing).

use crate::{apply, rate, Args};
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::{Command, Op};
use capstan_driver::sim::{SimConfig, SimDriver};
use std::sync::Arc;
use std::time::Instant;

/// The timed commands: `n` of them, cycling prepare r(k+1) → activate r(k+1) →
/// retire r(k) on one workload of its own, so the host keeps its size while timed.
fn cycle(n: usize) -> Vec<Command> {
    let (namespace, workload) = ("n0".to_string(), "timed".to_string());
    let rev = |k: usize| format!("r{k}");
    let mut ops = Vec::with_capacity(n);
    let mut k = 0;
    while ops.len() < n {
        let (old, new) = (rev(k), rev(k + 1));
        ops.push(Op::PrepareRevision {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: new.clone(),
            spec: apply::spec(),
        });
        ops.push(Op::ActivateRevision {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: new,
        });
        if k > 0 {
            ops.push(Op::RetireRevision {
                namespace: namespace.clone(),
                workload: workload.clone(),
                revision: old,
            });
        }
        k += 1;
    }
    ops.truncate(n);
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| apply::command(format!("t{i}"), op))
        .collect()
}

/// Commands per second on a sim host holding `workloads` running workloads.
async fn measure(workloads: usize, timed: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let log = Arc::new(Log::open(&dir.path().join("log"), LogOptions::default())?);
    let driver = Arc::new(SimDriver::open(dir.path(), SimConfig::default())?);
    let executor = Executor::new("bench", log, driver);
    // Setup, not timed: the namespace and `workloads` prepared and activated.
    for c in apply::commands(1 + 2 * workloads, 1) {
        apply::succeeded(&executor, c).await?;
    }
    let t = Instant::now();
    for c in cycle(timed) {
        apply::succeeded(&executor, c).await?;
    }
    Ok(rate(timed, t.elapsed()))
}

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let empty = measure(0, args.commands).await?;
    let full = measure(args.workloads, args.commands).await?;
    println!(
        "sim           empty host: {empty:>9.0} commands/s   {} workloads: {full:>9.0}/s   ratio {:.2}x",
        args.workloads,
        full / empty
    );
    Ok(())
}
