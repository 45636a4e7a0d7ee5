//! `log-append`: durable appends/s by 16 concurrent writers through
//! `Log::append_durable` (tokio tasks, as the agent's commands are) vs raw sled: 16
//! threads each inserting the same stored records, a key each, and calling `flush`
//! (sled shares a flush among concurrent callers), in the same run.

use crate::roundtrip::round;
use crate::{rate, Args};
use capstan_agent::log::{Log, LogOptions};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

const WRITERS: usize = 16;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let per = args.appends.div_ceil(WRITERS);
    let path = dir.path().join("log");
    let log = Arc::new(Log::open(&path, LogOptions::default())?);
    let t = Instant::now();
    crate::group_commit::concurrent_writers(&log, WRITERS, per).await?;
    let ours = rate(per * WRITERS, t.elapsed());
    let flushes = log.flushes();
    // The same stored records, written raw: a key each (the least sled can do).
    let stored: Vec<(sled::IVec, sled::IVec)> = log
        .stored_records()?
        .into_iter()
        .map(|(seq, sealed)| (seq.to_be_bytes().as_slice().into(), sealed.into()))
        .collect();
    drop(log);
    let raw = tokio::task::spawn_blocking(move || raw_writers(&stored)).await??;
    println!(
        "{}",
        json!({
            "bench": "log-append",
            "writers": WRITERS,
            "appends": per * WRITERS,
            "durable_appends_per_s": ours.round(),
            "flushes": flushes,
            "baseline": {"what": "raw sled insert + flush of the same bytes, 16 threads", "per_s": raw.round()},
            "ratio": round(ours / raw),
            "target": "ratio >= 0.8",
        })
    );
    Ok(())
}

/// 16 threads, each inserting its share of `stored` and flushing after every insert.
fn raw_writers(stored: &[(sled::IVec, sled::IVec)]) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new()
        .path(dir.path())
        .flush_every_ms(None)
        .open()?;
    let tree = db.open_tree("records")?;
    let t = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = stored
            .chunks(stored.len().div_ceil(WRITERS))
            .map(|mine| {
                let (db, tree) = (&db, &tree);
                s.spawn(move || {
                    for (key, value) in mine {
                        tree.insert(key, value)?;
                        db.flush()?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("raw writer panicked"))
    })?;
    Ok(rate(stored.len(), t.elapsed()))
}
