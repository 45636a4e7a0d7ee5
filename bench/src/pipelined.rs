//! The raw pipelined chain `throughput` is measured against: on the same nats-server,
//! at the same concurrency, only what the path to one agent must do, with no capstan
//! code between — each command a JetStream publish and its ack, a pull (a durable pull
//! consumer, explicit acks, at most [`IN_FLIGHT`] unacked, as the agent's), a durable
//! sled append in batches (group commit: what is queued goes into one batch and one
//! flush, as the log does), the message's ack, a result published to JetStream
//! (pipelined in rounds, as the agent's results are) and its receipt by the client.
//! One lane per namespace, each in order, as the agent's.

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// The agent's default `in_flight`: its consumer's `max_ack_pending` and pull batch.
pub const IN_FLIGHT: usize = 16;
/// The most results published before their acks are awaited (the agent's round).
const ROUND: usize = 512;

/// One command of the chain: its lane (namespace) and its body (the signed command
/// capstan gets, so both carry the same bytes).
pub struct Item {
    pub lane: usize,
    pub body: Vec<u8>,
}

/// Runs `items` through the chain over `client` (in an account with JetStream), the
/// lanes' first command each unmeasured; how long the rest took from the first publish
/// to the last receipt.
pub async fn run(
    client: async_nats::Client,
    items: &[Item],
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let js = jetstream::new(client.clone());
    for (name, subject, per_subject) in [
        ("RAWCHAIN_CMD", "rawchain.cmd.>", -1),
        ("RAWCHAIN_RES", "rawchain.res.>", 1),
    ] {
        js.create_stream(stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            storage: stream::StorageType::File,
            max_messages_per_subject: per_subject,
            ..Default::default()
        })
        .await?;
    }
    let consumer = js
        .get_stream("RAWCHAIN_CMD")
        .await?
        .create_consumer(pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: IN_FLIGHT as i64,
            ..Default::default()
        })
        .await?;
    let dir = tempfile::tempdir()?;
    let log = writer(sled::open(dir.path().join("log"))?);
    let results = publisher(js.clone());
    let lanes = 1 + items.iter().map(|i| i.lane).max().unwrap_or(0);
    let senders: Vec<mpsc::UnboundedSender<jetstream::Message>> = (0..lanes)
        .map(|_| lane(log.clone(), results.clone()))
        .collect();
    let taker = tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(IN_FLIGHT)
            .messages()
            .await?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            let lane: usize = message.subject.split('.').nth(2).unwrap_or("0").parse()?;
            if senders[lane].send(message).is_err() {
                break;
            }
        }
        anyhow::Ok(())
    });

    // The first command of each lane, unmeasured (as capstan's namespaces are made
    // ready before its clock starts); then the rest.
    let mut first = HashMap::new();
    for (n, item) in items.iter().enumerate() {
        first.entry(item.lane).or_insert(n);
    }
    let (setup, rest): (Vec<_>, Vec<_>) = items
        .iter()
        .enumerate()
        .partition(|(n, item)| first[&item.lane] == *n);
    send(&client, &js, &setup, timeout).await?;
    let took = send(&client, &js, &rest, timeout).await?;
    taker.abort();
    for name in ["RAWCHAIN_CMD", "RAWCHAIN_RES"] {
        js.delete_stream(name).await?;
    }
    Ok(took)
}

/// Publishes `items` (a thousand before their acks are awaited, as capstan's
/// benchmark publisher does) and waits until a result of each is received.
async fn send(
    client: &async_nats::Client,
    js: &jetstream::Context,
    items: &[(usize, &Item)],
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let mut receipts = client.subscribe("rawchain.res.>").await?;
    let t = Instant::now();
    for chunk in items.chunks(1000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for (n, item) in chunk {
            let subject = format!("rawchain.cmd.{}.{n}", item.lane);
            acks.push(js.publish(subject, item.body.clone().into()).await?);
        }
        for ack in acks {
            ack.await?;
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    for received in 0..items.len() {
        tokio::time::timeout_at(deadline, receipts.next())
            .await
            .map_err(|_| anyhow::anyhow!("{} results missing", items.len() - received))?
            .ok_or_else(|| anyhow::anyhow!("the receipts subscription ended"))?;
    }
    Ok(t.elapsed())
}

/// A lane: each message appended durably, acked, its result handed to the publisher.
fn lane(
    log: mpsc::UnboundedSender<(Vec<u8>, oneshot::Sender<()>)>,
    results: mpsc::UnboundedSender<String>,
) -> mpsc::UnboundedSender<jetstream::Message> {
    let (tx, mut rx) = mpsc::unbounded_channel::<jetstream::Message>();
    tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            let (done, durable) = oneshot::channel();
            if log.send((message.payload.to_vec(), done)).is_err() || durable.await.is_err() {
                return;
            }
            if message.ack().await.is_err() {
                return;
            }
            let id = message.subject.rsplit('.').next().unwrap_or_default();
            if results.send(id.to_string()).is_err() {
                return;
            }
        }
    });
    tx
}

/// The group-committing writer: every append queued when it comes round goes into
/// one sled batch and one flush; each is answered once flushed.
fn writer(db: sled::Db) -> mpsc::UnboundedSender<(Vec<u8>, oneshot::Sender<()>)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Vec<u8>, oneshot::Sender<()>)>();
    tokio::spawn(async move {
        let mut seq: u64 = 0;
        while let Some(first) = rx.recv().await {
            let mut queued = vec![first];
            while let Ok(next) = rx.try_recv() {
                queued.push(next);
            }
            let mut batch = sled::Batch::default();
            let mut answers = Vec::with_capacity(queued.len());
            for (record, answer) in queued {
                seq += 1;
                batch.insert(&seq.to_be_bytes(), record);
                answers.push(answer);
            }
            if db.apply_batch(batch).is_err() || db.flush_async().await.is_err() {
                return;
            }
            for answer in answers {
                let _ = answer.send(());
            }
        }
    });
    tx
}

/// Publishes results in rounds: whatever is queued (at most [`ROUND`]) is sent, then
/// its acks awaited.
fn publisher(js: jetstream::Context) -> mpsc::UnboundedSender<String> {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut round = vec![first];
            while round.len() < ROUND {
                match rx.try_recv() {
                    Ok(id) => round.push(id),
                    Err(_) => break,
                }
            }
            let mut acks = Vec::with_capacity(round.len());
            for id in round {
                let body = format!("{{\"id\":\"{id}\",\"status\":\"succeeded\",\"done\":true}}");
                match js.publish(format!("rawchain.res.{id}"), body.into()).await {
                    Ok(ack) => acks.push(ack),
                    Err(_) => return,
                }
            }
            for ack in acks {
                if ack.await.is_err() {
                    return;
                }
            }
        }
    });
    tx
}
