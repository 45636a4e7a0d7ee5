//! `replay`: restart-to-ready on the large log ([`crate::million`]) — `Log::open`,
//! which finds the newest snapshot, replays and verifies the tail and rebuilds the
//! intent — vs raw sled opening the same database and scanning every record.

use crate::million::Million;
use crate::roundtrip::round;
use capstan_agent::log::{Log, LogOptions};
use serde_json::json;
use std::time::Instant;

pub fn run(log: &Million) -> anyhow::Result<()> {
    let mut opens = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let opened = Log::open(&log.log_dir(), LogOptions::default())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(opened.last_seq() == log.records, "the log lost records");
        anyhow::ensure!(
            opened.intent().workloads.len() == log.workloads,
            "the intent lost workloads"
        );
        drop(opened);
        opens.push(ms);
    }
    let (raw_ms, scanned) = raw_scan(log)?;
    // In the order they ran (the first pays sled's recovery of the build's writes).
    let open_ms = median(&mut opens.clone());
    println!(
        "{}",
        json!({
            "bench": "replay",
            "records": log.records,
            "workloads": log.workloads,
            "built_s": round(log.built_in.as_secs_f64()),
            "restart_to_ready_ms": round(open_ms),
            "of": "the median of 3 opens (opens_ms: in order)",
            "opens_ms": opens.iter().map(|m| round(*m)).collect::<Vec<_>>(),
            "baseline": {"what": "raw sled open + scan of every stored record", "ms": round(raw_ms), "keys": scanned},
            "ratio": round(open_ms / raw_ms),
            "target": "restart_to_ready_ms < 300",
        })
    );
    Ok(())
}

/// Raw sled: open the log's database and read every stored value of its records'
/// tree (the records, [`capstan_agent::log::RECORDS_TREE`], several to a key): the
/// count returned is of keys read.
pub fn raw_scan(log: &Million) -> anyhow::Result<(f64, u64)> {
    let t = Instant::now();
    let db = sled::Config::new()
        .path(log.log_dir())
        .flush_every_ms(None)
        .open()?;
    let mut scanned = 0;
    for entry in db.open_tree(capstan_agent::log::RECORDS_TREE)?.iter() {
        let (_, value) = entry?;
        scanned += u64::from(!value.is_empty());
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    drop(db);
    capstan_agent::log::wait_until_released(&log.log_dir().join("db"));
    Ok((ms, scanned))
}

pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
