//! `query`: audit queries on the large log ([`crate::million`]) through its indexes —
//! one workload's records, one command's, a time range of about 2,000 records, and
//! the CLI from the files (`capstan-agent log --namespace ns --workload W` and
//! `--command ID`, each a process that opens the log read-only and answers, against
//! its 50 ms target, beside raw sled's own open as the floor; and the same two
//! commands while `capstan-agent run` holds the log, answered over its local socket)
//! — vs a raw sled full scan of the records.

use crate::million::Million;
use crate::replay::{median, raw_scan};
use crate::roundtrip::round;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::answers::LogRequest;
use serde_json::json;
use std::time::Instant;

/// Timed runs of each query (the median is reported).
const RUNS: usize = 9;

pub fn run(log: &Million) -> anyhow::Result<()> {
    let (scan_ms, _) = raw_scan(log)?;
    let opened = Log::open(&log.log_dir(), LogOptions::default())?;
    let middle = log.records / 2;
    let at = |seq: u64| -> anyhow::Result<_> {
        let record = opened
            .get(seq)?
            .ok_or_else(|| anyhow::anyhow!("no record {seq}"))?;
        Ok(chrono::DateTime::from_timestamp_millis(record.at_ms))
    };
    let workload = format!("w{}", (middle / 3) as usize % log.workloads);
    let queries = [
        (
            "workload",
            LogRequest {
                namespace: Some("ns".into()),
                workload: Some(workload.clone()),
                ..LogRequest::default()
            },
        ),
        (
            "command",
            LogRequest {
                command: Some(format!("c{}", middle / 3)),
                ..LogRequest::default()
            },
        ),
        (
            "time_range",
            LogRequest {
                since_time: at(middle)?,
                until_time: at(middle + 2000)?,
                ..LogRequest::default()
            },
        ),
    ];
    let mut results = serde_json::Map::new();
    let mut slowest: f64 = 0.0;
    for (name, request) in &queries {
        let mut times = Vec::with_capacity(RUNS);
        let mut found = 0;
        for _ in 0..RUNS {
            let t = Instant::now();
            found = opened.query(request)?.len();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(&mut times);
        slowest = slowest.max(ms);
        results.insert((*name).into(), json!({"ms": round(ms), "records": found}));
    }
    drop(opened);
    let by_workload = ["--namespace", "ns", "--workload", &workload];
    let command = format!("c{}", middle / 3);
    let by_command = ["--command", command.as_str()];
    let from_files = match (cli(log, &by_workload)?, cli(log, &by_command)?) {
        (Some(w), Some(c)) => json!({
            "workload": w,
            "command": c,
            "floor": {"what": "raw sled open of the log in this process, nothing read", "ms": round(raw_open(log)?)},
            "target": "each < 50 ms",
            "met": w["ms"].as_f64() < Some(50.0) && c["ms"].as_f64() < Some(50.0),
        }),
        _ => serde_json::Value::Null,
    };
    // The same commands while `capstan-agent run` holds the log: they ask the agent
    // over its local socket (the usual case on a host: the agent is a service).
    let over_socket = with_agent(log, || {
        Ok(match (cli(log, &by_workload)?, cli(log, &by_command)?) {
            (Some(w), Some(c)) => json!({
                "workload": w,
                "command": c,
                "target": "each < 50 ms",
                "met": w["ms"].as_f64() < Some(50.0) && c["ms"].as_f64() < Some(50.0),
            }),
            _ => serde_json::Value::Null,
        })
    })?;
    println!(
        "{}",
        json!({
            "bench": "query",
            "records": log.records,
            "queries": results,
            "of": format!("the median of {RUNS} runs each, log open"),
            "cli_from_files": from_files,
            "cli_over_socket": over_socket,
            "baseline": {"what": "raw sled full scan of the records", "ms": round(scan_ms)},
            "ratio": round(slowest / scan_ms),
            "target": "each query < 50 ms",
        })
    );
    Ok(())
}

/// Raw sled opening the log's database and closing it again (the median of 3): the
/// least any process reading the files pays before its first read.
fn raw_open(log: &Million) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let db = sled::Config::new()
            .path(log.log_dir())
            .flush_every_ms(None)
            .open()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        drop(db);
        capstan_agent::log::wait_until_released(&log.log_dir().join("db"));
    }
    Ok(median(&mut times))
}

/// `measure` while `capstan-agent run` (sim driver, no NATS, no metrics endpoint)
/// holds the log: started, waited on until it says it is ready, stopped with SIGTERM
/// (its exit status checked) afterwards. `Null` when the binary is not built.
fn with_agent(
    log: &Million,
    measure: impl FnOnce() -> anyhow::Result<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let agent = std::env::current_exe()?.with_file_name("capstan-agent");
    if !agent.exists() {
        return Ok(serde_json::Value::Null);
    }
    let dir = log.data_dir.parent().unwrap_or(&log.data_dir);
    let config = dir.join("query-agent.toml");
    std::fs::write(&config, "driver = \"sim\"\n[metrics]\nenabled = false\n")?;
    let mut run = std::process::Command::new(&agent);
    run.arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&log.data_dir)
        .args(["--host", "bench", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let daemon = capstan_tests::process::Process::spawn(
        "capstan-agent run (query)",
        run,
        &dir.join("query-agent.log"),
    );
    daemon.wait_for_text("capstan-agent ready");
    let measured = measure();
    daemon.stop();
    measured
}

/// `capstan-agent log --json FILTER…` (the release binary next to this one) on the
/// log: from the files when no agent runs, else over the agent's socket. Wall time of
/// the process, median of 3; `None` when the binary is not built.
fn cli(log: &Million, filter: &[&str]) -> anyhow::Result<Option<serde_json::Value>> {
    let agent = std::env::current_exe()?.with_file_name("capstan-agent");
    if !agent.exists() {
        eprintln!(
            "query         CLI skipped: {} is not built",
            agent.display()
        );
        return Ok(None);
    }
    let mut times = Vec::new();
    let mut lines = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let out = std::process::Command::new(&agent)
            .arg("--data-dir")
            .arg(&log.data_dir)
            .args(["--host", "bench", "log", "--json"])
            .args(filter)
            .output()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            out.status.success(),
            "capstan-agent log failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    }
    Ok(Some(json!({
        "args": filter.join(" "),
        "ms": round(median(&mut times)),
        "records": lines,
        "of": "the median of 3 processes",
    })))
}
