//! The large log that `replay` and `query` measure: `--log-records` records (default
//! 1,000,000) over `--log-workloads` workloads (1,000), built once per run in a temp
//! dir with batched appends. Each command is three records — `command_received`,
//! `workload_started`, `command_completed` — on workload `w{i mod workloads}` of
//! namespace `ns`, with command id `c{i}`.

use crate::Args;
use capstan_agent::event::{Cause, Event};
use capstan_agent::log::{Log, LogOptions};
use capstan_common::Outcome;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Commands appended per batch (three records each).
const BATCH_COMMANDS: usize = 333;

pub struct Million {
    _dir: tempfile::TempDir,
    /// The agent's data dir: the log is its `log`.
    pub data_dir: PathBuf,
    pub records: u64,
    pub workloads: usize,
    pub built_in: Duration,
}

impl Million {
    pub fn log_dir(&self) -> PathBuf {
        self.data_dir.join("log")
    }

    pub fn build(args: &Args) -> anyhow::Result<Million> {
        let dir = tempfile::tempdir()?;
        let data_dir = dir.path().join("data");
        let (workloads, commands) = (args.log_workloads, args.log_records.div_ceil(3) as usize);
        let t = Instant::now();
        let log = Log::open(&data_dir.join("log"), LogOptions::default())?;
        let mut batch = Vec::with_capacity(BATCH_COMMANDS * 3);
        for i in 0..commands {
            batch.extend(command(i, workloads));
            if batch.len() >= BATCH_COMMANDS * 3 || i + 1 == commands {
                log.append(&batch)?;
                batch.clear();
            }
        }
        log.flush()?;
        let records = log.last_seq();
        drop(log);
        let built_in = t.elapsed();
        eprintln!(
            "log           built {records} records over {workloads} workloads in {:.1} s",
            built_in.as_secs_f64()
        );
        Ok(Million {
            _dir: dir,
            data_dir,
            records,
            workloads,
            built_in,
        })
    }
}

/// Command `i`'s three records.
pub fn command(i: usize, workloads: usize) -> [Event; 3] {
    let (id, workload) = (format!("c{i}"), format!("w{}", i % workloads));
    [
        Event::CommandReceived {
            command_id: id.clone(),
            op: "activate".into(),
            namespace: "ns".into(),
            workload: Some(workload.clone()),
            revision: Some(format!("r{i}")),
            command: format!(
                r#"{{"id":"{id}","op":"activate","namespace":"ns","workload":"{workload}","revision":"r{i}"}}"#
            ),
        },
        Event::WorkloadStarted {
            cause: Cause::Command(id.clone()),
            namespace: "ns".into(),
            workload,
            revision: format!("r{i}"),
            previous: None,
        },
        Event::CommandCompleted {
            command_id: id,
            outcome: Outcome::Succeeded,
            code: None,
            message: None,
        },
    ]
}
