//! Failures that must show: the watched seq, flush failures, snapshot checks, damaged
//! lengths.

use super::super::*;
use crate::testkit::{Event, Log};
use std::sync::Arc;

fn ready(ns: &str) -> Event {
    Event::NamespaceReady {
        command_id: format!("c-{ns}"),
        namespace: ns.into(),
    }
}

/// A new log in a temp dir, and a two-thread runtime to write it from.
fn log_and_runtime() -> (tempfile::TempDir, Arc<Log>, tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), LogOptions::default()).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    (dir, log, runtime)
}

#[test]
fn the_watched_last_seq_never_goes_back_and_ends_at_the_last_seq() {
    let (_dir, log, runtime) = log_and_runtime();
    let mut watched = log.subscribe();
    let done = Arc::new(tokio::sync::Notify::new());
    let observer = runtime.spawn({
        let done = Arc::clone(&done);
        async move {
            let mut seen = *watched.borrow_and_update();
            let mut backwards = Vec::new();
            loop {
                tokio::select! {
                    changed = watched.changed() => {
                        changed.unwrap();
                        let now = *watched.borrow_and_update();
                        if now < seen {
                            backwards.push((seen, now));
                        }
                        seen = seen.max(now);
                    }
                    _ = done.notified() => return backwards,
                }
            }
        }
    });
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..150 {
                    log.append(&[ready(&format!("w{w}-{i}"))]).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.notify_one();
    let backwards = runtime.block_on(observer).unwrap();
    assert!(
        backwards.is_empty(),
        "the watched seq went back: {backwards:?}"
    );
    assert_eq!(log.last_seq(), 8 * 150);
    assert_eq!(*log.subscribe().borrow(), log.last_seq());
}

#[test]
fn a_huge_length_in_a_resealed_record_degrades_the_log_instead_of_allocating() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        let first = log.append(&[ready("a")]).unwrap();
        let (_, prev) =
            codec::open_record::<Event>(first, &log.records.get(first).unwrap().unwrap()).unwrap();
        // Record 2, well linked, whose event (a string) claims 2^61 bytes; resealed,
        // so its hash is valid and only decoding can find the lie.
        let event = ready("MARKERXX");
        let content = event.encode(2, 0, prev).unwrap();
        let json = serde_json::to_string(&event).unwrap();
        let mut prefixed = vec![json.len() as u8];
        prefixed.extend_from_slice(json.as_bytes());
        let at = content
            .windows(prefixed.len())
            .position(|w| w == prefixed.as_slice())
            .expect("the event is in the stored record");
        let mut forged = content[..at].to_vec();
        forged.push(253); // varint: a u64 follows
        forged.extend_from_slice(&(1u64 << 61).to_le_bytes());
        forged.extend_from_slice(&content[at + 1..]);
        log.records.put_raw(2, &codec::seal(forged).0).unwrap();
        // As if an append wrote it whole (else open drops it as cut short).
        super::super::tip::write(&log.db, 2).unwrap();
        log.flush().unwrap();
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(
        log.degraded(),
        Some(&Corruption {
            seq: 2,
            defect: Defect::Undecodable
        })
    );
    assert!(matches!(log.verify(), Err(LogError::Corrupt(c)) if c.seq == 2));
}

#[test]
fn a_record_far_larger_than_any_command_still_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let big = "n".repeat(4 << 20);
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        log.append(&[ready(&big)]).unwrap();
        log.flush().unwrap();
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.degraded(), None);
    assert_eq!(log.verify().unwrap(), 1);
}

/// A log of 11 records with snapshots at 4 and 8, whose snapshot at 8 was resealed
/// over an intent without namespace `n0`: a valid hash, a valid anchor, a lie.
pub(crate) fn log_with_a_forged_snapshot(dir: &std::path::Path) -> crate::testkit::Intent {
    let log = Log::open(dir, LogOptions::snapshot_every(4)).unwrap();
    for i in 0..11 {
        log.append(&[ready(&format!("n{i}"))]).unwrap();
    }
    log.reseal_snapshot(8, |body| {
        let namespaces = body["intent"]["namespaces"].as_object_mut().unwrap();
        assert!(namespaces.remove("n0").is_some(), "{body}");
    });
    log.flush().unwrap();
    log.intent()
}

fn no_snapshots() -> LogOptions {
    LogOptions::snapshot_every(1000)
}

