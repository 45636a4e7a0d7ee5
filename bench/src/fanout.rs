//! `fanout`: one command to each of `--hosts` simulated hosts (`capstan-agent
//! sim-fleet`, one process) through the HTTP API, until every result is back: the
//! time from the first POST to the last answer. The baseline is one command to one
//! of those hosts, submit → wait, in the same run.

use crate::roundtrip::round;
use crate::stack::{percentile, Stack};
use crate::Args;
use futures::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};

/// Rounds of the fanout (the median is the figure).
const ROUNDS: usize = 5;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let mut stack = Stack::for_sim_fleet(args.hosts, "fan");
    let t = Instant::now();
    let hosts = stack.sim_fleet(args.hosts, "fan");
    eprintln!(
        "fanout: {} simulated hosts alive in {:.1} s",
        hosts.len(),
        t.elapsed().as_secs_f64()
    );
    // The baseline: one command at a time to the first host.
    let mut single = Vec::new();
    for i in 0..30 {
        let body = json!({"host": hosts[0], "id": format!("one-{i}"), "op": "ensure_namespace",
            "namespace": "one"});
        let t = Instant::now();
        let id = stack.submit(&body).await?;
        stack
            .get(&format!("commands/{id}/wait?timeout=30s"))
            .await?;
        if i >= 10 {
            single.push(t.elapsed());
        }
    }
    let single_ms = percentile(&mut single, 50.0);
    let mut rounds = Vec::new();
    // A smoke run: one round, as the others would be.
    for round_no in 0..if args.smoke { 1 } else { ROUNDS } {
        // Each round after the fleet has settled: the heartbeats and progress writes a
        // round sets off (within 250 ms and 1 s) are not part of the next one.
        tokio::time::sleep(Duration::from_secs(2)).await;
        rounds.push(fan(&stack, &hosts, round_no).await?);
    }
    stack.stop();
    let in_order: Vec<f64> = rounds
        .iter()
        .map(|d| round(d.as_secs_f64() * 1000.0))
        .collect();
    let fanout_ms = percentile(&mut rounds, 50.0);
    println!(
        "{}",
        json!({
            "bench": "fanout",
            "hosts": hosts.len(),
            "all_results_ms": round(fanout_ms),
            "of": format!("the median of {} rounds", in_order.len()),
            "rounds_ms": in_order,
            "baseline": {"what": "one command to one host, submit → wait, p50", "ms": round(single_ms)},
            "ratio": round(fanout_ms / single_ms),
            "target": "all_results_ms < 2000",
        })
    );
    Ok(())
}

/// One command to every host (32 POSTs and 64 waits in flight); how long until the
/// last result.
async fn fan(stack: &Stack, hosts: &[String], round_no: usize) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let ids: Vec<anyhow::Result<String>> = futures::stream::iter(hosts)
        .map(|host| {
            let body = json!({"host": host, "id": format!("fan-{round_no}.{host}"),
                "op": "ensure_namespace", "namespace": format!("round{round_no}")});
            async move { stack.submit(&body).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let ids: Vec<String> = ids.into_iter().collect::<anyhow::Result<_>>()?;
    let answers: Vec<anyhow::Result<serde_json::Value>> = futures::stream::iter(&ids)
        .map(|id| async move { stack.get(&format!("commands/{id}/wait?timeout=60s")).await })
        .buffer_unordered(64)
        .collect()
        .await;
    for answer in answers {
        answer?;
    }
    Ok(t.elapsed())
}
