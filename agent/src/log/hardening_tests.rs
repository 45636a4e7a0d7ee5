//! Failures that must show: the watched seq, flush failures, snapshot checks, damaged
//! lengths.

use super::*;
use std::sync::Arc;

fn ready(ns: &str) -> Event {
    Event::NamespaceReady {
        command_id: format!("c-{ns}"),
        namespace: ns.into(),
    }
}

#[test]
fn the_watched_last_seq_never_goes_back_and_ends_at_the_last_seq() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), LogOptions::default()).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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
            codec::open_record(first, &log.records.get(seq_key(first)).unwrap().unwrap()).unwrap();
        // Record 2, well linked, whose namespace claims 2^61 bytes; resealed, so its
        // hash is valid and only decoding can find the lie.
        let marker = "MARKERXX";
        let content = stored::encode(2, 0, prev, &ready(marker)).unwrap();
        let mut prefixed = vec![marker.len() as u8];
        prefixed.extend_from_slice(marker.as_bytes());
        let at = content
            .windows(prefixed.len())
            .position(|w| w == prefixed.as_slice())
            .expect("the namespace is in the stored record");
        let mut forged = content[..at].to_vec();
        forged.push(253); // varint: a u64 follows
        forged.extend_from_slice(&(1u64 << 61).to_le_bytes());
        forged.extend_from_slice(&content[at + 1..]);
        log.records
            .insert(seq_key(2), codec::seal(forged).0)
            .unwrap();
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
