use super::*;

/// Forged records and snapshots the log must refuse.
pub(crate) mod hardening;
use crate::testkit::{Cause, Event, Intent, Log};

fn ready(ns: &str) -> Event {
    Event::NamespaceReady {
        command_id: format!("c-{ns}"),
        namespace: ns.into(),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn appends_are_chained_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        rt().block_on(async {
            assert_eq!(
                log.append_durable(&[ready("a"), ready("b")]).await.unwrap(),
                2
            );
            assert_eq!(log.append_durable(&[ready("c")]).await.unwrap(), 3);
        });
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert!(log.degraded().is_none());
    assert_eq!(log.verify().unwrap(), 3);
    assert_eq!(log.last_seq(), 3);
    assert_eq!(log.intent().namespaces.len(), 3);
    let records: Vec<Record<Event>> = log.read_since(0).collect::<Result<_, _>>().unwrap();
    assert_eq!(records[0].prev_hash, [0; 32]);
    assert_ne!(records[1].prev_hash, [0; 32]);
    assert_eq!(log.read_since(2).count(), 1);
}

#[test]
fn indexes_find_records_by_command_and_workload() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let started = Event::WorkloadStarted {
        cause: Cause::Command("c-9".into()),
        namespace: "ns".into(),
        workload: "web".into(),
        revision: "r1".into(),
        previous: None,
    };
    log.append(&[ready("ns"), started.clone(), ready("other")])
        .unwrap();
    let by_cmd = log.for_command("c-9").unwrap();
    assert_eq!(by_cmd.len(), 1);
    assert_eq!(by_cmd[0].event, started);
    assert_eq!(log.for_workload("ns", "web").unwrap().len(), 1);
    // A prefix of another id must not match.
    assert!(log.for_command("c-").unwrap().is_empty());
}

#[test]
fn a_flipped_byte_names_its_seq_and_degrades_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        log.append(&(0..10).map(|i| ready(&format!("n{i}"))).collect::<Vec<_>>())
            .unwrap();
        log.flush().unwrap();
    }
    tamper_flip_byte::<Event>(dir.path(), 6, 5).unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(
        log.degraded(),
        Some(&Corruption {
            seq: 6,
            defect: Defect::HashMismatch
        })
    );
    assert!(matches!(
        log.verify(),
        Err(LogError::Corrupt(Corruption { seq: 6, .. }))
    ));
    assert!(matches!(
        log.append(&[ready("x")]),
        Err(LogError::Degraded(_))
    ));
    // What came before the bad record is still readable.
    assert_eq!(log.intent().namespaces.len(), 5);
}

#[test]
fn snapshots_bound_replay_and_agree_with_a_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions::snapshot_every(4);
    {
        let log = Log::open(dir.path(), opts).unwrap();
        for i in 0..11 {
            log.append(&[ready(&format!("n{i}"))]).unwrap();
        }
        log.flush().unwrap();
    }
    let log = Log::open(dir.path(), opts).unwrap();
    assert_eq!(log.snapshots.len(), 2, "old snapshots are pruned to two");
    let mut scratch = Intent::default();
    for r in log.read_since(0) {
        let r = r.unwrap();
        scratch.apply(r.seq, &r.event);
    }
    assert_eq!(log.intent(), scratch);
    // The tail after the newest snapshot (seq 8) is what open replayed.
    assert_eq!(log.tail.lock().unwrap().since_snapshot, 3);
}

#[test]
fn concurrent_writers_share_flushes() {
    // Group commit's guarantee: every writer that arrives while a flush runs is
    // appended meanwhile (a flush never holds an append up) and made durable by the
    // next flush. So: hold the first writer's flush (the log's own sled flush behind
    // a gate) until 63 more writers have appended, then let it go: exactly two
    // flushes make all 64 appends durable.
    const WRITERS: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let (started, flush_started) = std::sync::mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let db = log.db.clone();
    log.flusher = flusher::Flusher::start(log.last_seq(), move || {
        started.send(()).map_err(|e| e.to_string())?;
        gate.lock().unwrap().recv().map_err(|e| e.to_string())?;
        db.flush().map(|_| ()).map_err(|e| e.to_string())
    });
    let log = std::sync::Arc::new(log);
    let bound = std::time::Duration::from_secs(60);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let spawn = |i: usize| {
            let log = std::sync::Arc::clone(&log);
            tokio::spawn(async move {
                log.append_durable(&[ready(&format!("n{i}"))])
                    .await
                    .unwrap()
            })
        };
        let mut tasks = vec![spawn(0)];
        flush_started
            .recv_timeout(bound)
            .expect("the first writer's flush to start");
        tasks.extend((1..WRITERS).map(spawn));
        let deadline = std::time::Instant::now() + bound;
        while log.last_seq() < WRITERS as u64 || log.flusher.announced() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} writers appended, {} not waiting yet",
                log.last_seq(),
                log.flusher.announced()
            );
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap(); // flush 1: the first writer's append only
        flush_started
            .recv_timeout(bound)
            .expect("the second flush to start");
        release.send(()).unwrap(); // flush 2: the other 63
        for t in tasks {
            tokio::time::timeout(bound, t)
                .await
                .expect("a writer waits beyond the bound")
                .unwrap();
        }
    });
    assert_eq!(log.flushes(), 2, "64 writers, two flushes");
    assert_eq!(log.verify().unwrap(), WRITERS as u64);
}

