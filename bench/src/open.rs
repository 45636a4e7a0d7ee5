//! `open`: reopening a long log with snapshots vs replaying it from scratch.

use crate::{event, Args};
use capstan_agent::event::Event;
use capstan_agent::log::{Log, LogOptions};
use std::time::Instant;

pub fn run(args: &Args) -> anyhow::Result<()> {
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