#[test]
fn verify_finds_a_resealed_forged_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let honest = log_with_a_forged_snapshot(dir.path());
    let log = Log::open(dir.path(), no_snapshots()).unwrap();
    // Opening trusts the anchored snapshot: that is the point of verifying it.
    assert!(log.degraded().is_none());
    assert_ne!(log.intent(), honest);
    match log.verify() {
        Err(LogError::Corrupt(c)) => assert_eq!(
            c,
            Corruption {
                seq: 8,
                defect: Defect::SnapshotForged
            }
        ),
        other => panic!("verify passed a forged snapshot: {other:?}"),
    }
}

#[test]
fn verify_finds_a_snapshot_anchored_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::snapshot_every(4)).unwrap();
        for i in 0..6 {
            log.append(&[ready(&format!("n{i}"))]).unwrap();
        }
        // The snapshot at 4, copied under seq 5's key and seq: its anchor is 4's hash.
        let stored = log.snapshots.get(seq_key(4)).unwrap().unwrap();
        let (content, _) = codec::unseal(4, &stored).unwrap();
        let mut body: serde_json::Value = serde_json::from_slice(&content[1..]).unwrap();
        body["seq"] = 5.into();
        let mut moved = vec![content[0]];
        serde_json::to_writer(&mut moved, &body).unwrap();
        log.snapshots
            .insert(seq_key(5), codec::seal(moved).0)
            .unwrap();
        log.flush().unwrap();
    }
    let log = Log::open(dir.path(), no_snapshots()).unwrap();
    assert!(matches!(
        log.verify(),
        Err(LogError::Corrupt(Corruption {
            seq: 5,
            defect: Defect::SnapshotUnanchored
        }))
    ));
}

#[test]
fn honest_snapshots_verify() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::snapshot_every(4)).unwrap();
    for i in 0..11 {
        log.append(&[ready(&format!("n{i}"))]).unwrap();
    }
    assert_eq!(log.verify().unwrap(), 11);
}

/// [`Log::verify_in_background`], three records at a time, without pauses.
fn verify_in_chunks_of_3(log: &Arc<Log>) -> Result<Option<u64>, LogError> {
    let pace = Pace {
        chunk: 3,
        pause: std::time::Duration::ZERO,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(Log::verify_in_background(Arc::clone(log), pace, stop))
}

#[test]
fn the_background_verification_degrades_the_log_on_a_forged_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    log_with_a_forged_snapshot(dir.path());
    let log = Arc::new(Log::open(dir.path(), no_snapshots()).unwrap());
    let result = verify_in_chunks_of_3(&log);
    assert!(matches!(
        result,
        Err(LogError::Corrupt(Corruption { seq: 8, .. }))
    ));
    assert_eq!(
        log.degraded().map(|c| c.defect),
        Some(Defect::SnapshotForged)
    );
    assert!(matches!(
        log.append(&[ready("x")]),
        Err(LogError::Degraded(_))
    ));
    assert!(!log.healthy());
}

#[test]
fn the_background_verification_of_an_honest_log_counts_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), LogOptions::snapshot_every(4)).unwrap());
    for i in 0..12 {
        log.append(&[ready(&format!("n{i}"))]).unwrap();
    }
    let result = verify_in_chunks_of_3(&log);
    assert_eq!(result.unwrap(), Some(12));
    assert!(log.degraded().is_none());
}

#[test]
fn combined_writers_each_get_the_seq_of_their_own_contiguous_events() {
    // Given 32 writers appending batches of three events at once (combined into
    // shared writes, `combine.rs`)
    let (_dir, log, runtime) = log_and_runtime();
    let answers = runtime.block_on(async {
        let tasks: Vec<_> = (0..32)
            .map(|w| {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    for k in 0..20 {
                        let batch: Vec<Event> =
                            (0..3).map(|j| ready(&format!("w{w}-{k}-{j}"))).collect();
                        let seq = log.append_durable(&batch).await.unwrap();
                        answers.push((seq, batch));
                    }
                    answers
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    // Then each writer's seq is the last of its own three events, in its order
    for (seq, batch) in &answers {
        let stored: Vec<Event> = (seq - 2..=*seq)
            .map(|s| log.get(s).unwrap().unwrap().event)
            .collect();
        assert_eq!(&stored, batch, "the records up to seq {seq}");
    }
    // and every record is there once, chained
    assert_eq!(log.verify().unwrap(), 32 * 20 * 3);
}
