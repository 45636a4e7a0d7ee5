//! `roundtrip`: one command at a time through the HTTP API — POST, then GET `wait` —
//! against the raw chain it rides on, measured in the same run on the same
//! nats-server: a JetStream publish and its ack → a pull → two durable log appends →
//! a publish → its receipt.

use crate::stack::{percentile, Stack};
use crate::Args;
use async_nats::jetstream::{self, consumer::pull, stream};
use capstan_agent::log::{Log, LogOptions};
use futures::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let stack = Stack::start(&["rt"]);
    let chain = chain(&stack, args.roundtrips).await?;
    let api = api(&stack, args.roundtrips).await?;
    stack.stop();
    let (mut chain, (mut api, mut posts)) = (chain, api);
    let chain_p50 = percentile(&mut chain, 50.0);
    let p50 = percentile(&mut api, 50.0);
    println!(
        "{}",
        json!({
            "bench": "roundtrip",
            "commands": args.roundtrips,
            "p50_ms": round(p50),
            "p99_ms": round(percentile(&mut api, 99.0)),
            "post_p50_ms": round(percentile(&mut posts, 50.0)),
            "baseline": {
                "what": "raw chain: JetStream publish+ack, pull, 2 durable log appends, publish, receive",
                "p50_ms": round(chain_p50),
                "p99_ms": round(percentile(&mut chain, 99.0)),
            },
            "ratio": round(p50 / chain_p50),
            "target": "ratio <= 2",
        })
    );
    Ok(())
}

pub fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Submit → wait, `n` times after 20 unmeasured ones: the whole, and the POST alone.
async fn api(stack: &Stack, n: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut whole, mut posts) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 20 {
        let body = json!({"host": "rt", "id": format!("rt-{i}"), "op": "ensure_namespace",
            "namespace": format!("n{}", i % 16)});
        let t = Instant::now();
        let id = stack.submit(&body).await?;
        let posted = t.elapsed();
        stack
            .get(&format!("commands/{id}/wait?timeout=30s"))
            .await?;
        if i >= 20 {
            whole.push(t.elapsed());
            posts.push(posted);
        }
    }
    Ok((whole, posts))
}

/// The raw chain, `n` times after 20 unmeasured ones.
async fn chain(stack: &Stack, n: usize) -> anyhow::Result<Vec<Duration>> {
    let client = stack.connect().await?;
    let js = jetstream::new(client.clone());
    let stream = js
        .create_stream(stream::Config {
            name: "BENCH_CHAIN".into(),
            subjects: vec!["bench.chain.cmd".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let mut replies = client.subscribe("bench.chain.reply").await?;
    let dir = tempfile::tempdir()?;
    let log = Log::open(&dir.path().join("log"), LogOptions::default())?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        js.publish("bench.chain.cmd", format!("{i}").into())
            .await?
            .await?;
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await?;
        let message = batch
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the chain's pull came back empty"))?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        log.append_durable(&[crate::event(2 * i)]).await?;
        log.append_durable(&[crate::event(2 * i + 1)]).await?;
        message.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        client
            .publish("bench.chain.reply", message.payload.clone())
            .await?;
        replies
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the reply subscription ended"))?;
        if i >= 20 {
            samples.push(t.elapsed());
        }
    }
    Ok(samples)
}
