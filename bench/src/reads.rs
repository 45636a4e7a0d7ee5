//! `reads`: how long the coordinator takes to answer "what happened to command X"
//! (`GET /v1/commands/{id}`, ids picked across the whole history) and "records after
//! seq N" (`GET /v1/hosts/{host}/events?since=N&limit=10`) as one host's history
//! grows from 1,000 to `--history` records. The baseline is the first size: flat
//! means a ratio near 1.

use crate::roundtrip::round;
use crate::stack::{percentile, Stack};
use crate::Args;
use futures::StreamExt;
use serde_json::json;
use std::time::Instant;

/// Reads measured at each size.
const READS: usize = 200;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let stack = Stack::start(&["rd"]);
    let mut sizes = vec![1_000u64];
    while sizes.last().is_some_and(|s| *s < args.history) {
        let next = (sizes.last().copied().unwrap_or(1) * 10).min(args.history);
        sizes.push(next);
    }
    let mut ids: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
    for size in sizes {
        // Every command after the first is a no-op: two records (received, completed).
        let want = (size / 2) as usize;
        let t = Instant::now();
        let new: Vec<String> = (ids.len()..want).map(|i| format!("rd-{i:07}")).collect();
        let submitted: Vec<anyhow::Result<String>> = futures::stream::iter(&new)
            .map(|id| {
                let body = json!({"host": "rd", "id": id, "op": "ensure_namespace",
                    "namespace": "hist"});
                let stack = &stack;
                async move { stack.submit(&body).await }
            })
            .buffered(16)
            .collect()
            .await;
        for s in submitted {
            s?;
        }
        ids.extend(new);
        // One namespace: commands finish in stream order. Up to 16 submissions are in
        // flight at once (`buffered`), so only the last 16 may have reached the stream
        // in another order than their ids: every earlier one was published before them.
        // All of those done means all done.
        for last in ids.iter().rev().take(16) {
            stack
                .get(&format!("commands/{last}/wait?timeout=600s"))
                .await?;
        }
        eprintln!(
            "reads: history of {size} records built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let mut status = Vec::with_capacity(READS);
        let mut events = Vec::with_capacity(READS);
        for _ in 0..READS {
            let id = &ids[random.below(ids.len() as u64) as usize];
            let t = Instant::now();
            stack.get(&format!("commands/{id}")).await?;
            status.push(t.elapsed());
            let since = random.below(size);
            let t = Instant::now();
            let answer = stack
                .get(&format!("hosts/rd/events?since={since}&limit=10"))
                .await?;
            events.push(t.elapsed());
            let first = answer["events"][0]["seq"].as_u64();
            anyhow::ensure!(
                first == Some(since + 1) || since + 1 > size,
                "events after {since} began at {first:?}"
            );
        }
        rows.push((
            size,
            percentile(&mut status, 50.0),
            percentile(&mut status, 99.0),
            percentile(&mut events, 50.0),
        ));
    }
    stack.stop();
    let (base_status, base_events) = (rows[0].1, rows[0].3);
    let largest = rows.last().copied().unwrap_or_default();
    println!(
        "{}",
        json!({
            "bench": "reads",
            "history_records": largest.0,
            "status_p50_ms": round(largest.1),
            "status_p99_ms": round(largest.2),
            "events_since_p50_ms": round(largest.3),
            "by_size": rows.iter().map(|(size, p50, p99, ev)| json!({
                "records": size, "status_p50_ms": round(*p50), "status_p99_ms": round(*p99),
                "events_since_p50_ms": round(*ev)})).collect::<Vec<_>>(),
            "baseline": {"records": rows[0].0, "status_p50_ms": round(base_status),
                "events_since_p50_ms": round(base_events)},
            "ratio": round(largest.1 / base_status),
            "events_since_ratio": round(largest.3 / base_events),
            "target": "status_p50_ms < 5 and ratio near 1 (flat)",
        })
    );
    Ok(())
}

/// A small deterministic generator: the same ids are read in every run.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
