//! `group-commit`: durable appends by N concurrent writers vs one writer at a time.

use crate::{event, rate, Args};
use capstan_agent::log::{Log, LogOptions};
use std::sync::Arc;
use std::time::Instant;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = Arc::new(Log::open(&dir.path().join("seq"), LogOptions::default())?);
    let t = Instant::now();
    for i in 0..args.appends {
        log.append_durable(&[event(i)]).await?;
    }
    let sequential = t.elapsed();

    let log = Arc::new(Log::open(&dir.path().join("con"), LogOptions::default())?);
    let t = Instant::now();
    let per = args.appends / args.writers;
    concurrent_writers(&log, args.writers, per).await?;
    let concurrent = t.elapsed();
    println!(
        "group-commit  {} writers: {} appends in {} flushes",
        args.writers,
        per * args.writers,
        log.flushes()
    );
    let log = Arc::new(Log::open(&dir.path().join("mem"), LogOptions::default())?);
    let t = Instant::now();
    for i in 0..args.appends {
        log.append(&[event(i)])?;
    }
    let unflushed = t.elapsed();
    println!(
        "group-commit  appends without waiting for durability: {:>9.0}/s",
        rate(args.appends, unflushed)
    );
    let (a, b) = (
        rate(args.appends, sequential),
        rate(per * args.writers, concurrent),
    );
    println!("group-commit  1 writer: {a:>9.0} durable appends/s   {} writers: {b:>9.0}/s   ratio {:.1}x", args.writers, b / a);
    Ok(())
}

/// `writers` tokio tasks, each making `per` durable appends of one event.
pub async fn concurrent_writers(log: &Arc<Log>, writers: usize, per: usize) -> anyhow::Result<()> {
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let log = Arc::clone(log);
            tokio::spawn(async move {
                for i in 0..per {
                    log.append_durable(&[event(w * per + i)]).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}
