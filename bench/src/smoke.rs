//! `--smoke`: every measurement once at tiny sizes, so that CI notices one that no
//! longer runs (the e2e test `bench::smoke_runs_every_measurement_once` runs it). Figures
//! are printed as usual and none is judged; the exit status says whether every
//! measurement ran to its end. And [`Runner`], which runs each measurement and
//! collects the ones that failed (an error or a panic of the harness), so that one
//! failure does not hide the others.

use crate::Args;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// Sets every size to what `--smoke` runs: each measurement does all of its steps,
/// with as little in each as it takes.
pub fn shrink(args: &mut Args) {
    args.appends = 64;
    args.writers = 4;
    args.records = 2_000;
    // The ensure_namespace of each of 16 namespaces, then a pair for each.
    args.commands = 48;
    args.workloads = 8;
    args.units = 2;
    args.rounds = 1;
    args.namespaces = 0;
    args.roundtrips = 5;
    args.history = 1_000;
    args.hosts = 4;
    args.fleet_sizes = vec![3];
    args.fleet_per_process = 3;
    args.log_records = 10_000;
    args.log_workloads = 10;
    args.idle_workloads = 2;
    args.idle_secs = 1;
}

/// Runs measurements one after another and keeps the names of those that failed.
#[derive(Default)]
pub struct Runner {
    failed: Vec<&'static str>,
}

impl Runner {
    /// Runs `measure` (named `name`); an error or a panic is printed and counted.
    pub fn run(&mut self, name: &'static str, measure: impl FnOnce() -> anyhow::Result<()>) {
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(measure));
        eprintln!("{name}: ran {:.1} s", t.elapsed().as_secs_f64());
        let failure = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => format!("{e:#}"),
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into()),
        };
        eprintln!("{name}: FAILED: {failure}");
        self.failed.push(name);
    }

    /// An error naming every measurement that failed, if any did.
    pub fn finish(self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.failed.is_empty(),
            "{} measurement(s) failed: {}",
            self.failed.len(),
            self.failed.join(", ")
        );
        Ok(())
    }
}