#[test]
fn a_dropped_log_can_be_reopened_at_once() {
    // sled's IO threads may hold the database file (and its lock) for a moment after
    // the last handle is dropped, longer when they are busy: several logs cycle at
    // once. Dropping a Log waits for them, so every reopen finds the lock free.
    let cycles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let dir = tempfile::tempdir().unwrap();
                let opts = LogOptions::snapshot_every(2);
                for round in 0..100 {
                    let log = Log::open(dir.path(), opts)
                        .unwrap_or_else(|e| panic!("log {t}, reopen {round}: {e:?}"));
                    log.append(&[ready(&format!("n{round}")), ready("x")])
                        .unwrap();
                    rt().block_on(log.durable(log.last_seq())).unwrap();
                }
            })
        })
        .collect();
    for cycle in cycles {
        cycle.join().unwrap();
    }
}

#[test]
fn a_snapshot_of_another_version_is_ignored_for_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions::snapshot_every(4);
    let before = {
        let log = Log::open(dir.path(), opts).unwrap();
        for i in 0..11 {
            log.append(&[ready(&format!("n{i}"))]).unwrap();
        }
        // The newest snapshot (seq 8) as a build with another snapshot format wrote it:
        // intact, but not this build's version.
        let stored = log.snapshots.get(seq_key(8)).unwrap().unwrap();
        let (content, _) = codec::unseal(8, &stored).unwrap();
        let mut other = content.to_vec();
        other[0] = snapshot::VERSION + 1;
        log.snapshots
            .insert(seq_key(8), codec::seal(other).0)
            .unwrap();
        log.flush().unwrap();
        log.intent()
    };
    // (A longer interval, so that this open does not write a snapshot of its own.)
    let log = Log::open(dir.path(), LogOptions::snapshot_every(100)).unwrap();
    assert_eq!(log.intent(), before);
    // Replayed from the older snapshot (seq 4): records 5 to 11.
    assert_eq!(log.tail.lock().unwrap().since_snapshot, 7);
}

/// Every key and value of one of the log's trees.
fn tree_dump(tree: &sled::Tree) -> Vec<(Vec<u8>, Vec<u8>)> {
    tree.iter()
        .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect()
}

#[test]
fn one_append_of_many_records_stores_what_one_at_a_time_does() {
    // 150 records of one command and one workload in the same minute: they span 19
    // chunks and fill each of their lists' heads into two blocks.
    let events: Vec<Event> = (0..150)
        .map(|i| Event::WorkloadStarted {
            cause: Cause::Command("c-9".into()),
            namespace: "ns".into(),
            workload: "web".into(),
            revision: format!("r{i}"),
            previous: None,
        })
        .collect();
    let at_ms = 1_780_000_000_000;
    let (one, each) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let batched = Log::open(one.path(), LogOptions::default()).unwrap();
    // Two appends, so the second adds to a chunk and to heads the first left open.
    batched.append_at(&events[..5], at_ms).unwrap();
    batched.append_at(&events[5..], at_ms).unwrap();
    let single = Log::open(each.path(), LogOptions::default()).unwrap();
    for event in &events {
        single
            .append_at(std::slice::from_ref(event), at_ms)
            .unwrap();
    }
    for (a, b) in [
        (batched.records.tree(), single.records.tree()),
        (&batched.by_command, &single.by_command),
        (&batched.by_workload, &single.by_workload),
        (&batched.by_time, &single.by_time),
    ] {
        assert_eq!(tree_dump(a), tree_dump(b));
    }
    let seqs = |records: Vec<Record<Event>>| records.iter().map(|r| r.seq).collect::<Vec<_>>();
    let all: Vec<u64> = (1..=150).collect();
    assert_eq!(seqs(batched.for_command("c-9").unwrap()), all);
    assert_eq!(seqs(batched.for_workload("ns", "web").unwrap()), all);
    assert_eq!(batched.verify().unwrap(), 150);
}

#[test]
fn snapshots_come_no_more_often_than_the_intent_has_workloads() {
    let prepared = |i: usize| Event::RevisionPrepared {
        command_id: format!("c-{i}"),
        namespace: "ns".into(),
        workload: format!("w{i}"),
        revision: "r1".into(),
        spec: crate::testkit::spec(),
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions {
        snapshot_every: 4,
        snapshot_per_workload: 2,
        ..LogOptions::default()
    };
    let log = Log::open(dir.path(), opts).unwrap();
    // Two workloads: still every 4 records.
    log.append(&[ready("ns"), prepared(0), prepared(1), ready("a")])
        .unwrap();
    assert_eq!(log.snapshots.len(), 1);
    // Now 5 workloads: the next snapshot after 10 records, not 4.
    log.append(&[prepared(2), prepared(3), prepared(4)])
        .unwrap();
    for i in 0..6 {
        log.append(&[ready(&format!("n{i}"))]).unwrap();
        assert_eq!(log.snapshots.len(), 1, "after {} records", 4 + i);
    }
    log.append(&[ready("n6")]).unwrap();
    assert_eq!(log.snapshots.len(), 2);
}
