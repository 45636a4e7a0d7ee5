//! `apply`: commands through the executor (log, fold, decisions) with a driver that
//! does nothing, so the agent's own cost is measured; sequential vs spread over
//! namespaces.

use crate::{rate, Args};
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::{Command, DriverKind, Op, Spec};
use capstan_driver::{Capabilities, Driver, DriverError, LaunchEnv, Observed, RevisionRef};
use std::sync::Arc;
use std::time::Instant;

/// `n` commands: `namespaces` ensure_namespace, then prepare + activate of new
/// workloads spread over them.
pub fn commands(n: usize, namespaces: usize) -> Vec<Command> {
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
            spec: spec(),
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
        .map(|(i, op)| command(format!("b{i}"), op))
        .collect()
}

/// `rest` (the prepare + activate pairs of [`commands`]) cut into about `lanes`
/// consecutive runs, one task's each: whole pairs, so that no workload's activation
/// can run before its preparation in another task.
fn lanes(rest: &[Command], lanes: usize) -> std::slice::Chunks<'_, Command> {
    rest.chunks(rest.len().div_ceil(lanes).next_multiple_of(2).max(2))
}

/// The spec every benchmark revision has.
pub fn spec() -> Spec {
    Spec {
        driver: DriverKind::SIM,
        image: Some("app:1".into()),
        ..Default::default()
    }
}

/// Command `id` carrying `op` to the bench host.
pub fn command(id: String, op: Op) -> Command {
    Command {
        v: 1,
        id,
        host: "bench".into(),
        issued_at: chrono::Utc::now(),
        deadline: None,
        op,
    }
}

pub async fn run(args: &Args) -> anyhow::Result<()> {
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
        let tasks: Vec<_> = lanes(rest, namespaces)
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
pub async fn succeeded(executor: &Executor, command: Command) -> anyhow::Result<()> {
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
        capstan_common::DriverKind::SIM
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: false,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
            probes: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lane_holds_whole_pairs_a_preparation_before_its_activation() {
        // 16 lanes of 8 commands: one apiece would split every pair.
        for (n, namespaces) in [(32, 16), (48, 16), (2000, 16), (2002, 16), (35, 1)] {
            let cmds = commands(n, namespaces);
            let (_, rest) = cmds.split_at(namespaces);
            for lane in lanes(rest, namespaces) {
                for pair in lane.chunks(2) {
                    let [prepare, activate] = pair else {
                        panic!("{n}/{namespaces}: a lane ends with half a pair");
                    };
                    assert!(
                        matches!(&prepare.op, Op::PrepareRevision { workload, .. }
                            if matches!(&activate.op, Op::ActivateRevision { workload: w, .. } if w == workload)),
                        "{n}/{namespaces}: {pair:?}"
                    );
                }
            }
        }
    }
}
