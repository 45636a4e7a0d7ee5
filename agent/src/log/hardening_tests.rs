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
