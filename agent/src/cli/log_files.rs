//! `capstan-agent log` from the log files (no agent runs: [`LogReader`]), and `log
//! layout`.

use capstan_agent::event::Record;
use capstan_agent::local_socket;
use capstan_agent::log::{LogError, LogReader};
use capstan_common::answers::{LayoutAnswer, LogRequest, Verb};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// `capstan-agent log layout`: the storage layout of the log under `data_dir`, from
/// the agent listening on `running` (it holds the log) or read from the files.
pub fn layout(data_dir: &Path, running: Option<&Path>) -> anyhow::Result<ExitCode> {
    let layout = match running {
        Some(path) => {
            let answer: LayoutAnswer = local_socket::ask_as(path, Verb::Layout, &())?;
            answer.layout
        }
        None => capstan_agent::log::layout_of(&data_dir.join("log"))
            .map_err(|e| crate::context::explain(e.into()))?
            .unwrap_or_else(|| "none".to_string()),
    };
    writeln!(std::io::stdout(), "{layout}")?;
    Ok(ExitCode::SUCCESS)
}

/// The records `request` asks for, from the log files in `dir` (no agent runs), as JSON, and how
/// many could not be read. A record that fails its own hash is reported and skipped
/// *visibly*: reading a damaged log must still show everything that can be trusted.
/// The log is only read ([`LogReader`]): no intent rebuilt, nothing written.
pub fn read_log(dir: &Path, request: &LogRequest) -> anyhow::Result<(Vec<serde_json::Value>, u32)> {
    let Some(log) = LogReader::open(dir).map_err(|e| crate::context::explain(e.into()))? else {
        return Ok((Vec::new(), 0));
    };
    let answer = if capstan_agent::log::uses_index(request) {
        let records = log.query(request)?;
        (records.iter().map(Record::to_json).collect(), 0)
    } else {
        let mut bad = 0;
        let records: Vec<Record> = log
            .read_since(request.since)
            .filter_map(|r| match r {
                Ok(r) => Some(r),
                Err(LogError::Corrupt(c)) => {
                    eprintln!("capstan-agent: bad record {}: {}", c.seq, c.defect);
                    bad += 1;
                    None
                }
                Err(e) => {
                    eprintln!("capstan-agent: {e}");
                    bad += 1;
                    None
                }
            })
            .collect();
        let wanted = records.iter().filter(|r| r.matches(request));
        (wanted.map(Record::to_json).collect(), bad)
    };
    // The process ends after printing: letting the OS take sled's page table back
    // is cheaper than freeing it piece by piece (tens of ms on a large log, see
    // docs/benchmarks.md), and nothing was written that a drop would flush. The lock
    // goes with the process.
    std::mem::forget(log);
    Ok(answer)
}
